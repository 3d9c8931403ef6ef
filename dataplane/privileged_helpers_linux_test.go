package dataplane_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/dataplane"
)

// skipUnlessPrivileged skips a test that needs root and its own network
// namespaces.
func skipUnlessPrivileged(tb testing.TB) {
	tb.Helper()
	if os.Getenv("TABBY_SKIP_PRIVILEGED") != "" {
		tb.Skip("privileged test skipped: TABBY_SKIP_PRIVILEGED is set")
	}
	if os.Geteuid() != 0 {
		tb.Skip("privileged test skipped: needs root to create network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Skip("privileged test skipped: iproute2 (ip) not installed")
	}
}

// testNetNS is a named network namespace created for one test.
type testNetNS struct {
	Name string
	Path string
}

// newNetNS creates a named network namespace (ip netns add) that is removed
// when the test ends, whatever happens to it in between.
func newNetNS(tb testing.TB, role string) testNetNS {
	tb.Helper()
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		tb.Fatal(err)
	}
	name := "tbdp-" + role + "-" + hex.EncodeToString(b)
	run(tb, "ip", "netns", "add", name)
	tb.Cleanup(func() {
		// "ip netns del" of a namespace already deleted by the test is fine.
		if _, err := os.Stat(filepath.Join("/run/netns", name)); err == nil {
			if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
				tb.Errorf("ip netns del %s: %v: %s", name, err, out)
			}
		}
	})
	ns := testNetNS{Name: name, Path: filepath.Join("/run/netns", name)}
	run(tb, "ip", "-n", name, "link", "set", "lo", "up")
	return ns
}

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
func sysctlIn(tb testing.TB, ns testNetNS, key string) string {
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
func twoPods(tb testing.TB, name string) (node testNetNS, wl *dataplane.NetlinkWorkloads, client, server testNetNS, cspec, sspec dataplane.WorkloadSpec) {
	tb.Helper()
	node, wl = workloadNode(tb)
	run(tb, "ip", "-n", node.Name, "link", "add", "w16up", "type", "veth", "peer", "name", "w16upp")
	run(tb, "ip", "-n", node.Name, "link", "set", "w16up", "up")
	run(tb, "ip", "-n", node.Name, "link", "set", "w16upp", "up")
	run(tb, "ip", "-n", node.Name, "route", "add", "default", "dev", "w16up")
	client, server = newNetNS(tb, name+"cli"), newNetNS(tb, name+"srv")
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
