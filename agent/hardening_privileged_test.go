package agent

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/internal/testkit"
)

// TestPrivilegedHostIfRestoredAtResync: a pod added through the real CNI
// plugin gets a hardened host interface in both families; something
// turns router advertisements, autoconfiguration and redirects back on
// and rp_filter off; the agent's next resync (2 s here) puts every one
// back.
func TestPrivilegedHostIfRestoredAtResync(t *testing.T) {
	e := newNodeEnv(t)
	ctx := context.Background()
	list := e.conflist(t, "1.0.0")
	pod := testkit.NewNetNS(t, "tabby-ah")
	rt := podRT("ctr-h", pod.Path, "h")
	if _, err := e.cni.AddNetworkList(ctx, list, rt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.cni.DelNetworkList(context.Background(), list, rt); err != nil {
			t.Error(err)
		}
	})
	var ifName string
	for _, line := range strings.Split(run(t, "ip", "-n", e.node, "-o", "link", "show", "type", "veth"), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], "cali") {
			ifName = strings.TrimSuffix(strings.Split(f[1], "@")[0], ":")
		}
	}
	if ifName == "" {
		t.Fatal("no cali interface after ADD")
	}
	read := func(key string) string {
		t.Helper()
		return strings.TrimSpace(run(t, "ip", "netns", "exec", e.node, "sysctl", "-n", key))
	}
	want := map[string]string{
		"net.ipv4.conf." + ifName + ".rp_filter":        "1",
		"net.ipv4.conf." + ifName + ".accept_redirects": "0",
		"net.ipv4.conf." + ifName + ".send_redirects":   "0",
		"net.ipv6.conf." + ifName + ".accept_ra":        "0",
		"net.ipv6.conf." + ifName + ".autoconf":         "0",
		"net.ipv6.conf." + ifName + ".accept_redirects": "0",
	}
	for key, v := range want {
		if got := read(key); got != v {
			t.Errorf("after ADD of an IPv4 pod: %s = %s, want %s", key, got, v)
		}
	}
	for key, v := range want {
		bad := "1"
		if v == "1" {
			bad = "0"
		}
		run(t, "ip", "netns", "exec", e.node, "sysctl", "-qw", key+"="+bad)
	}
	testkit.Eventually(t, 10*time.Second, "the agent's resync restores the host interface's settings", func() error {
		for key, v := range want {
			if got := read(key); got != v {
				return fmt.Errorf("%s = %s, want %s", key, got, v)
			}
		}
		return nil
	})
}
