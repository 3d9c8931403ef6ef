package manifests

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"

	"github.com/tabbynet/tabby/agent/installcni"
)

// TestUninstallManifest: the cleanup DaemonSet removes exactly what the
// install-cni of tabby-etcd.yaml wrote, on every node, without needing the
// pod network it is removing.
func TestUninstallManifest(t *testing.T) {
	b, err := os.ReadFile("tabby-uninstall.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeStrict(b)
	if err != nil {
		t.Fatalf("tabby-uninstall.yaml: %v", err)
	}
	u := &objects{all: objs}
	ds := find[*appsv1.DaemonSet](t, u, "tabby-cni-uninstall")
	pod := &ds.Spec.Template.Spec
	if ds.Namespace != namespace {
		t.Errorf("namespace %q, want %q", ds.Namespace, namespace)
	}
	if !pod.HostNetwork {
		t.Error("hostNetwork is off: the pod's sandbox would need the CNI plugin being removed")
	}
	if len(pod.Tolerations) != 1 || pod.Tolerations[0].Operator != "Exists" || pod.Tolerations[0].Key != "" {
		t.Errorf("tolerations %+v: want {operator: Exists}", pod.Tolerations)
	}

	c := container(t, pod.InitContainers, "cleanup")
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("cleanup is not privileged: it removes routes and iptables rules")
	}
	argv := slices.Concat(c.Command, c.Args)
	if len(argv) < 2 || argv[0] != "tabby-agent" || argv[1] != "cleanup" {
		t.Fatalf("uninstall container runs %v, want tabby-agent cleanup", argv)
	}
	if slices.Contains(argv, "--force") {
		t.Error("cleanup with --force would run under a live agent")
	}
	// The flags of tabby-agent cleanup (cmd/tabby-agent/cleanup.go).
	cfg := installcni.Default()
	fs := pflag.NewFlagSet("cleanup", pflag.ContinueOnError)
	fs.StringVar(&cfg.BinDir, "cni-bin-dir", cfg.BinDir, "")
	fs.StringVar(&cfg.ConfDir, "cni-conf-dir", cfg.ConfDir, "")
	fs.StringVar(&cfg.ConflistName, "conflist-name", cfg.ConflistName, "")
	stateDir := fs.String("state-dir", "/var/lib/tabby", "")
	cniSocket := fs.String("cni-socket", "/var/run/tabby/cni.sock", "")
	fs.Bool("remove-workloads", false, "")
	if err := fs.Parse(argv[2:]); err != nil {
		t.Fatal(err)
	}

	// Compare with what tabby-etcd.yaml installs, as host paths.
	o, _, instPod := daemonSet(t)
	inst := installConfig(t, o, container(t, instPod.InitContainers, "install-cni"))
	hostDir := func(pod []mount, container, p string) string {
		for _, m := range pod {
			if m.Container == container && m.MountPath == p {
				return m.HostPath
			}
		}
		return ""
	}
	um, im := hostMounts(t, pod), hostMounts(t, instPod)
	// The agent's state and sockets, as the agent container mounts them.
	agentDir := func(p string) string {
		for _, m := range im {
			if m.MountPath == p && m.Container != "install-cni" {
				return m.HostPath
			}
		}
		return ""
	}
	for _, d := range []struct{ name, u, i string }{
		{"bin dir", hostDir(um, "cleanup", cfg.BinDir), hostDir(im, "install-cni", inst.BinDir)},
		{"conf dir", hostDir(um, "cleanup", cfg.ConfDir), hostDir(im, "install-cni", inst.ConfDir)},
		{"conflist", cfg.ConflistName, inst.ConflistName},
		{"state dir", hostDir(um, "cleanup", *stateDir), agentDir("/var/lib/tabby")},
		{"socket dir", hostDir(um, "cleanup", filepath.Dir(*cniSocket)), agentDir("/var/run/tabby")},
	} {
		if d.u == "" || d.u != d.i {
			t.Errorf("%s: uninstall uses %q, install %q", d.name, d.u, d.i)
		}
	}
}
