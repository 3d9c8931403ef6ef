package kube

import (
	"fmt"
	"strings"
	"testing"
)

// TestKubeletConfig: the lab kubelet's settings that keep it on this host
// and inside its node.
func TestKubeletConfig(t *testing.T) {
	dir := "/run/tabby-lab/x/node1/kubelet"
	cfg := kubeletConfig(dir, "/run/tabby-lab/x/node1/containerd/containerd.sock", kubeletCgroupRoot("x", "node1"), "")
	if strings.Contains(cfg, "x509") {
		t.Errorf("kubelet config without a client CA has x509 authentication:\n%s", cfg)
	}
	withCA := kubeletConfig(dir, "/s", "/r", "/run/tabby-lab/x/kube/ca.crt")
	if !strings.Contains(withCA, "  webhook:\n    enabled: false\n  x509:\n    clientCAFile: /run/tabby-lab/x/kube/ca.crt\nauthorization:") {
		t.Errorf("kubelet config with a client CA:\n%s", withCA)
	}
	for _, want := range []string{
		"failCgroupV1: false\n",
		"cgroupDriver: cgroupfs\n",
		"cgroupRoot: /tabby-lab-x-node1\n",
		"containerRuntimeEndpoint: unix:///run/tabby-lab/x/node1/containerd/containerd.sock\n",
		"protectKernelDefaults: true\n",
		"podLogsDir: " + dir + "/pod-logs\n",
		"resolvConf: " + dir + "/resolv.conf\n",
		"readOnlyPort: 0\n",
		"clusterDNS:\n- 10.96.0.10\nclusterDomain: cluster.local\n",
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
	s := nodeMountScript("/d", nil, nil)
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

// TestNodeHostPaths: every host path of the DaemonSet is a directory of
// the node in its mount namespace, links resolved; a path the host lacks
// is reached through an overlay on its deepest existing parent, never made
// on the host; /run/netns survives an overlay on /run.
func TestNodeHostPaths(t *testing.T) {
	links := map[string]string{"/var/run": "/run", "/lib": "/usr/lib"}
	resolve := func(p string) string {
		if r, ok := links[p]; ok {
			return r
		}
		return p
	}
	host := map[string]bool{"/": true, "/run": true, "/usr": true, "/usr/lib": true, "/opt": true, "/etc": true, "/etc/cni": true, "/etc/cni/net.d": true, "/var": true, "/var/lib": true}
	hps := nodeHostPaths("/n", "/n/bin", "/n/net.d", resolve, func(p string) bool { return host[p] })
	want := map[string]nodeHostPath{
		"/opt/cni/bin":     {Src: "/n/bin", Cover: "/opt"},
		"/etc/cni/net.d":   {Src: "/n/net.d"},
		"/run/tabby":       {Src: "/n/host/run-tabby", Cover: "/run"},
		"/var/lib/tabby":   {Src: "/n/host/var-lib-tabby", Cover: "/var/lib"},
		"/usr/lib/modules": {Src: "/n/host/lib-modules", Cover: "/usr/lib"},
	}
	if len(hps) != len(want) {
		t.Fatalf("host paths %+v, want %d", hps, len(want))
	}
	for _, hp := range hps {
		w, ok := want[hp.Target]
		if !ok || hp.Src != w.Src || hp.Cover != w.Cover {
			t.Errorf("host path %+v, want %+v", hp, w)
		}
	}
	s := nodeMountScript("/d", hps, []string{"/run/netns", "/run/tabby-lab/x", "/srv/elsewhere"})
	for _, line := range strings.Split(s, "\n") {
		if strings.HasPrefix(line, "mkdir") {
			// Only under a cover or the node's directory.
			for _, f := range strings.Fields(line)[1:] {
				if f == "-p" {
					continue
				}
				ok := strings.HasPrefix(f, "/d/")
				for _, hp := range hps {
					ok = ok || (hp.Cover != "" && f == hp.Target)
				}
				if !ok {
					t.Errorf("script makes %s outside a cover: %q", f, line)
				}
			}
		}
	}
	ovl := strings.Index(s, "tabby-node /run\n")
	for fd, k := range []string{"/run/netns", "/run/tabby-lab/x"} {
		open := strings.Index(s, fmt.Sprintf("exec %d<%s\n", 3+fd, k))
		back := strings.Index(s, fmt.Sprintf("mount --no-canonicalize --rbind /proc/self/fd/%d %s\n", 3+fd, k))
		if ovl < 0 || open < 0 || back < 0 || !(open < ovl && ovl < back) {
			t.Errorf("%s is not kept across the overlay on /run:\n%s", k, s)
		}
	}
	if strings.Contains(s, "/srv/elsewhere") {
		t.Errorf("a path under no cover is re-bound:\n%s", s)
	}
	if !strings.HasSuffix(s, "mount --make-shared /\nexec \"$@\"\n") {
		t.Errorf("the node's / is not made shared last (containerd's HostToContainer check):\n%s", s)
	}
	for _, hp := range hps {
		bind := strings.Index(s, "mount --bind "+hp.Src+" "+hp.Target+"\n")
		if bind < 0 {
			t.Errorf("script does not bind %s at %s:\n%s", hp.Src, hp.Target, s)
		}
		if hp.Cover != "" {
			if c := strings.Index(s, "tabby-node "+hp.Cover+"\n"); c < 0 || c > bind {
				t.Errorf("%s bound before the overlay on %s:\n%s", hp.Target, hp.Cover, s)
			}
		}
	}
}
