package routetable

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
)

func ipIn(t testing.TB, ns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip -n %s %s: %v\n%s", ns, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// nodeNetNS makes a node namespace, removed when the test ends: an uplink
// eth0 (198.18.0.11/24, fd00:198:18::11/64; its veth peer stays in the
// namespace, so nothing leaves it), static routes of both families and a
// pod's host end cali0000000000a; it returns Routes acting in it.
func nodeNetNS(t *testing.T, role string) (string, *dataplane.NetlinkRoutes) {
	t.Helper()
	ns := testkit.NewNetNS(t, "tbrt-"+role).Name
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "eth0", "type", "veth", "peer", "name", "eth1"},
		{"link", "set", "eth1", "up"},
		{"addr", "add", "198.18.0.11/24", "dev", "eth0"},
		{"-6", "addr", "add", "fd00:198:18::11/64", "dev", "eth0", "nodad"},
		{"link", "set", "eth0", "up"},
		{"link", "add", "cali0000000000a", "type", "veth", "peer", "name", "calipeer0"},
		{"link", "set", "calipeer0", "up"},
		{"link", "set", "cali0000000000a", "up"},
		{"route", "add", "10.96.0.0/12", "via", "198.18.0.1", "proto", "static"},
		{"-6", "route", "add", "fd00:96::/108", "via", "fd00:198:18::1", "proto", "static"},
	} {
		ipIn(t, ns, args...)
	}
	kernel, err := dataplane.NewRoutes("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kernel.Close() })
	return ns, kernel
}

func listed(t *testing.T, kernel dataplane.Routes, proto int) []string {
	t.Helper()
	rs, err := kernel.List(proto)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, rt := range rs {
		out = append(out, rt.String())
	}
	return out
}

// TestPrivilegedLearnedNeverOverLocalOrNodeRoutes: in a node namespace of
// its own, learned IPv4 and IPv6 routes equal to the node's connected
// subnets, to its static routes (found at the full sync, and one added
// after it) and to a local pod's /32 and /128 never replace them; once the
// pod's routes go, its addresses' learned routes take their place.
func TestPrivilegedLearnedNeverOverLocalOrNodeRoutes(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	const pod = "cali0000000000a"
	ns, kernel := nodeNetNS(t, "n")
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
	list := func(proto int) []string { t.Helper(); return listed(t, kernel, proto) }
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

// TestPrivilegedOrphansAfterCrash: a restarted agent's table finds an
// earlier run's routes of both protocols and families. Local orphans go at
// the first Apply, learned ones stay while learned deletes are held (BGP
// not converged yet) and go once the hold is lifted; a route the new run
// wants again is kept or replaced, never deleted first.
func TestPrivilegedOrphansAfterCrash(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	ns, kernel := nodeNetNS(t, "o")
	for _, args := range [][]string{
		{"route", "add", "blackhole", "10.244.7.0/26", "proto", "80"},
		{"-6", "route", "add", "blackhole", "fd00:10:244:7::/122", "proto", "80"},
		{"route", "add", "10.244.0.9/32", "dev", "cali0000000000a", "proto", "80"},
		{"route", "add", "10.244.9.0/26", "via", "198.18.0.19", "proto", "81"},
		{"-6", "route", "add", "fd00:10:244:9::/122", "via", "fd00:198:18::19", "proto", "81"},
		{"route", "add", "10.244.1.0/26", "via", "198.18.0.19", "proto", "81"},
	} {
		ipIn(t, ns, args...)
	}
	table := New(kernel, time.Hour)
	table.HoldDeletes(Learned, true)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(table.SetClass(Workload, []dataplane.Route{wl("10.244.0.9/32", "cali0000000000a")}))
	must(table.SetClass(Learned, []dataplane.Route{learned("10.244.1.0/26", "198.18.0.12")}))
	must(table.Apply())
	if diff := cmp.Diff([]string{"10.244.0.9/32 dev cali0000000000a scope link proto 80"}, listed(t, kernel, dataplane.RouteProtoWorkload)); diff != "" {
		t.Errorf("local routes after the first Apply (-want +got):\n%s", diff)
	}
	wantLearned := []string{
		"10.244.1.0/26 via 198.18.0.12 dev eth0 proto 81",
		"10.244.9.0/26 via 198.18.0.19 dev eth0 proto 81",
		"fd00:10:244:9::/122 via fd00:198:18::19 dev eth0 proto 81",
	}
	if diff := cmp.Diff(wantLearned, listed(t, kernel, dataplane.RouteProtoBGP)); diff != "" {
		t.Errorf("learned routes while held (-want +got):\n%s", diff)
	}
	table.HoldDeletes(Learned, false)
	must(table.Apply())
	if diff := cmp.Diff(wantLearned[:1], listed(t, kernel, dataplane.RouteProtoBGP)); diff != "" {
		t.Errorf("learned routes after the hold (-want +got):\n%s", diff)
	}
}
