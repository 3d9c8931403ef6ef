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

// TestNodeMountScript: /proc is kept from the host before every tunable
// the kubelet checks is bind-mounted, /var/log is the node's, and the
// first failure stops the script.
func TestNodeMountScript(t *testing.T) {
	s := nodeMountScript("/d")
	slave := strings.Index(s, "mount --make-rslave /proc\n")
	if slave < 0 {
		t.Errorf("script does not make /proc a slave:\n%s", s)
	}
	for k := range kubeletTunables {
		want := "mount --bind /d/sysctl/" + strings.ReplaceAll(k, "/", ".") + " /proc/sys/" + k + "\n"
		if i := strings.Index(s, want); i < 0 || i < slave {
			t.Errorf("script lacks %q after making /proc a slave:\n%s", want, s)
		}
	}
	keep := strings.Index(s, `mount --make-slave "$(findmnt --noheadings --output TARGET --target /var/log)"`)
	if i := strings.Index(s, "mount --bind /d/log /var/log\n"); i < 0 || keep < 0 || i < keep {
		t.Errorf("script does not give the node its /var/log after keeping the mount below it from the host:\n%s", s)
	}
	if !strings.HasPrefix(s, "#!/bin/sh\n") || !strings.Contains(s, "set -eu\n") || !strings.HasSuffix(s, "exec \"$@\"\n") {
		t.Errorf("script must stop at the first failed mount and then exec containerd:\n%s", s)
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
