package bgp

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tabbynet/tabby/api"
)

// IPv6 sessions: the session's transport is IPv6 (::1 on both ends, the
// only IPv6 loopback address; one end does not listen, so the other tells
// them apart by port), the next hops are the nodes' IPv6 addresses.

// ipv6SessionPair starts a listening speaker a and a connecting one b (both
// per cfg, b's ListenPort -1) with an IPv6 session between them over ::1.
func ipv6SessionPair(t *testing.T, a, b Config) (*testNode, *testNode) {
	t.Helper()
	lo := netip.IPv6Loopback()
	port := freePort(t, []netip.Addr{lo})
	a.ListenAddr6, a.ListenPort = lo, int32(port)
	b.ListenPort = -1
	na, nb := startNode6(t, "a", a), startNode6(t, "b", b)
	ctx := context.Background()
	if err := na.sp.SetPeers(ctx, []Peer{{Address: lo, ASN: api.DefaultASNumber, Type: PeerNode, ClusterNode: true, LocalAddress: lo, Port: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := nb.sp.SetPeers(ctx, []Peer{{Address: lo, ASN: api.DefaultASNumber, Type: PeerNode, ClusterNode: true, LocalAddress: lo, Port: port}}); err != nil {
		t.Fatal(err)
	}
	return na, nb
}

// TestIPv6OnlySession: an IPv6-only speaker (a 32-bit router ID that is no
// address, no IPv4 family) and a dual-stack one over an IPv6 session: the
// session carries IPv6 only, each learns the other's IPv6 block via its
// IPv6 address, the dual-stack node's IPv4 block does not cross, and the
// IPv6-only speaker refuses IPv4 peers and prefixes.
func TestIPv6OnlySession(t *testing.T) {
	v6a, v6b := addr6("2001:db8:6::1"), addr6("2001:db8:6::2")
	na, nb := ipv6SessionPair(t,
		Config{RouterID: netip.MustParseAddr("10.255.0.1"), RouterID6: v6a, IPv6Only: true, ASN: api.DefaultASNumber, GracefulRestart: true},
		Config{RouterID: netip.MustParseAddr("198.18.60.2"), RouterID6: v6b, ListenAddr: netip.MustParseAddr("127.77.60.2"), ASN: api.DefaultASNumber, GracefulRestart: true})
	ctx := context.Background()
	if err := na.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{block6Of(1)})); err != nil {
		t.Fatal(err)
	}
	if err := nb.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{blockOf(2), block6Of(2)})); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(convergeTimeout)
	lo := netip.IPv6Loopback()
	waitPeerFamilies(t, na, map[netip.Addr][]string{lo: {"ipv6"}}, deadline)
	waitPeerFamilies(t, nb, map[netip.Addr][]string{lo: {"ipv6"}}, deadline)
	if got, ok := na.watch.waitFor(deadline, func(rs []LearnedRoute) bool {
		return equalRoutes(rs, []LearnedRoute{{block6Of(2), []netip.Addr{v6b}}})
	}); !ok {
		t.Fatalf("a routes:%s", routesString(got))
	}
	if got, ok := nb.watch.waitFor(deadline, func(rs []LearnedRoute) bool {
		return equalRoutes(rs, []LearnedRoute{{block6Of(1), []netip.Addr{v6a}}})
	}); !ok {
		t.Fatalf("b routes:%s", routesString(got))
	}
	if err := na.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{blockOf(1), block6Of(1)})); err == nil {
		t.Error("the IPv6-only speaker accepted an IPv4 prefix")
	}
	err := na.sp.SetPeers(ctx, []Peer{{Address: netip.MustParseAddr("127.77.60.2"), ASN: api.DefaultASNumber, Type: PeerMesh}})
	if err == nil {
		t.Error("the IPv6-only speaker accepted an IPv4 peer")
	}
}

