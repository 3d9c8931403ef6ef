package routetable

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/dataplane"
)

// requireRoot skips a test that needs root and network namespaces.
// (To move to internal/testkit with the other copies.)
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Getenv("TABBY_SKIP_PRIVILEGED") != "" {
		t.Skip("privileged test skipped: TABBY_SKIP_PRIVILEGED is set")
	}
	if os.Geteuid() != 0 {
		t.Skip("privileged test skipped: needs root for network namespaces")
	}
}

func ipIn(t testing.TB, ns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip -n %s %s: %v\n%s", ns, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestPrivilegedLearnedNeverOverLocalOrNodeRoutes: in a node namespace of
// its own, learned IPv4 and IPv6 routes equal to the node's connected
// subnets, to its static routes (found at the full sync, and one added
// after it) and to a local pod's /32 and /128 never replace them; once the
// pod's routes go, its addresses' learned routes take their place.
func TestPrivilegedLearnedNeverOverLocalOrNodeRoutes(t *testing.T) {
	requireRoot(t)
	ns := fmt.Sprintf("tbrt-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", ns, err, out)
		}
	})
	const pod = "cali0000000000a"
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "eth0", "type", "veth", "peer", "name", "eth1"}, // both ends stay here
		{"link", "set", "eth1", "up"},
		{"addr", "add", "198.18.0.11/24", "dev", "eth0"},
		{"-6", "addr", "add", "fd00:198:18::11/64", "dev", "eth0", "nodad"},
		{"link", "set", "eth0", "up"},
		{"link", "add", pod, "type", "veth", "peer", "name", "calipeer0"},
		{"link", "set", "calipeer0", "up"},
		{"link", "set", pod, "up"},
		{"route", "add", "10.96.0.0/12", "via", "198.18.0.1", "proto", "static"},
		{"-6", "route", "add", "fd00:96::/108", "via", "fd00:198:18::1", "proto", "static"},
	} {
		ipIn(t, ns, args...)
	}
	kernel, err := dataplane.NewRoutes("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	defer kernel.Close()
	node4, node6 := ipIn(t, ns, "route", "show"), ipIn(t, ns, "-6", "route", "show")

	table := New(kernel, time.Hour)
	v4, v6 := "198.18.0.12", "fd00:198:18::12"
	remote := []dataplane.Route{
		learned("198.18.0.0/24", v4), learned("fd00:198:18::/64", v6), // connected
		learned("10.96.0.0/12", v4), learned("fd00:96::/108", v6), // static
		learned("10.244.0.5/32", v4), learned("fd00:10:244::5/128", v6), // the local pod
		learned("10.244.1.0/26", v4), learned("fd00:10:244:1::/122", v6),
	}
	local := []dataplane.Route{wl("10.244.0.5/32", pod), wl("fd00:10:244::5/128", pod)}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(table.SetClass(Learned, remote))
	must(table.SetClass(Workload, local))
	must(table.Apply())
	list := func(proto int) []string {
		t.Helper()
		rs, err := kernel.List(proto)
		must(err)
		var out []string
		for _, rt := range rs {
			out = append(out, rt.String())
		}
		return out
	}
	wantLocal := []string{
		"10.244.0.5/32 dev cali0000000000a scope link proto 80",
		"fd00:10:244::5/128 dev cali0000000000a scope link proto 80",
	}
	wantLearned := []string{
		"10.244.1.0/26 via 198.18.0.12 dev eth0 proto 81",
		"fd00:10:244:1::/122 via fd00:198:18::12 dev eth0 proto 81",
	}
	if diff := cmp.Diff(wantLocal, list(dataplane.RouteProtoWorkload)); diff != "" {
		t.Errorf("local routes (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantLearned, list(dataplane.RouteProtoBGP)); diff != "" {
		t.Errorf("learned routes (-want +got):\n%s", diff)
	}
	if got := ipIn(t, ns, "route", "show"); !strings.Contains(got, "198.18.0.0/24 dev eth0 proto kernel scope link src 198.18.0.11") ||
		!strings.Contains(got, "10.96.0.0/12 via 198.18.0.1 dev eth0 proto static") {
		t.Errorf("the node's IPv4 routes changed:\nbefore:\n%s\nafter:\n%s", node4, got)
	}
	if got := ipIn(t, ns, "-6", "route", "show"); !strings.Contains(got, "fd00:198:18::/64 dev eth0 proto kernel") ||
		!strings.Contains(got, "fd00:96::/108 via fd00:198:18::1 dev eth0 proto static") {
		t.Errorf("the node's IPv6 routes changed:\nbefore:\n%s\nafter:\n%s", node6, got)
	}

	// Node routes that appear between full syncs, where learned routes are
	// to go, keep their place too (the kernel's ownership check).
	ipIn(t, ns, "route", "add", "10.244.2.0/26", "via", "198.18.0.1", "proto", "static")
	ipIn(t, ns, "-6", "route", "add", "fd00:10:244:2::/122", "via", "fd00:198:18::1", "proto", "static")
	must(table.SetClass(Learned, append(remote, learned("10.244.2.0/26", v4), learned("fd00:10:244:2::/122", v6))))
	must(table.Apply())
	if diff := cmp.Diff(wantLearned, list(dataplane.RouteProtoBGP)); diff != "" {
		t.Errorf("learned routes after new node routes (-want +got):\n%s", diff)
	}

	// The pod goes: its addresses' learned routes win.
	must(table.SetClass(Workload, nil))
	must(table.Apply())
	if got := list(dataplane.RouteProtoWorkload); len(got) > 0 {
		t.Errorf("local routes left after the pod went: %v", got)
	}
	wantLearned = []string{
		"10.244.0.5/32 via 198.18.0.12 dev eth0 proto 81",
		"10.244.1.0/26 via 198.18.0.12 dev eth0 proto 81",
		"fd00:10:244::5/128 via fd00:198:18::12 dev eth0 proto 81",
		"fd00:10:244:1::/122 via fd00:198:18::12 dev eth0 proto 81",
	}
	if diff := cmp.Diff(wantLearned, list(dataplane.RouteProtoBGP)); diff != "" {
		t.Errorf("learned routes after the pod went (-want +got):\n%s", diff)
	}

	// A full sync finds everything as it should be.
	before := table.Stats()
	table.Resync()
	must(table.Apply())
	if after := table.Stats(); after.Replaced != before.Replaced || after.Deleted != before.Deleted {
		t.Errorf("a full sync of a converged table changed routes: %+v → %+v", before, after)
	}
}
