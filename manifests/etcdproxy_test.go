package manifests

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// TestEtcdProxyManifest: the proxy is etcd's own grpc-proxy at the release
// go.mod names, on the host network of labelled nodes, serving the port
// the README points the agents at, with TLS both ways.
func TestEtcdProxyManifest(t *testing.T) {
	b, err := os.ReadFile("etcd-proxy/tabby-etcd-proxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeStrict(b)
	if err != nil {
		t.Fatal(err)
	}
	var ds *appsv1.DaemonSet
	for _, o := range objs {
		if d, ok := o.(*appsv1.DaemonSet); ok {
			ds = d
		}
	}
	if ds == nil {
		t.Fatal("no DaemonSet")
	}
	pod := ds.Spec.Template.Spec
	c := pod.Containers[0]
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`go\.etcd\.io/etcd/server/v3 (v\S+)`).FindSubmatch(gomod)
	if m == nil || !strings.HasSuffix(c.Image, ":"+string(m[1])) {
		t.Errorf("image %s: want etcd %s (go.mod)", c.Image, m)
	}
	if !slices.Equal(c.Command[:3], []string{"etcd", "grpc-proxy", "start"}) {
		t.Errorf("command %q: want etcd grpc-proxy start", c.Command)
	}
	for _, f := range []string{"--listen-addr=$(NODE_IP):23790", "--cacert=/tabby-secrets/etcd-ca", "--cert-file=/tabby-secrets/etcd-proxy-cert"} {
		if !slices.Contains(c.Command, f) {
			t.Errorf("command lacks %s", f)
		}
	}
	if !pod.HostNetwork {
		t.Error("not on the host network: agents reach it before the pod network exists")
	}
	readme, err := os.ReadFile("etcd-proxy/README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "https://<PROXY_NODE_IP>:23790") {
		t.Error("README does not point the agents at the proxy's port")
	}
}
