package dataplane_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
)

// routeNode makes a "node" namespace with an uplink eth0 in 198.18.0.0/24
// (its peer eth1 stays in the same namespace, so nothing leaves it) and two
// foreign routes, and returns Routes acting in it.
func routeNode(t *testing.T) (testkit.NetNS, *dataplane.NetlinkRoutes) {
	t.Helper()
	node := testkit.NewNetNS(t, "tbdp-node")
	run(t, "ip", "-n", node.Name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
	run(t, "ip", "-n", node.Name, "addr", "add", "198.18.0.1/24", "dev", "eth0")
	run(t, "ip", "-n", node.Name, "link", "set", "eth0", "up")
	run(t, "ip", "-n", node.Name, "link", "set", "eth1", "up")
	run(t, "ip", "-n", node.Name, "route", "add", "10.96.0.0/12", "via", "198.18.0.2", "proto", "static")
	run(t, "ip", "-n", node.Name, "route", "add", "10.244.5.0/26", "dev", "eth0", "proto", "boot")
	r, err := dataplane.NewRoutes(node.Path)
	if err != nil {
		t.Fatalf("NewRoutes: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return node, r
}

func listStrings(t *testing.T, r dataplane.Routes, proto int) []string {
	t.Helper()
	rs, err := r.List(proto)
	if err != nil {
		t.Fatalf("List(%d): %v", proto, err)
	}
	return routeStrings(rs)
}

func foreignRoutesIntact(t *testing.T, node testkit.NetNS) {
	t.Helper()
	out := run(t, "ip", "-n", node.Name, "route", "show")
	for _, want := range []string{
		"10.96.0.0/12 via 198.18.0.2 dev eth0 proto static",
		"10.244.5.0/26 dev eth0 scope link \n", // proto boot is not printed
		"198.18.0.0/24 dev eth0 proto kernel scope link src 198.18.0.1",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("foreign route %q gone from:\n%s", want, out)
		}
	}
}

func TestPrivilegedRoutesReplaceListDelete(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	node, r := routeNode(t)
	run(t, "ip", "-n", node.Name, "link", "add", "cali1", "type", "veth", "peer", "name", "calipeer1")
	run(t, "ip", "-n", node.Name, "link", "set", "cali1", "up")

	for _, rt := range []dataplane.Route{
		bh("10.244.0.0/26"),
		wl("10.244.0.5/32", "cali1"),
		bgp("10.244.1.0/26", "198.18.0.4", "198.18.0.3"),
		bgp("10.244.2.0/26", "198.18.0.3"),
		{Dst: pfx("10.244.3.0/26"), Dev: "eth0", Gateways: addrs("198.18.0.5"), Proto: 81},
	} {
		if err := r.Replace(rt); err != nil {
			t.Fatalf("Replace(%v): %v", rt, err)
		}
	}
	want80 := []string{
		"blackhole 10.244.0.0/26 proto 80",
		"10.244.0.5/32 dev cali1 scope link proto 80",
	}
	want81 := []string{
		"10.244.1.0/26 proto 81 nexthop via 198.18.0.3 dev eth0 nexthop via 198.18.0.4 dev eth0",
		"10.244.2.0/26 via 198.18.0.3 dev eth0 proto 81",
		"10.244.3.0/26 via 198.18.0.5 dev eth0 proto 81",
	}
	if diff := cmp.Diff(want80, listStrings(t, r, 80)); diff != "" {
		t.Errorf("List(80) (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want81, listStrings(t, r, 81)); diff != "" {
		t.Errorf("List(81) (-want +got):\n%s", diff)
	}
	out := run(t, "ip", "-n", node.Name, "route", "show")
	for _, want := range []string{
		"blackhole 10.244.0.0/26 proto 80",
		"10.244.0.5 dev cali1 proto 80 scope link",
		"10.244.1.0/26 proto 81 \n\tnexthop via 198.18.0.3 dev eth0 weight 1 \n\tnexthop via 198.18.0.4 dev eth0 weight 1",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("ip route lacks %q:\n%s", want, out)
		}
	}

	// Replace changes an existing route in place.
	if err := r.Replace(bgp("10.244.2.0/26", "198.18.0.4", "198.18.0.6")); err != nil {
		t.Fatalf("Replace to ECMP: %v", err)
	}
	if err := r.Replace(wl("10.244.1.0/26", "cali1")); err != nil {
		t.Fatalf("Replace a proto 81 route by a proto 80 one: %v", err)
	}
	want81 = []string{
		"10.244.2.0/26 proto 81 nexthop via 198.18.0.4 dev eth0 nexthop via 198.18.0.6 dev eth0",
		"10.244.3.0/26 via 198.18.0.5 dev eth0 proto 81",
	}
	if diff := cmp.Diff(want81, listStrings(t, r, 81)); diff != "" {
		t.Errorf("List(81) after replace (-want +got):\n%s", diff)
	}

	// Foreign routes are never touched.
	if err := r.Replace(bh("10.244.5.0/26")); !errors.Is(err, dataplane.ErrForeignRoute) {
		t.Errorf("Replace over a proto boot route = %v, want ErrForeignRoute", err)
	}
	if err := r.Delete(dataplane.Route{Dst: pfx("10.244.5.0/26"), Dev: "eth0", Proto: 3}); !errors.Is(err, dataplane.ErrForeignRoute) {
		t.Errorf("Delete of a proto boot route = %v, want ErrForeignRoute", err)
	}
	if err := r.Delete(dataplane.Route{Dst: pfx("10.244.5.0/26"), Dev: "eth0", Proto: 80}); err != nil {
		t.Errorf("Delete of a proto 80 route that is missing (a proto boot one exists) = %v", err)
	}
	foreignRoutesIntact(t, node)

	// Delete, and delete again.
	for _, rt := range []dataplane.Route{
		bh("10.244.0.0/26"), wl("10.244.0.5/32", "cali1"),
		bgp("10.244.2.0/26", "198.18.0.4", "198.18.0.6"), bgp("10.244.3.0/26", "198.18.0.5"),
		wl("10.244.1.0/26", "cali1"),
	} {
		for i := range 2 {
			if err := r.Delete(rt); err != nil {
				t.Errorf("Delete #%d (%v): %v", i+1, rt, err)
			}
		}
	}
	if got := append(listStrings(t, r, 80), listStrings(t, r, 81)...); len(got) != 0 {
		t.Errorf("routes left after Delete: %q", got)
	}
	if err := r.Delete(wl("10.244.0.9/32", "nosuchdev")); err != nil {
		t.Errorf("Delete with a missing device = %v, want success", err)
	}
	foreignRoutesIntact(t, node)
}

func TestPrivilegedSyncRoutes(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	node, r := routeNode(t)
	run(t, "ip", "-n", node.Name, "route", "add", "blackhole", "10.244.9.0/26", "proto", "80")
	run(t, "ip", "-n", node.Name, "route", "add", "10.244.8.0/26", "via", "198.18.0.8", "proto", "81")

	steps := []struct {
		proto   int
		desired []dataplane.Route
		want    []string
	}{
		{80, []dataplane.Route{bh("10.244.0.0/26"), bh("10.244.0.64/26")},
			[]string{"blackhole 10.244.0.0/26 proto 80", "blackhole 10.244.0.64/26 proto 80"}},
		{81, []dataplane.Route{bgp("10.244.1.0/26", "198.18.0.3", "198.18.0.4"), bgp("10.244.2.0/26", "198.18.0.3")},
			[]string{
				"10.244.1.0/26 proto 81 nexthop via 198.18.0.3 dev eth0 nexthop via 198.18.0.4 dev eth0",
				"10.244.2.0/26 via 198.18.0.3 dev eth0 proto 81",
			}},
		{81, []dataplane.Route{bgp("10.244.1.0/26", "198.18.0.4"), bgp("10.244.2.0/26", "198.18.0.3", "198.18.0.5")},
			[]string{
				"10.244.1.0/26 via 198.18.0.4 dev eth0 proto 81",
				"10.244.2.0/26 proto 81 nexthop via 198.18.0.3 dev eth0 nexthop via 198.18.0.5 dev eth0",
			}},
		{80, []dataplane.Route{bh("10.244.0.64/26")}, []string{"blackhole 10.244.0.64/26 proto 80"}},
		{81, nil, nil},
	}
	for i, st := range steps {
		for pass := range 2 { // the second pass must find nothing to do
			if err := dataplane.SyncRoutes(r, st.proto, st.desired); err != nil {
				t.Fatalf("step %d pass %d: SyncRoutes: %v", i, pass, err)
			}
			if diff := cmp.Diff(st.want, listStrings(t, r, st.proto)); diff != "" {
				t.Errorf("step %d pass %d: List(%d) (-want +got):\n%s", i, pass, st.proto, diff)
			}
		}
	}
	// A desired route over a foreign one fails, the rest still converges.
	err := dataplane.SyncRoutes(r, 80, []dataplane.Route{bh("10.244.5.0/26"), bh("10.244.4.0/26")})
	if !errors.Is(err, dataplane.ErrForeignRoute) {
		t.Errorf("SyncRoutes over a foreign route = %v, want ErrForeignRoute", err)
	}
	if diff := cmp.Diff([]string{"blackhole 10.244.4.0/26 proto 80"}, listStrings(t, r, 80)); diff != "" {
		t.Errorf("List(80) (-want +got):\n%s", diff)
	}
	foreignRoutesIntact(t, node)
}

// TestPrivilegedRoutesForeignIPv6: an IPv6 route someone else added (the
// kernel gives it metric 1024, the IPv6 default, where an IPv4 route gets
// 0) is foreign to Replace and Delete as an IPv4 one is: a learned ::/0
// or block must not overwrite a node's own default route or static route.
func TestPrivilegedRoutesForeignIPv6(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	node, r := routeNode(t)
	run(t, "ip", "-n", node.Name, "-6", "addr", "add", "2001:db8::b/64", "dev", "eth0", "nodad")
	run(t, "ip", "-n", node.Name, "-6", "route", "add", "default", "via", "2001:db8::1", "dev", "eth0")
	run(t, "ip", "-n", node.Name, "-6", "route", "add", "fd00:10:244:5::/122", "dev", "eth0", "proto", "static")
	for _, rt := range []dataplane.Route{
		bgp("::/0", "2001:db8::2"),
		bgp("fd00:10:244:5::/122", "2001:db8::2"),
		{Dst: pfx("fd00:10:244:5::/122"), Type: dataplane.RouteBlackhole, Proto: dataplane.RouteProtoWorkload},
	} {
		if err := r.Replace(rt); !errors.Is(err, dataplane.ErrForeignRoute) {
			t.Errorf("Replace(%v) over a foreign IPv6 route = %v, want ErrForeignRoute", rt, err)
		}
	}
	if err := dataplane.SyncRoutes(r, dataplane.RouteProtoBGP, []dataplane.Route{bgp("::/0", "2001:db8::2"), bgp("fd00:10:244:6::/122", "2001:db8::2")}); !errors.Is(err, dataplane.ErrForeignRoute) {
		t.Errorf("SyncRoutes over a foreign IPv6 default route = %v, want ErrForeignRoute", err)
	}
	if diff := cmp.Diff([]string{"fd00:10:244:6::/122 via 2001:db8::2 dev eth0 proto 81"}, listStrings(t, r, dataplane.RouteProtoBGP)); diff != "" {
		t.Errorf("List(81) (-want +got):\n%s", diff)
	}
	out := run(t, "ip", "-n", node.Name, "-6", "route", "show")
	for _, want := range []string{
		"fd00:10:244:5::/122 dev eth0 proto static metric 1024",
		"default via 2001:db8::1 dev eth0 metric 1024",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("foreign IPv6 route %q gone from:\n%s", want, out)
		}
	}
	// Tabby's own IPv6 routes are still replaced in place.
	if err := r.Replace(bgp("fd00:10:244:6::/122", "2001:db8::3")); err != nil {
		t.Errorf("Replace of Tabby's own IPv6 route: %v", err)
	}
	if diff := cmp.Diff([]string{"fd00:10:244:6::/122 via 2001:db8::3 dev eth0 proto 81"}, listStrings(t, r, dataplane.RouteProtoBGP)); diff != "" {
		t.Errorf("List(81) after replace (-want +got):\n%s", diff)
	}
	foreignRoutesIntact(t, node)
}

// NodeRoutes lists the node's own routes of both families (connected,
// static, other protocols) and none of Tabby's.
func TestPrivilegedNodeRoutesBothFamilies(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	node, r := routeNode(t)
	run(t, "ip", "-n", node.Name, "-6", "addr", "add", "fd00:198:18::1/64", "dev", "eth0", "nodad")
	run(t, "ip", "-n", node.Name, "-6", "route", "add", "fd00:96::/108", "via", "fd00:198:18::2", "proto", "static")
	run(t, "ip", "-n", node.Name, "route", "add", "blackhole", "10.244.7.0/26", "proto", "80")
	run(t, "ip", "-n", node.Name, "-6", "route", "add", "fd00:10:244:7::/122", "via", "fd00:198:18::2", "proto", "81")
	got, err := r.NodeRoutes()
	if err != nil {
		t.Fatal(err)
	}
	has := map[string]bool{}
	for _, p := range got {
		has[p.String()] = true
	}
	for _, want := range []string{"198.18.0.0/24", "10.96.0.0/12", "10.244.5.0/26", "fd00:198:18::/64", "fd00:96::/108"} {
		if !has[want] {
			t.Errorf("NodeRoutes lacks %s: %v", want, got)
		}
	}
	for _, ours := range []string{"10.244.7.0/26", "fd00:10:244:7::/122"} {
		if has[ours] {
			t.Errorf("NodeRoutes lists Tabby's route %s: %v", ours, got)
		}
	}
}
