package manifests

import (
	"os"
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

	c := container(t, pod.InitContainers, "uninstall-cni")
	argv := slices.Concat(c.Command, c.Args)
	if len(argv) < 2 || argv[0] != "tabby-agent" || argv[1] != "install-cni" || !slices.Contains(argv, "--uninstall") {
		t.Fatalf("uninstall container runs %v, want tabby-agent install-cni --uninstall", argv)
	}
	cfg := installcni.Default()
	fs := pflag.NewFlagSet("install-cni", pflag.ContinueOnError)
	cfg.AddFlags(fs)
	fs.Bool("uninstall", false, "")
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
	for _, d := range []struct{ name, u, i string }{
		{"bin dir", hostDir(um, "uninstall-cni", cfg.BinDir), hostDir(im, "install-cni", inst.BinDir)},
		{"conf dir", hostDir(um, "uninstall-cni", cfg.ConfDir), hostDir(im, "install-cni", inst.ConfDir)},
		{"conflist", cfg.ConflistName, inst.ConflistName},
	} {
		if d.u == "" || d.u != d.i {
			t.Errorf("%s: uninstall uses %q, install %q", d.name, d.u, d.i)
		}
	}
}
