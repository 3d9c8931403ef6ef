package dataplane_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
)

// run runs a command and fails the test if it fails; it returns the output.
func run(tb testing.TB, name string, args ...string) string {
	tb.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// sysctlIn reads a sysctl inside a namespace through nsenter (ip netns exec
// would remount /sys, which this does not need).
func sysctlIn(tb testing.TB, ns testkit.NetNS, key string) string {
	tb.Helper()
	path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	return strings.TrimSpace(run(tb, "nsenter", "--net="+ns.Path, "cat", path))
}

// twoPods makes a node namespace with a stand-in uplink (proxy ARP answers
// for the pods' gateway 169.254.1.1 only when the node has a route to it:
// a default route into a veth pair with both ends in the node) and two
// wired pods, client 10.244.20.1 and server 10.244.20.2, torn down when
// the test ends. name keeps the namespaces and interfaces of two callers
// apart.
func twoPods(tb testing.TB, name string) (node testkit.NetNS, wl *dataplane.NetlinkWorkloads, client, server testkit.NetNS, cspec, sspec dataplane.WorkloadSpec) {
	tb.Helper()
	node, wl = workloadNode(tb)
	run(tb, "ip", "-n", node.Name, "link", "add", "w16up", "type", "veth", "peer", "name", "w16upp")
	run(tb, "ip", "-n", node.Name, "link", "set", "w16up", "up")
	run(tb, "ip", "-n", node.Name, "link", "set", "w16upp", "up")
	run(tb, "ip", "-n", node.Name, "route", "add", "default", "dev", "w16up")
	client, server = testkit.NewNetNS(tb, "tbdp-"+name+"cli"), testkit.NewNetNS(tb, "tbdp-"+name+"srv")
	cspec = podSpec(client, name+"-client", "10.244.20.1/32")
	sspec = podSpec(server, name+"-server", "10.244.20.2/32")
	setup(tb, wl, cspec)
	setup(tb, wl, sspec)
	tb.Cleanup(func() {
		for _, s := range []dataplane.WorkloadSpec{cspec, sspec} {
			if err := wl.Teardown(context.Background(), s); err != nil {
				tb.Error(err)
			}
		}
	})
	return node, wl, client, server, cspec, sspec
}
