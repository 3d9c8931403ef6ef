package kubetest

import (
	"os"
	"strings"
	"testing"
)

func TestVersionMatchesBuildModule(t *testing.T) {
	b, err := os.ReadFile("../../scripts/kube-build/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "require k8s.io/kubernetes "+Version+"\n") {
		t.Errorf("scripts/kube-build/go.mod does not require k8s.io/kubernetes %s", Version)
	}
}
