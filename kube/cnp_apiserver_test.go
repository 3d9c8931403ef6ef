package kube_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	npav1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
	"sigs.k8s.io/yaml"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/kube"
	"github.com/tabbynet/tabby/kube/kubetest"
)

// installCNPCRD creates the vendored CRD (manifests/network-policy-api) and
// waits until the API server serves it.
func installCNPCRD(t *testing.T, cfg *rest.Config, npa npaclient.Interface) {
	t.Helper()
	b, err := os.ReadFile("../manifests/network-policy-api/policy.networking.k8s.io_clusternetworkpolicies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := yaml.Unmarshal(b, &obj); err != nil {
		t.Fatal(err)
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	crds := dc.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	if _, err := crds.Create(context.Background(), &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ClusterNetworkPolicy served", 30*time.Second, func() (bool, string) {
		_, err := npa.PolicyV1beta1().ClusterNetworkPolicies().List(context.Background(), metav1.ListOptions{})
		return err == nil, fmt.Sprint(err)
	})
}

func npaClientAs(t *testing.T, srv *kubetest.APIServer, token string) npaclient.Interface {
	c := rest.CopyConfig(srv.Config)
	c.BearerToken = srv.Tokens[token]
	npa, err := npaclient.NewForConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	return npa
}

// TestClusterNetworkPoliciesAgainstRealAPIServer: the controllers, with
// the manifests' RBAC, translate ClusterNetworkPolicies into etcd, report
// Accepted on their status, refuse an unsupported object whole (its
// earlier translation removed), and remove the translation of a deleted
// object and any left by an object deleted while they did not run.
func TestClusterNetworkPoliciesAgainstRealAPIServer(t *testing.T) {
	srv := kubetest.Start(t)
	ctx := context.Background()
	store := storetest.New(t)
	admin := npaClientAs(t, srv, "admin")
	installCNPCRD(t, srv.Config, admin)
	kubetest.ApplyControllersRBAC(t, srv.Client, "../manifests/tabby-kube-controllers.yaml")

	// A translation left behind by an object deleted while no controller ran.
	stale := &api.GlobalNetworkPolicy{Metadata: api.ObjectMeta{Name: kube.CNPName("gone"), Annotations: map[string]string{
		api.AnnotationOrigin: api.OriginKubernetes, kube.AnnotationCNPSource: "gone"}}}
	if _, err := store.Create(ctx, stale); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- kube.RunWith(cctx, testConfig("a"), srv.As(t, "controllers"), store, logger(t),
			kube.WithClusterNetworkPolicies(npaClientAs(t, srv, "controllers")))
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controllers: %v", err)
		}
	})

	gnp := func(name string) (*api.GlobalNetworkPolicy, error) {
		return datastore.GetAs[*api.GlobalNetworkPolicy](ctx, store, api.KindGlobalNetworkPolicy, "", kube.CNPName(name))
	}
	accepted := func(name string, want metav1.ConditionStatus, msg string) func() (bool, string) {
		return func() (bool, string) {
			c, err := admin.PolicyV1beta1().ClusterNetworkPolicies().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			cond := apimeta.FindStatusCondition(c.Status.Conditions, kube.ConditionAccepted)
			if cond == nil {
				return false, "no Accepted condition"
			}
			return cond.Status == want && cond.ObservedGeneration == c.Generation && strings.Contains(cond.Message, msg),
				fmt.Sprintf("%s %s %q (generation %d of %d)", cond.Status, cond.Reason, cond.Message, cond.ObservedGeneration, c.Generation)
		}
	}

	cnp := &npav1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-b"},
		Spec: npav1.ClusterNetworkPolicySpec{
			Tier: npav1.AdminTier, Priority: 20,
			Subject: npav1.ClusterNetworkPolicySubject{Namespaces: sel("team", "a")},
			Ingress: []npav1.ClusterNetworkPolicyIngressRule{{Action: npav1.ClusterNetworkPolicyRuleActionDeny,
				From: []npav1.ClusterNetworkPolicyIngressPeer{{Namespaces: sel("team", "b")}}}},
		},
	}
	created, err := admin.PolicyV1beta1().ClusterNetworkPolicies().Create(ctx, cnp, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "translation", 15*time.Second, func() (bool, string) {
		g, err := gnp("deny-b")
		if err != nil {
			return false, err.Error()
		}
		return g.Spec.Tier == kube.TierKubeAdmin && *g.Spec.Order == 20 && len(g.Spec.Ingress) == 1 && g.Spec.Ingress[0].Action == api.ActionDeny,
			string(mustJSON(g))
	})
	eventually(t, "Accepted=True", 15*time.Second, accepted("deny-b", metav1.ConditionTrue, "tier kube-admin"))
	eventually(t, "stale translation collected", 15*time.Second, func() (bool, string) {
		_, err := gnp("gone")
		return errors.Is(err, datastore.ErrNotFound), fmt.Sprint(err)
	})

	// A change that Tabby cannot enforce: the object is refused whole and
	// its earlier translation goes.
	cur, err := admin.PolicyV1beta1().ClusterNetworkPolicies().Get(ctx, created.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Egress = []npav1.ClusterNetworkPolicyEgressRule{{Action: npav1.ClusterNetworkPolicyRuleActionAccept,
		To: []npav1.ClusterNetworkPolicyEgressPeer{{DomainNames: []npav1.DomainName{"example.org"}}}}}
	if _, err := admin.PolicyV1beta1().ClusterNetworkPolicies().Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Accepted=False naming the field", 15*time.Second, accepted("deny-b", metav1.ConditionFalse, "spec.egress[0].to[0].domainNames"))
	eventually(t, "refused: no rule of it left", 15*time.Second, func() (bool, string) {
		_, err := gnp("deny-b")
		return errors.Is(err, datastore.ErrNotFound), fmt.Sprint(err)
	})

	// A selector the API server stores but that is not a label selector.
	bad := cnp.DeepCopy()
	bad.Name = "bad-selector"
	bad.Spec.Subject.Namespaces = sel("team", "a b")
	if _, err := admin.PolicyV1beta1().ClusterNetworkPolicies().Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "bad selector refused", 15*time.Second, accepted("bad-selector", metav1.ConditionFalse, "spec.subject.namespaces"))

	// Back to a supported object, then deleted.
	cur, err = admin.PolicyV1beta1().ClusterNetworkPolicies().Get(ctx, created.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Egress = nil
	cur.Spec.Tier, cur.Spec.Priority = npav1.BaselineTier, 5
	if _, err := admin.PolicyV1beta1().ClusterNetworkPolicies().Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "translated again, in kube-baseline", 15*time.Second, func() (bool, string) {
		g, err := gnp("deny-b")
		if err != nil {
			return false, err.Error()
		}
		return g.Spec.Tier == kube.TierKubeBaseline && *g.Spec.Order == 5, string(mustJSON(g))
	})
	eventually(t, "Accepted=True again", 15*time.Second, accepted("deny-b", metav1.ConditionTrue, "kube-baseline"))
	if err := admin.PolicyV1beta1().ClusterNetworkPolicies().Delete(ctx, "deny-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "deleted object's translation removed", 15*time.Second, func() (bool, string) {
		_, err := gnp("deny-b")
		return errors.Is(err, datastore.ErrNotFound), fmt.Sprint(err)
	})
}