// TestIPv4OverIPv6Session: two dual-stack speakers over an IPv6 session
// carry both families: the IPv4 blocks keep their owners' IPv4 next hops.
func TestIPv4OverIPv6Session(t *testing.T) {
	v4a, v4b := netip.MustParseAddr("127.77.61.1"), netip.MustParseAddr("127.77.61.2")
	v6a, v6b := addr6("2001:db8:6::11"), addr6("2001:db8:6::12")
	na, nb := ipv6SessionPair(t,
		Config{RouterID: netip.MustParseAddr("198.18.61.1"), RouterID6: v6a, ListenAddr: v4a, ASN: api.DefaultASNumber, GracefulRestart: true},
		Config{RouterID: netip.MustParseAddr("198.18.61.2"), RouterID6: v6b, ListenAddr: v4b, ASN: api.DefaultASNumber, GracefulRestart: true})
	ctx := context.Background()
	if err := na.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{blockOf(1), block6Of(1)})); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(convergeTimeout)
	waitPeerFamilies(t, nb, map[netip.Addr][]string{netip.IPv6Loopback(): {"ipv4", "ipv6"}}, deadline)
	if got, ok := nb.watch.waitFor(deadline, func(rs []LearnedRoute) bool {
		return equalRoutes(rs, []LearnedRoute{{blockOf(1), []netip.Addr{netip.MustParseAddr("198.18.61.1")}}, {block6Of(1), []netip.Addr{v6a}}})
	}); !ok {
		t.Fatalf("b routes:%s", routesString(got))
	}
}

func withIPv6(cidr string) nodeOpt {
	return func(n *api.Node) { n.Spec.BGP.IPv6Address = cidr }
}

// node6 is a node with an IPv6 address only.
func node6(name, cidr string, opts ...nodeOpt) *api.Node {
	n := node(name, "", append([]nodeOpt{withIPv6(cidr)}, opts...)...)
	return n
}

// TestPlanPeersFamilies: sessions between nodes use IPv4 when both have
// it, IPv6 otherwise; a node without a common family and an explicit peer
// of a family self lacks are refused with a reason, nothing else changes.
func TestPlanPeersFamilies(t *testing.T) {
	nodes := []*api.Node{
		node("dual", "198.18.0.1/24", withIPv6("fd00:198:18::1/64")),
		node("v4", "198.18.0.2/24"),
		node6("v6", "fd00:198:18::3/64"),
	}
	tor6 := bgpPeer("tor6", api.BGPPeerSpec{PeerIP: "fd00:198:18::fe", ASNumber: 65001})
	tor4 := bgpPeer("tor4", api.BGPPeerSpec{PeerIP: "198.18.0.254", ASNumber: 65001})
	tests := []struct {
		self        string
		wantPeers   map[string]string // address → local address
		wantRefused []string
	}{
		{"dual", map[string]string{"198.18.0.2": "198.18.0.1", "198.18.0.254": "198.18.0.1", "fd00:198:18::3": "fd00:198:18::1", "fd00:198:18::fe": "fd00:198:18::1"}, nil},
		{"v4", map[string]string{"198.18.0.1": "198.18.0.2", "198.18.0.254": "198.18.0.2"}, []string{
			"bgppeer/tor6: spec.peerIP fd00:198:18::fe is IPv6 and node v4 has no IPv6 address (spec.bgp.ipv6Address)",
			"mesh: node v6 shares no address family with this node (IPv4 198.18.0.2; it has IPv6 fd00:198:18::3)",
		}},
		{"v6", map[string]string{"fd00:198:18::1": "fd00:198:18::3", "fd00:198:18::fe": "fd00:198:18::3"}, []string{
			"bgppeer/tor4: spec.peerIP 198.18.0.254 is IPv4 and node v6 has no IPv4 address (spec.bgp.ipv4Address)",
			"mesh: node v4 shares no address family with this node (IPv6 fd00:198:18::3; it has IPv4 198.18.0.2)",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.self, func(t *testing.T) {
			peers, refused := PlanPeers(PeerInput{Self: tc.self, Nodes: nodes, Peers: []*api.BGPPeer{tor4, tor6}})
			got := map[string]string{}
			for _, p := range peers {
				got[p.Address.String()] = p.LocalAddress.String()
			}
			if d := cmp.Diff(tc.wantPeers, got); d != "" {
				t.Errorf("peers (-want +got):\n%s", d)
			}
			var reasons []string
			for _, r := range refused {
				reasons = append(reasons, r.Name+": "+r.Reason)
			}
			if d := cmp.Diff(tc.wantRefused, reasons, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("refused (-want +got):\n%s", d)
			}
		})
	}
}
