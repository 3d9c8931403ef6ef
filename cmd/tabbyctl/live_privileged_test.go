package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/internal/testkit"
)

// sh runs a command and fails the test on error.
func sh(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// TestPrivilegedExplainLive builds a node's kernel state in a network
// namespace of its own (a veth pair entirely inside it, the workload route
// and the block's blackhole) and checks explain --live --netns against it
// with the real ip command.
func TestPrivilegedExplainLive(t *testing.T) {
	testkit.RequirePrivileged(t)
	h := newHarness(t)
	if _, err := h.run(ipamCluster, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	addrs := addPods(t, h, []pod{{node: "node-1", ns: "shop", name: "web-0"}})
	web := addrs["web-0"]
	obj, err := h.store.Get(context.Background(), api.KindWorkloadEndpoint, "shop", "node-1-k8s-web-0-eth0")
	if err != nil {
		t.Fatal(err)
	}
	hostIf := obj.(*api.WorkloadEndpoint).Spec.InterfaceName
	block := netip.PrefixFrom(web, 28).Masked().String()

	name := fmt.Sprintf("tabbyctl-test-%d", os.Getpid())
	path := "/run/netns/" + name
	sh(t, "ip", "netns", "add", name)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("removing netns %s: %v: %s", name, err, out)
		}
	})
	in := func(args ...string) { t.Helper(); sh(t, append([]string{"nsenter", "--net=" + path}, args...)...) }
	in("ip", "link", "set", "lo", "up")
	in("ip", "link", "add", hostIf, "type", "veth", "peer", "name", "uplink0")
	in("ip", "addr", "add", "198.18.0.11/24", "dev", "uplink0")
	in("ip", "link", "set", "uplink0", "up")
	in("ip", "link", "set", hostIf, "up")
	in("ip", "route", "add", web.String()+"/32", "dev", hostIf, "proto", "80", "scope", "link")
	in("ip", "route", "add", "blackhole", block, "proto", "80")
	in("sh", "-c", "echo 1 > /proc/sys/net/ipv4/conf/"+hostIf+"/proxy_arp")

	out, err := h.run("", "explain", "pod", "shop/web-0", "--netns", path)
	if err != nil {
		t.Fatalf("explain --live: %v\n%s", err, out)
	}
	for _, want := range []string{
		"Live: the kernel of node-1 (network namespace " + path + ")",
		"ok         interface " + hostIf + " exists, proxy_arp=1",
		"ok         " + web.String() + " dev " + hostIf,
		"ok         blackhole " + block,
		"the kernel agrees with the datastore",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain --live output lacks %q:\n%s", want, out)
		}
	}

	// Break it: the workload route goes, proxy ARP is turned off.
	in("ip", "route", "del", web.String()+"/32", "dev", hostIf, "proto", "80")
	in("sh", "-c", "echo 0 > /proc/sys/net/ipv4/conf/"+hostIf+"/proxy_arp")
	out, err = h.run("", "explain", "pod", "shop/web-0", "--netns", path)
	if err == nil || !strings.Contains(err.Error(), "disagrees with the datastore in 3 places") {
		t.Errorf("explain --live on a broken node: error %v, want 3 disagreements\n%s", err, out)
	}
	for _, want := range []string{
		"DISAGREES  interface " + hostIf + " has proxy_arp=0",
		"DISAGREES  no route " + web.String() + "/32 dev " + hostIf + " proto 80 scope link (proto 80)",
		"DISAGREES  packets for " + web.String() + " are dropped by blackhole " + block,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain --live output lacks %q:\n%s", want, out)
		}
	}
}
