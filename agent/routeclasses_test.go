package agent

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/agent/routetable"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/syncer/syncertest"
)

// The route owner and the BGP owner share one table: a learned route equal
// to the node's own route (a connected subnet, a route of another
// protocol) or to a pod being wired right now (not yet in the view) never
// takes its place, in either family; once the pod is gone its address's
// learned route wins.
func TestLearnedNeverOverLocalOrNodeRoutes(t *testing.T) {
	node := []dataplane.Route{
		{Dst: netip.MustParsePrefix("198.18.0.0/24"), Dev: "eth0", Proto: 2},
		{Dst: netip.MustParsePrefix("fd00:198:18::/64"), Dev: "eth0", Proto: 2},
		{Dst: netip.MustParsePrefix("10.96.0.0/12"), Gateways: []netip.Addr{netip.MustParseAddr("198.18.0.1")}, Proto: 4},
		{Dst: netip.MustParsePrefix("fd00:96::/108"), Gateways: []netip.Addr{netip.MustParseAddr("fd00:198:18::1")}, Proto: 4},
	}
	kernel := fake.NewRoutes(node...)
	v := startView(t, syncertest.Static{})
	table := routetable.New(kernel, 0)
	ro := newRouteOwner("node1", v, table, testLogger())
	b := newBGPOwner("node1", netip.MustParsePrefix("198.18.0.11/24"), v, table, newFakeSpeaker(), nil, time.Minute, newMetrics(), testLogger())
	b.converged = true

	const pod = "cali0123456789a"
	spec := dataplane.WorkloadSpec{HostIfName: pod, Addrs: []netip.Prefix{netip.MustParsePrefix("10.244.0.5/32"), netip.MustParsePrefix("fd00:10:244::5/128")}}
	if err := ro.Wire(pod, dataplane.HostRoutes(spec)); err != nil {
		t.Fatal(err)
	}
	v4, v6 := netip.MustParseAddr("198.18.0.12"), netip.MustParseAddr("fd00:198:18::12")
	for _, l := range []struct {
		dst string
		nh  netip.Addr
	}{
		{"198.18.0.0/24", v4}, {"fd00:198:18::/64", v6}, {"10.96.0.0/12", v4}, {"fd00:96::/108", v6},
		{"10.244.0.5/32", v4}, {"fd00:10:244::5/128", v6}, {"10.244.1.0/26", v4}, {"fd00:10:244:1::/122", v6},
	} {
		b.learned = append(b.learned, bgp.LearnedRoute{Prefix: netip.MustParsePrefix(l.dst), NextHops: []netip.Addr{l.nh}})
	}
	if _, err := b.syncLearned(); err != nil {
		t.Fatalf("syncLearned: %v", err)
	}
	nodeLines := []string{
		"10.96.0.0/12 via 198.18.0.1 proto 4",
		"198.18.0.0/24 dev eth0 scope link proto 2",
		"fd00:96::/108 via fd00:198:18::1 proto 4",
		"fd00:198:18::/64 dev eth0 scope link proto 2",
	}
	want := append([]string{
		"10.244.0.5/32 dev cali0123456789a scope link proto 80",
		"10.244.1.0/26 via 198.18.0.12 proto 81",
		"fd00:10:244::5/128 dev cali0123456789a scope link proto 80",
		"fd00:10:244:1::/122 via fd00:198:18::12 proto 81",
	}, nodeLines...)
	if diff := cmp.Diff(sortRouteLines(want), kernel.Lines()); diff != "" {
		t.Errorf("with the pod being wired (-want +got):\n%s", diff)
	}

	ro.Unwire(pod)
	if err := ro.pass(context.Background()); err != nil {
		t.Fatalf("routes pass: %v", err)
	}
	want = append([]string{
		"10.244.0.5/32 via 198.18.0.12 proto 81",
		"10.244.1.0/26 via 198.18.0.12 proto 81",
		"fd00:10:244::5/128 via fd00:198:18::12 proto 81",
		"fd00:10:244:1::/122 via fd00:198:18::12 proto 81",
	}, nodeLines...)
	if diff := cmp.Diff(sortRouteLines(want), kernel.Lines()); diff != "" {
		t.Errorf("after the pod went (-want +got):\n%s", diff)
	}
}

// sortRouteLines orders `ip route` lines the way fake.Routes.Lines does:
// by destination.
func sortRouteLines(lines []string) []string {
	dst := func(l string) netip.Prefix {
		return netip.MustParsePrefix(strings.Fields(strings.TrimPrefix(l, "blackhole "))[0])
	}
	out := slices.Clone(lines)
	slices.SortFunc(out, func(a, b string) int { return dst(a).Compare(dst(b)) })
	return out
}

// Wire fails, naming the winner, when another workload's route holds the
// destination; the kernel keeps that route.
func TestWireDestinationTaken(t *testing.T) {
	kernel := fake.NewRoutes()
	ro := newRouteOwner("node1", startView(t, syncertest.Static{}), routetable.New(kernel, 0), testLogger())
	addr := []netip.Prefix{netip.MustParsePrefix("10.244.0.5/32")}
	if err := ro.Wire("cali000000000aa", dataplane.HostRoutes(dataplane.WorkloadSpec{HostIfName: "cali000000000aa", Addrs: addr})); err != nil {
		t.Fatal(err)
	}
	err := ro.Wire("cali000000000bb", dataplane.HostRoutes(dataplane.WorkloadSpec{HostIfName: "cali000000000bb", Addrs: addr}))
	if err == nil || !strings.Contains(err.Error(), "taken by 10.244.0.5/32 dev cali000000000aa") {
		t.Errorf("Wire over another workload's address = %v, want the destination taken", err)
	}
	if diff := cmp.Diff([]string{"10.244.0.5/32 dev cali000000000aa scope link proto 80"}, kernel.Lines()); diff != "" {
		t.Errorf("kernel (-want +got):\n%s", diff)
	}
}
