package kube_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/kube"
)

// TestRestConfigRate: the controllers' client is not held to client-go's
// default 5 requests a second, and a rate that is not positive is refused.
func TestRestConfigRate(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := kube.Default()
	cfg.Kubeconfig = kubeconfig
	rc, err := cfg.RestConfig()
	if err != nil {
		t.Fatal(err)
	}
	if rc.QPS != 50 || rc.Burst != 100 {
		t.Errorf("rest config QPS %g burst %d, want the defaults 50 and 100", rc.QPS, rc.Burst)
	}
	cfg.KubeAPIQPS = 200
	if rc, err = cfg.RestConfig(); err != nil || rc.QPS != 200 {
		t.Errorf("QPS %g (%v), want 200", rc.QPS, err)
	}
	cfg.KubeAPIQPS, cfg.KubeAPIBurst = 0, 0
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "API server rate") {
		t.Errorf("Validate with rate 0: %v", err)
	}
}
