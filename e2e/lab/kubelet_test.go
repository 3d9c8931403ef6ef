package lab

import (
	"strings"
	"testing"
)

// TestKubeletConfig: the lab kubelet's settings that keep it on this host
// and inside its node.
func TestKubeletConfig(t *testing.T) {
	dir := "/run/tabby-lab/x/node1/kubelet"
	cfg := kubeletConfig(dir, "/run/tabby-lab/x/node1/containerd/containerd.sock", kubeletCgroupRoot("x", "node1"))
	for _, want := range []string{
		"failCgroupV1: false\n",
		"cgroupDriver: cgroupfs\n",
		"cgroupRoot: /tabby-lab-x-node1\n",
		"containerRuntimeEndpoint: unix:///run/tabby-lab/x/node1/containerd/containerd.sock\n",
		"protectKernelDefaults: true\n",
		"podLogsDir: " + dir + "/pod-logs\n",
		"resolvConf: " + dir + "/resolv.conf\n",
		"readOnlyPort: 0\n",
	} {
		if !strings.Contains(cfg, want) {
			t.Errorf("kubelet config lacks %q:\n%s", want, cfg)
		}
	}
}

// TestKubeletScript: every tunable the kubelet checks is bind-mounted in
// its mount namespace before it starts.
func TestKubeletScript(t *testing.T) {
	s := kubeletScript("/d")
	for k := range kubeletTunables {
		want := "mount --bind /d/sysctl/" + strings.ReplaceAll(k, "/", ".") + " /proc/sys/" + k + "\n"
		if !strings.Contains(s, want) {
			t.Errorf("script lacks %q:\n%s", want, s)
		}
	}
	if !strings.HasPrefix(s, "#!/bin/sh\n") || !strings.Contains(s, "set -eu\n") || !strings.HasSuffix(s, "exec \"$@\"\n") {
		t.Errorf("script must stop at the first failed mount and then exec the kubelet:\n%s", s)
	}
}

// TestRemoveCgroupRootRefuses: only a lab's cgroup root is ever removed.
func TestRemoveCgroupRootRefuses(t *testing.T) {
	for _, root := range []string{"", "/", "/kubepods", "/system.slice", "tabby-lab-x"} {
		if err := removeCgroupRoot(root); err == nil || !strings.Contains(err.Error(), "refusing") {
			t.Errorf("removeCgroupRoot(%q) = %v, want a refusal", root, err)
		}
	}
}
