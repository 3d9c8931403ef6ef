package bgp

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp/session"
)

// TestHostilePeers: node n (mesh peer m) peers with two external routers.
// e1 sends a pool /32, a default route and a foreign prefix; none is
// accepted by default. A filter rule added on the live session lets the
// foreign prefix in without resetting it, and it still reaches neither
// the other router (no transit) nor the mesh peer. A flood over the
// peer's max-prefix shuts the session down with a status.
func TestHostilePeers(t *testing.T) {
	skipStaleRaceUnderDetector(t) // the flood's max-prefix shutdown takes a graceful-restart session down
	addrs := []netip.Addr{netip.MustParseAddr("127.77.13.1"), netip.MustParseAddr("127.77.13.2"), netip.MustParseAddr("127.77.13.3"), netip.MustParseAddr("127.77.13.4")}
	port := freePort(t, addrs)
	ctx := context.Background()
	start := func(name string, a netip.Addr, asn uint32) *testNode {
		return startNode(t, name, Config{RouterID: a, ASN: asn, ListenAddr: a, ListenPort: int32(port), GracefulRestart: true})
	}
	n, m := start("n", addrs[0], api.DefaultASNumber), start("m", addrs[1], api.DefaultASNumber)
	e1, e2 := start("e1", addrs[2], 65001), start("e2", addrs[3], 65002)
	all := []FilterRule{{CIDR: netip.MustParsePrefix("0.0.0.0/0"), Operator: MatchIn, Accept: true}}
	for _, r := range []*testNode{e1, e2} {
		if err := r.sp.SetPolicy(ctx, Policy{}); err != nil { // routers: no pools
			t.Fatal(err)
		}
		if err := r.sp.SetPeers(ctx, []Peer{{Address: n.addr, ASN: api.DefaultASNumber, Type: PeerGlobal, Port: port, LocalAddress: r.addr, Import: all}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.sp.SetPeers(ctx, []Peer{{Address: n.addr, ASN: api.DefaultASNumber, Type: PeerMesh, ClusterNode: true, Port: port, LocalAddress: m.addr}}); err != nil {
		t.Fatal(err)
	}
	nPeers := []Peer{
		{Address: m.addr, ASN: api.DefaultASNumber, Type: PeerMesh, ClusterNode: true, Port: port, LocalAddress: n.addr},
		{Address: e1.addr, ASN: 65001, Type: PeerGlobal, Port: port, LocalAddress: n.addr, MaxPrefixes: 10},
		{Address: e2.addr, ASN: 65002, Type: PeerGlobal, Port: port, LocalAddress: n.addr},
	}
	if err := n.sp.SetPeers(ctx, nPeers); err != nil {
		t.Fatal(err)
	}
	pod := netip.MustParsePrefix("10.244.0.7/32")
	def := netip.MustParsePrefix("0.0.0.0/0")
	foreign := netip.MustParsePrefix("203.0.113.0/24")
	if err := n.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{blockOf(0)})); err != nil {
		t.Fatal(err)
	}
	if err := e1.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{pod, def, foreign})); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(convergeTimeout)
	waitEstablished(t, n, 3, deadline)
	// e2 hears n's block: the session works, and n exports its own routes.
	if got, ok := e2.watch.waitFor(deadline, func(rs []LearnedRoute) bool { return hasRoute(rs, blockOf(0), n.addr) }); !ok {
		t.Fatalf("e2 did not learn n's block:%s", routesString(got))
	}
	// e1's routes have arrived at n (counted) but none is accepted.
	for {
		st, err := n.sp.Peers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st[1].Received == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n never received e1's prefixes: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if rs, err := n.sp.learnedRoutes(); err != nil || len(rs) != 0 {
		t.Fatalf("n learned from a hostile peer (err %v):%s", err, routesString(rs))
	}

	// A filter rule on the live session: the foreign prefix comes in.
	before, err := n.sp.Peers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nPeers[1].Import = []FilterRule{{CIDR: foreign, Operator: MatchEqual, Accept: true}}
	if err := n.sp.SetPeers(ctx, nPeers); err != nil {
		t.Fatal(err)
	}
	if got, ok := n.watch.waitFor(time.Now().Add(convergeTimeout), func(rs []LearnedRoute) bool {
		return len(rs) == 1 && hasRoute(rs, foreign, e1.addr)
	}); !ok {
		t.Fatalf("after the filter change n routes:%s", routesString(got))
	}
	after, err := n.sp.Peers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range after {
		if after[i].State != session.Established || !after[i].Since.Equal(before[i].Since) {
			t.Errorf("filter change reset the session: before %+v, after %+v", before[i], after[i])
		}
	}
	// No transit, nothing external into the cluster. e2 and m have
	// converged on n's routes once they hold n's block.
	if _, ok := m.watch.waitFor(time.Now().Add(convergeTimeout), func(rs []LearnedRoute) bool { return hasRoute(rs, blockOf(0), n.addr) }); !ok {
		t.Fatal("m never learned n's block")
	}
	for _, o := range []*testNode{e2, m} {
		rs, err := o.sp.learnedRoutes()
		if err != nil {
			t.Fatal(err)
		}
		if !lacksRoute(rs, foreign) || !lacksRoute(rs, def) || !lacksRoute(rs, pod) {
			t.Errorf("%s got e1's routes through n:%s", o.name, routesString(rs))
		}
	}

	// Flood over the limit of 10: the session goes down with a status.
	var flood []netip.Prefix
	for i := range 12 {
		flood = append(flood, netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(i * 8)}), 29))
	}
	if err := e1.sp.SetAdvertisements(ctx, AdvertisementsOf(flood)); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(convergeTimeout)
	for {
		st, err := n.sp.Peers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// GoBGP marks the peer before its session has gone down.
		if st[1].PrefixLimitExceeded && st[1].State != session.Established {
			if st[1].Info == "" || st[1].MaxPrefixes != 10 {
				t.Errorf("over the limit: %+v, want a reason and the limit", st[1])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("flood did not trip max-prefix: %+v", st[1])
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, ok := n.watch.waitFor(time.Now().Add(convergeTimeout), func(rs []LearnedRoute) bool { return lacksRoute(rs, foreign) }); !ok {
		t.Errorf("routes of the shut-down peer kept:%s", routesString(got))
	}
}
