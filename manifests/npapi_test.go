package manifests

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The vendored ClusterNetworkPolicy CRD is upstream's, of the
// network-policy-api release go.mod requires (the one package kube's
// translation is built against), and serves the v1beta1 that the
// controllers watch.
func TestNetworkPolicyAPICRD(t *testing.T) {
	b, err := os.ReadFile("network-policy-api/policy.networking.k8s.io_clusternetworkpolicies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Name        string            `json:"name"`
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
		Spec struct {
			Group    string `json:"group"`
			Versions []struct {
				Name    string `json:"name"`
				Served  bool   `json:"served"`
				Storage bool   `json:"storage"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &crd); err != nil {
		t.Fatal(err)
	}
	if crd.Kind != "CustomResourceDefinition" || crd.Metadata.Name != "clusternetworkpolicies.policy.networking.k8s.io" {
		t.Fatalf("kind %q name %q: not the ClusterNetworkPolicy CRD", crd.Kind, crd.Metadata.Name)
	}
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "sigs.k8s.io/network-policy-api").Output()
	if err != nil {
		t.Fatalf("go list -m sigs.k8s.io/network-policy-api: %v", err)
	}
	want := strings.TrimSpace(string(out))
	if got := crd.Metadata.Annotations["policy.networking.k8s.io/bundle-version"]; got != want {
		t.Errorf("CRD bundle-version %q, go.mod requires %s: copy the CRD of that release (manifests/network-policy-api/README.md)", got, want)
	}
	served := map[string]bool{}
	storage := ""
	for _, v := range crd.Spec.Versions {
		served[v.Name] = v.Served
		if v.Storage {
			storage = v.Name
		}
	}
	if !served["v1beta1"] || storage != "v1beta1" {
		t.Errorf("versions %+v: want v1beta1 served and stored (what kube watches)", crd.Spec.Versions)
	}
}
