package dataplane_test

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/dataplane/fake"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func wl(dst, dev string) dataplane.Route {
	return dataplane.Route{Dst: pfx(dst), Dev: dev, Proto: dataplane.RouteProtoWorkload}
}

func bh(dst string) dataplane.Route {
	return dataplane.Route{Dst: pfx(dst), Type: dataplane.RouteBlackhole, Proto: dataplane.RouteProtoWorkload}
}

func bgp(dst string, gws ...string) dataplane.Route {
	return dataplane.Route{Dst: pfx(dst), Gateways: addrs(gws...), Proto: dataplane.RouteProtoBGP}
}

func foreign(dst, dev string, proto int) dataplane.Route {
	return dataplane.Route{Dst: pfx(dst), Dev: dev, Proto: proto}
}

func lines(s ...string) string {
	if len(s) == 0 {
		return ""
	}
	return strings.Join(s, "\n") + "\n"
}

func TestRouteString(t *testing.T) {
	tests := []struct {
		r    dataplane.Route
		want string
	}{
		{wl("10.244.0.5/32", "cali1234"), "10.244.0.5/32 dev cali1234 scope link proto 80"},
		{bh("10.244.0.0/26"), "blackhole 10.244.0.0/26 proto 80"},
		{bgp("10.244.1.0/26", "198.18.0.3"), "10.244.1.0/26 via 198.18.0.3 proto 81"},
		{bgp("10.244.1.0/26", "198.18.0.4", "198.18.0.3").Normalized(),
			"10.244.1.0/26 proto 81 nexthop via 198.18.0.3 nexthop via 198.18.0.4"},
		{dataplane.Route{Dst: pfx("0.0.0.0/0"), Dev: "eth0", Gateways: addrs("198.18.0.1"), Proto: 81},
			"default via 198.18.0.1 dev eth0 proto 81"},
	}
	for _, tt := range tests {
		if got := tt.r.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
}

func TestRouteValidate(t *testing.T) {
	tests := []struct {
		name string
		r    dataplane.Route
		ok   bool
	}{
		{"workload", wl("10.244.0.5/32", "cali1"), true},
		{"blackhole", bh("10.244.0.0/26"), true},
		{"ecmp", bgp("10.244.1.0/26", "198.18.0.3", "198.18.0.4"), true},
		{"no dev no gw", dataplane.Route{Dst: pfx("10.0.0.0/8"), Proto: 80}, false},
		{"blackhole with dev", dataplane.Route{Dst: pfx("10.0.0.0/8"), Type: dataplane.RouteBlackhole, Dev: "x", Proto: 80}, false},
		{"ipv6", dataplane.Route{Dst: pfx("fd00::1/128"), Dev: "x", Proto: 80}, true},
		{"ipv6 blackhole", bh("fd00::/122"), true},
		{"ipv6 with an IPv4 gateway", dataplane.Route{Dst: pfx("fd00::/122"), Gateways: addrs("198.18.0.3"), Proto: 81}, false},
		{"v4-mapped", dataplane.Route{Dst: pfx("::ffff:10.0.0.0/104"), Dev: "x", Proto: 80}, false},
		{"no proto", dataplane.Route{Dst: pfx("10.0.0.0/8"), Dev: "x"}, false},
		{"invalid dst", dataplane.Route{Dev: "x", Proto: 80}, false},
		{"v6 gateway", dataplane.Route{Dst: pfx("10.0.0.0/8"), Gateways: addrs("fe80::1"), Proto: 81}, false},
	}
	for _, tt := range tests {
		if err := tt.r.Validate(); (err == nil) != tt.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}

func TestSatisfies(t *testing.T) {
	listed := dataplane.Route{Dst: pfx("10.244.1.0/26"), Dev: "eth0", Gateways: addrs("198.18.0.4", "198.18.0.3"), Proto: 81}
	tests := []struct {
		name    string
		desired dataplane.Route
		want    bool
	}{
		{"kernel-resolved dev", bgp("10.244.1.0/26", "198.18.0.3", "198.18.0.4"), true},
		{"gateway order", bgp("10.244.1.0/26", "198.18.0.4", "198.18.0.3"), true},
		{"same dev", dataplane.Route{Dst: pfx("10.244.1.0/26"), Dev: "eth0", Gateways: addrs("198.18.0.3", "198.18.0.4"), Proto: 81}, true},
		{"other dev", dataplane.Route{Dst: pfx("10.244.1.0/26"), Dev: "eth1", Gateways: addrs("198.18.0.3", "198.18.0.4"), Proto: 81}, false},
		{"fewer gateways", bgp("10.244.1.0/26", "198.18.0.3"), false},
		{"other proto", dataplane.Route{Dst: pfx("10.244.1.0/26"), Gateways: addrs("198.18.0.3", "198.18.0.4"), Proto: 80}, false},
		{"other dst", bgp("10.244.2.0/26", "198.18.0.3", "198.18.0.4"), false},
		{"blackhole", dataplane.Route{Dst: pfx("10.244.1.0/26"), Type: dataplane.RouteBlackhole, Proto: 81}, false},
	}
	for _, tt := range tests {
		if got := tt.desired.Satisfies(listed); got != tt.want {
			t.Errorf("%s: Satisfies = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestSyncRoutes(t *testing.T) {
	tests := []struct {
		name      string
		initial   []dataplane.Route
		proto     int
		desired   []dataplane.Route
		wantTable string
		wantOps   []string
	}{
		{
			name:  "empty to blocks and workloads",
			proto: 80,
			desired: []dataplane.Route{
				wl("10.244.0.5/32", "cali1"), bh("10.244.0.0/26"),
			},
			wantTable: lines(
				"blackhole 10.244.0.0/26 proto 80",
				"10.244.0.5/32 dev cali1 scope link proto 80",
			),
			wantOps: []string{
				"replace blackhole 10.244.0.0/26 proto 80",
				"replace 10.244.0.5/32 dev cali1 scope link proto 80",
			},
		},
		{
			name:  "replace changed before deleting extras",
			proto: 81,
			initial: []dataplane.Route{
				bgp("10.244.1.0/26", "198.18.0.3"),
				bgp("10.244.2.0/26", "198.18.0.4"),
				bgp("10.244.3.0/26", "198.18.0.5"),
			},
			desired: []dataplane.Route{
				bgp("10.244.3.0/26", "198.18.0.5"),
				bgp("10.244.1.0/26", "198.18.0.4", "198.18.0.3"),
				bgp("10.244.4.0/26", "198.18.0.6"),
			},
			wantTable: lines(
				"10.244.1.0/26 proto 81 nexthop via 198.18.0.3 nexthop via 198.18.0.4",
				"10.244.3.0/26 via 198.18.0.5 proto 81",
				"10.244.4.0/26 via 198.18.0.6 proto 81",
			),
			wantOps: []string{
				"replace 10.244.1.0/26 proto 81 nexthop via 198.18.0.3 nexthop via 198.18.0.4",
				"replace 10.244.4.0/26 via 198.18.0.6 proto 81",
				"delete 10.244.2.0/26 via 198.18.0.4 proto 81",
			},
		},
		{
			name:  "other protocols untouched",
			proto: 80,
			initial: []dataplane.Route{
				foreign("198.18.0.0/24", "eth0", 2),
				foreign("10.96.0.0/12", "eth0", 4),
				bgp("10.244.1.0/26", "198.18.0.3"),
				bh("10.244.9.0/26"),
			},
			desired:   nil,
			wantTable: lines("10.96.0.0/12 dev eth0 scope link proto 4", "10.244.1.0/26 via 198.18.0.3 proto 81", "198.18.0.0/24 dev eth0 scope link proto 2"),
			wantOps:   []string{"delete blackhole 10.244.9.0/26 proto 80"},
		},
		{
			name:      "no change makes no call",
			proto:     80,
			initial:   []dataplane.Route{bh("10.244.0.0/26"), wl("10.244.0.1/32", "cali1")},
			desired:   []dataplane.Route{wl("10.244.0.1/32", "cali1"), bh("10.244.0.0/26")},
			wantTable: lines("blackhole 10.244.0.0/26 proto 80", "10.244.0.1/32 dev cali1 scope link proto 80"),
		},
		{
			name:      "route moves to another device",
			proto:     80,
			initial:   []dataplane.Route{wl("10.244.0.1/32", "cali1")},
			desired:   []dataplane.Route{wl("10.244.0.1/32", "cali2")},
			wantTable: lines("10.244.0.1/32 dev cali2 scope link proto 80"),
			wantOps:   []string{"replace 10.244.0.1/32 dev cali2 scope link proto 80"},
		},
		{
			name:      "proto 0 in desired takes proto",
			proto:     81,
			desired:   []dataplane.Route{{Dst: pfx("10.244.7.0/26"), Gateways: addrs("198.18.0.7")}},
			wantTable: lines("10.244.7.0/26 via 198.18.0.7 proto 81"),
			wantOps:   []string{"replace 10.244.7.0/26 via 198.18.0.7 proto 81"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := fake.NewRoutes(tt.initial...)
			if err := dataplane.SyncRoutes(r, tt.proto, tt.desired); err != nil {
				t.Fatalf("SyncRoutes: %v", err)
			}
			if diff := cmp.Diff(tt.wantTable, r.String()); diff != "" {
				t.Errorf("table (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantOps, r.Ops()); diff != "" {
				t.Errorf("ops (-want +got):\n%s", diff)
			}
			r.ResetOps()
			if err := dataplane.SyncRoutes(r, tt.proto, tt.desired); err != nil {
				t.Fatalf("second SyncRoutes: %v", err)
			}
			if ops := r.Ops(); len(ops) != 0 {
				t.Errorf("second SyncRoutes changed %v", ops)
			}
		})
	}
}

func TestSyncRoutesForeignSameDst(t *testing.T) {
	r := fake.NewRoutes(foreign("10.244.0.0/26", "eth0", 4))
	err := dataplane.SyncRoutes(r, 80, []dataplane.Route{bh("10.244.0.0/26"), wl("10.244.0.1/32", "cali1")})
	if !errors.Is(err, dataplane.ErrForeignRoute) {
		t.Fatalf("SyncRoutes = %v, want ErrForeignRoute", err)
	}
	want := lines("10.244.0.0/26 dev eth0 scope link proto 4", "10.244.0.1/32 dev cali1 scope link proto 80")
	if diff := cmp.Diff(want, r.String()); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
}

func TestSyncRoutesKeepsGoingAndJoinsErrors(t *testing.T) {
	r := fake.NewRoutes(bh("10.244.8.0/26"), bh("10.244.9.0/26"), bh("10.244.10.0/26"))
	errReplace := errors.New("replace boom")
	errDelete := errors.New("delete boom")
	r.SetFail("Replace 10.244.1.0/26", errReplace)
	r.SetFail("Delete 10.244.9.0/26", errDelete)
	err := dataplane.SyncRoutes(r, 80, []dataplane.Route{bh("10.244.1.0/26"), bh("10.244.2.0/26")})
	if !errors.Is(err, errReplace) || !errors.Is(err, errDelete) {
		t.Fatalf("SyncRoutes = %v, want both injected errors", err)
	}
	want := lines("blackhole 10.244.2.0/26 proto 80", "blackhole 10.244.9.0/26 proto 80")
	if diff := cmp.Diff(want, r.String()); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}

	r.SetFail("Replace 10.244.1.0/26", nil)
	r.SetFail("Delete 10.244.9.0/26", nil)
	if err := dataplane.SyncRoutes(r, 80, []dataplane.Route{bh("10.244.1.0/26"), bh("10.244.2.0/26")}); err != nil {
		t.Fatalf("retry: %v", err)
	}
	want = lines("blackhole 10.244.1.0/26 proto 80", "blackhole 10.244.2.0/26 proto 80")
	if diff := cmp.Diff(want, r.String()); diff != "" {
		t.Errorf("after retry (-want +got):\n%s", diff)
	}
}

func TestSyncRoutesListFailure(t *testing.T) {
	r := fake.NewRoutes(bh("10.244.9.0/26"))
	r.SetFail("List", fake.ErrInjected)
	err := dataplane.SyncRoutes(r, 80, []dataplane.Route{bh("10.244.1.0/26")})
	if !errors.Is(err, fake.ErrInjected) {
		t.Fatalf("SyncRoutes = %v, want injected error", err)
	}
	if ops := r.Ops(); len(ops) != 0 {
		t.Errorf("SyncRoutes changed %v after List failed", ops)
	}
}

func TestSyncRoutesRejects(t *testing.T) {
	r := fake.NewRoutes()
	if err := dataplane.SyncRoutes(r, 4, nil); !errors.Is(err, dataplane.ErrForeignRoute) {
		t.Errorf("SyncRoutes(proto 4) = %v, want ErrForeignRoute", err)
	}
	err := dataplane.SyncRoutes(r, 80, []dataplane.Route{
		bh("10.244.1.0/26"),
		wl("10.244.1.0/26", "cali1"),             // same Dst, different route: first wins
		bgp("10.244.2.0/26", "198.18.0.3"),       // wrong protocol
		{Dst: pfx("10.244.3.0/26"), Proto: 80},   // invalid: no dev, no gateway
		bh("10.244.4.0/26"), bh("10.244.4.0/26"), // identical duplicates are fine
		{Dst: pfx("10.244.5.7/26"), Dev: "x", Proto: 80}, // masked to 10.244.5.0/26
	})
	for _, want := range []string{"share a destination", "protocol is not 80", "needs a device or a gateway"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("SyncRoutes error %v does not mention %q", err, want)
		}
	}
	want := lines(
		"blackhole 10.244.1.0/26 proto 80",
		"blackhole 10.244.4.0/26 proto 80",
		"10.244.5.0/26 dev x scope link proto 80",
	)
	if diff := cmp.Diff(want, r.String()); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
}

// TestSyncRoutesShuffledConverges replays random start states and desired
// sets in random orders: every sync must end in exactly the desired routes of
// its protocol, leave all other routes alone, and replace before it deletes.
func TestSyncRoutesShuffledConverges(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pool := []dataplane.Route{
		bh("10.244.0.0/26"), bh("10.244.0.64/26"),
		wl("10.244.0.5/32", "cali1"), wl("10.244.0.5/32", "cali2"), wl("10.244.0.6/32", "cali3"),
		bgp("10.244.1.0/26", "198.18.0.3"), bgp("10.244.1.0/26", "198.18.0.3", "198.18.0.4"),
		bgp("10.244.2.0/26", "198.18.0.4"), bgp("10.244.3.0/26", "198.18.0.5", "198.18.0.6", "198.18.0.7"),
		bgp("10.244.0.5/32", "198.18.0.5"),
	}
	foreignRoutes := []dataplane.Route{foreign("198.18.0.0/24", "eth0", 2), foreign("10.96.0.0/12", "eth0", 4)}
	pick := func() []dataplane.Route {
		var out []dataplane.Route
		seen := map[netip.Prefix]bool{}
		for _, i := range rng.Perm(len(pool)) {
			if rng.IntN(2) == 0 && !seen[pool[i].Dst] {
				seen[pool[i].Dst] = true
				out = append(out, pool[i])
			}
		}
		return out
	}
	for round := range 200 {
		r := fake.NewRoutes(foreignRoutes...)
		for _, rt := range pick() {
			r.Add(rt)
		}
		before := r.Lines()
		for _, proto := range []int{80, 81} {
			var desired []dataplane.Route
			for _, rt := range pick() {
				if rt.Proto == proto {
					desired = append(desired, rt)
				}
			}
			r.ResetOps()
			if err := dataplane.SyncRoutes(r, proto, desired); err != nil {
				t.Fatalf("round %d proto %d: %v", round, proto, err)
			}
			listed, _ := r.List(proto)
			want := slices.Clone(desired)
			slices.SortFunc(want, dataplane.CompareRoutes)
			if diff := cmp.Diff(routeStrings(want), routeStrings(listed)); diff != "" {
				t.Fatalf("round %d proto %d: start %q desired %v: (-want +got):\n%s", round, proto, before, desired, diff)
			}
			ops := r.Ops()
			firstDelete := slices.IndexFunc(ops, func(s string) bool { return strings.HasPrefix(s, "delete") })
			if firstDelete >= 0 && slices.ContainsFunc(ops[firstDelete:], func(s string) bool { return strings.HasPrefix(s, "replace") }) {
				t.Fatalf("round %d: delete before replace: %v", round, ops)
			}
		}
		for _, f := range foreignRoutes {
			if !slices.Contains(r.Lines(), f.String()) {
				t.Fatalf("round %d: foreign route %v gone: %v", round, f, r.Lines())
			}
		}
	}
}

func routeStrings(rs []dataplane.Route) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Normalized().String())
	}
	return out
}
