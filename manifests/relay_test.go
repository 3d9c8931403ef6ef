package manifests

import (
	"os"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestRelayManifest: the relay is tabby-relay from Tabby's image on the
// host network of labelled nodes, serving the port the agents' patch
// names with TLS both ways, with flags tabby-relay has; the patch sets the
// agents' TABBY_WATCH_ENDPOINTS.
func TestRelayManifest(t *testing.T) {
	b, err := os.ReadFile("relay/tabby-relay.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeStrict(b)
	if err != nil {
		t.Fatal(err)
	}
	var (
		ds  *appsv1.DaemonSet
		svc *corev1.Service
	)
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.DaemonSet:
			ds = o
		case *corev1.Service:
			svc = o
		}
	}
	if ds == nil || svc == nil {
		t.Fatalf("want a DaemonSet and a Service, got %d objects", len(objs))
	}
	pod := ds.Spec.Template.Spec
	c := pod.Containers[0]
	_, _, node := daemonSet(t)
	if want := container(t, node.Containers, "tabby-node").Image; c.Image != want {
		t.Errorf("image %s: want Tabby's, %s", c.Image, want)
	}
	if !slices.Equal(c.Command, []string{"tabby-relay"}) {
		t.Errorf("command %q: want tabby-relay", c.Command)
	}
	src, err := os.ReadFile("../cmd/tabby-relay/main.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range c.Args {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.Contains(string(src), `"`+name+`"`) {
			t.Errorf("arg %s: tabby-relay has no flag %s", a, name)
		}
	}
	for _, f := range []string{"--listen=$(NODE_IP):23792", "--cert-file=/tabby-secrets/relay-cert", "--client-ca-file=/tabby-secrets/etcd-ca"} {
		if !slices.Contains(c.Args, f) {
			t.Errorf("args lack %s", f)
		}
	}
	if !slices.Contains(c.Args, "--metrics-listen=127.0.0.1:23793") {
		t.Error("args lack --metrics-listen on the node's loopback")
	}
	for name, pr := range map[string]*corev1.Probe{"/livez": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if pr == nil || pr.HTTPGet == nil || pr.HTTPGet.Path != name || pr.HTTPGet.Port.IntValue() != 23793 || pr.HTTPGet.Host != "127.0.0.1" {
			t.Errorf("probe of %s: %+v, want an HTTP GET of 127.0.0.1:23793", name, pr)
		}
	}
	env := map[string]bool{}
	for _, e := range c.Env {
		env[e.Name] = true
	}
	for _, e := range []string{"TABBY_ETCD_ENDPOINTS", "TABBY_ETCD_CA_FILE", "TABBY_ETCD_CERT_FILE", "TABBY_ETCD_KEY_FILE"} {
		if !env[e] {
			t.Errorf("env lacks %s", e)
		}
	}
	if !pod.HostNetwork {
		t.Error("not on the host network: agents reach it before the pod network exists")
	}
	if svc.Spec.Ports[0].Port != 23792 || svc.Spec.Selector["app.kubernetes.io/name"] != "tabby-relay" {
		t.Errorf("service %v: want port 23792 of the relay's pods", svc.Spec)
	}

	pb, err := os.ReadFile("relay/tabby-node-relay-patch.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pobjs, err := decodeStrict(pb)
	if err != nil {
		t.Fatal(err)
	}
	patch, ok := pobjs[0].(*appsv1.DaemonSet)
	if !ok || patch.Name != ds.Name && patch.Name != "tabby-node" {
		t.Fatalf("patch %T: want the tabby-node DaemonSet", pobjs[0])
	}
	pc := patch.Spec.Template.Spec.Containers[0]
	if pc.Name != "tabby-node" || len(pc.Env) != 1 || pc.Env[0].Name != "TABBY_WATCH_ENDPOINTS" || !strings.Contains(pc.Env[0].Value, "https://<RELAY_NODE_IP>:23792") {
		t.Errorf("patch sets %v on %s: want TABBY_WATCH_ENDPOINTS naming the relays' port", pc.Env, pc.Name)
	}
}
