// Package conformance runs upstream's conformance suite as upstream's own
// conformance_test.go does (same flags, same clients, same tests), with
// one difference: the base manifests are upstream's with the SCTP server
// containers removed (scripts/npapi-bins.sh copies and filters them into
// base/ before building), because the lab's kernel has no SCTP and agnhost
// porter exits when it cannot listen on SCTP, which would keep every base
// pod from being Ready and so fail every test. The SCTP probes then fail
// as they would anyway; docs/policy.md lists the tests they are in.
package conformance

import (
	"embed"
	"testing"

	"k8s.io/client-go/kubernetes"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	api "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/network-policy-api/conformance/tests"
	"sigs.k8s.io/network-policy-api/conformance/utils/flags"
	"sigs.k8s.io/network-policy-api/conformance/utils/suite"
)

//go:embed base
var manifests embed.FS

func TestConformance(t *testing.T) {
	cfg, err := config.GetConfig()
	if err != nil {
		t.Fatalf("Error loading Kubernetes config: %v", err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatalf("Error initializing Kubernetes client: %v", err)
	}
	kubeConfig, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		t.Fatalf("error building Kube config for client-go: %v", err)
	}
	clientset, err := kubernetes.NewForConfig(kubeConfig)
	if err != nil {
		t.Fatalf("error when creating Kubernetes ClientSet: %v", err)
	}
	if err := api.Install(c.Scheme()); err != nil {
		t.Fatalf("Error installing api scheme: %v", err)
	}
	cSuite := suite.New(suite.Options{
		Client:                     c,
		ClientSet:                  clientset,
		KubeConfig:                 *cfg,
		Debug:                      *flags.ShowDebug,
		CleanupBaseResources:       *flags.CleanupBaseResources,
		SupportedFeatures:          suite.ParseSupportedFeatures(*flags.SupportedFeatures),
		ExemptFeatures:             suite.ParseSupportedFeatures(*flags.ExemptFeatures),
		EnableAllSupportedFeatures: *flags.EnableAllSupportedFeatures,
		FS:                         &manifests,
	})
	cSuite.Setup(t)
	cSuite.Run(t, tests.ConformanceTests)
}
