package bgp

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp/session"
)

// IPv6 over MP-BGP: the sessions stay between IPv4 (loopback) addresses,
// each speaker with an IPv6 node address from 2001:db8::/32 as the next hop
// of its IPv6 prefixes.

// testPool6 is the IPv6 pool of the IPv6 tests.
var testPool6 = netip.MustParsePrefix("fd00:10:244::/48")

// block6Of is node i's IPv6 test block, fd00:10:244::<i*64>/122.
func block6Of(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0x02, 0x44, 15: byte(i * 64)}), 122)
}

func addr6(s string) netip.Addr { return netip.MustParseAddr(s) }

// startNode6 starts a speaker whose policy knows both test pools.
func startNode6(t *testing.T, name string, cfg Config) *testNode {
	t.Helper()
	n := startNode(t, name, cfg)
	if err := n.sp.SetPolicy(context.Background(), Policy{Pools: []netip.Prefix{testPool, testPool6}}); err != nil {
		t.Fatalf("SetPolicy on %s: %v", name, err)
	}
	return n
}

// waitPeerFamilies waits until n's sessions are all Established and carry
// want (per peer address).
func waitPeerFamilies(t *testing.T, n *testNode, want map[netip.Addr][]string, deadline time.Time) {
	t.Helper()
	for {
		st, err := n.sp.Peers(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		got := map[netip.Addr][]string{}
		for _, p := range st {
			if p.State == session.Established {
				got[p.Address] = p.Families
			}
		}
		if fmt.Sprint(got) == fmt.Sprint(want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: sessions carry %v, want %v", n.name, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestIPv6Mesh: three mesh speakers, two with an IPv6 address (n0, n1) and
// one without (n2). n0 and n1 negotiate IPv6 unicast on their IPv4 session
// and learn each other's IPv6 block and borrowed /128 with the owner's IPv6
// address as next hop, next to the IPv4 blocks; n2's sessions carry IPv4
// only and it learns no IPv6 route. A withdrawn IPv6 block goes away.
func TestIPv6Mesh(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("127.77.40.1"), netip.MustParseAddr("127.77.40.2"), netip.MustParseAddr("127.77.40.3")}
	v6 := []netip.Addr{addr6("2001:db8::1"), addr6("2001:db8::2"), {}}
	port := freePort(t, addrs)
	ctx := context.Background()
	var nodes []*testNode
	for i, a := range addrs {
		nodes = append(nodes, startNode6(t, fmt.Sprintf("n%d", i), Config{
			RouterID: a, RouterID6: v6[i], ASN: api.DefaultASNumber, ListenAddr: a, ListenPort: int32(port), GracefulRestart: true,
		}))
	}
	for i, n := range nodes {
		var peers []Peer
		for j, o := range nodes {
			if j != i {
				peers = append(peers, Peer{Address: o.addr, ASN: api.DefaultASNumber, Type: PeerMesh, ClusterNode: true, Port: port, LocalAddress: n.addr})
			}
		}
		if err := n.sp.SetPeers(ctx, peers); err != nil {
			t.Fatal(err)
		}
	}
	borrowed := netip.MustParsePrefix("fd00:10:244::1:7/128")
	adv := [][]netip.Prefix{{blockOf(0), block6Of(0), borrowed}, {blockOf(1), block6Of(1)}, {blockOf(2)}}
	for i, n := range nodes {
		if err := n.sp.SetAdvertisements(ctx, AdvertisementsOf(adv[i])); err != nil {
			t.Fatalf("SetAdvertisements on %s: %v", n.name, err)
		}
	}
	// A speaker without an IPv6 address refuses IPv6 prefixes.
	if err := nodes[2].sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{blockOf(2), block6Of(2)})); err == nil {
		t.Error("n2 (no IPv6 address) accepted an IPv6 prefix")
	}
	deadline := time.Now().Add(convergeTimeout)
	both, v4 := []string{"ipv4", "ipv6"}, []string{"ipv4"}
	waitPeerFamilies(t, nodes[0], map[netip.Addr][]string{addrs[1]: both, addrs[2]: v4}, deadline)
	waitPeerFamilies(t, nodes[2], map[netip.Addr][]string{addrs[0]: v4, addrs[1]: v4}, deadline)

	want := [][]LearnedRoute{
		{{blockOf(1), []netip.Addr{addrs[1]}}, {blockOf(2), []netip.Addr{addrs[2]}}, {block6Of(1), []netip.Addr{v6[1]}}},
		{{blockOf(0), []netip.Addr{addrs[0]}}, {blockOf(2), []netip.Addr{addrs[2]}}, {block6Of(0), []netip.Addr{v6[0]}}, {borrowed, []netip.Addr{v6[0]}}},
		{{blockOf(0), []netip.Addr{addrs[0]}}, {blockOf(1), []netip.Addr{addrs[1]}}},
	}
	for i, n := range nodes {
		exp := slices.Clone(want[i])
		slices.SortFunc(exp, func(a, b LearnedRoute) int { return a.Prefix.Compare(b.Prefix) })
		if got, ok := n.watch.waitFor(deadline, func(rs []LearnedRoute) bool { return equalRoutes(rs, exp) }); !ok {
			t.Fatalf("%s routes:%s\nwant:%s%s", n.name, routesString(got), routesString(exp), peersString(n))
		}
	}

	// n0 withdraws its IPv6 block; n1 drops it and keeps the rest.
	if err := nodes[0].sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{blockOf(0), borrowed})); err != nil {
		t.Fatal(err)
	}
	if got, ok := nodes[1].watch.waitFor(time.Now().Add(convergeTimeout), func(rs []LearnedRoute) bool {
		return lacksRoute(rs, block6Of(0)) && hasRoute(rs, borrowed, v6[0]) && hasRoute(rs, blockOf(0), addrs[0]) && len(rs) == 3
	}); !ok {
		t.Fatalf("after the withdrawal n1 routes:%s", routesString(got))
	}
}

// TestHostilePeersIPv6: node n (mesh peer m, both with IPv6 addresses)
// peers with external routers e1 and e2 that speak IPv6 too. e1 sends a
// pool /128 (a local pod's address at n), ::/0 and a foreign IPv6 prefix:
// none is accepted; with acceptDefault ::/0 is, and reaches neither e2 nor
// m (no transit). m's prefix outside the IPv6 pool is refused. e2 hears
// n's own IPv6 block via n's IPv6 address and m's via m's (third-party next
// hop on the shared IPv6 subnet). An IPv6 flood over e1's max-prefix shuts
// its session down.
func TestHostilePeersIPv6(t *testing.T) {
	skipStaleRaceUnderDetector(t) // the flood's max-prefix shutdown takes a graceful-restart session down
	addrs := []netip.Addr{netip.MustParseAddr("127.77.41.1"), netip.MustParseAddr("127.77.41.2"), netip.MustParseAddr("127.77.41.3"), netip.MustParseAddr("127.77.41.4")}
	v6 := []netip.Addr{addr6("2001:db8:41::1"), addr6("2001:db8:41::2"), addr6("2001:db8:41::3"), addr6("2001:db8:41::4")}
	port := freePort(t, addrs)
	ctx := context.Background()
	subnet, subnet6 := netip.MustParsePrefix("127.77.41.0/24"), netip.MustParsePrefix("2001:db8:41::/64")
	start := func(name string, i int, asn uint32) *testNode {
		return startNode6(t, name, Config{RouterID: addrs[i], RouterID6: v6[i], Subnet: subnet, Subnet6: subnet6, ASN: asn, ListenAddr: addrs[i], ListenPort: int32(port), GracefulRestart: true})
	}
	n, m := start("n", 0, api.DefaultASNumber), start("m", 1, api.DefaultASNumber)
	e1, e2 := start("e1", 2, 65001), start("e2", 3, 65002)
	all := []FilterRule{{CIDR: netip.MustParsePrefix("0.0.0.0/0"), Operator: MatchIn, Accept: true}, {CIDR: netip.MustParsePrefix("::/0"), Operator: MatchIn, Accept: true}}
	for _, r := range []*testNode{e1, e2} {
		// Routers: no pools; their rules take everything.
		if err := r.sp.SetPolicy(ctx, Policy{}); err != nil {
			t.Fatal(err)
		}
		if err := r.sp.SetPeers(ctx, []Peer{{Address: n.addr, ASN: api.DefaultASNumber, Type: PeerGlobal, Port: port, LocalAddress: r.addr, Import: all, AcceptDefault: true}}); err != nil {
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
	pod := netip.MustParsePrefix("fd00:10:244::7/128") // inside n's block6Of(0)
	def := netip.MustParsePrefix("::/0")
	foreign := netip.MustParsePrefix("2001:db8:ffff::/48")
	outside := netip.MustParsePrefix("fd00:99::/64") // outside every pool
	if err := n.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{blockOf(0), block6Of(0)})); err != nil {
		t.Fatal(err)
	}
	if err := m.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{block6Of(1), outside})); err != nil {
		t.Fatal(err)
	}
	if err := e1.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{pod, def, foreign})); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(convergeTimeout)
	waitEstablished(t, n, 3, deadline)
	// e2 hears n's own IPv6 block with n's IPv6 next hop, and m's with m's.
	if got, ok := e2.watch.waitFor(deadline, func(rs []LearnedRoute) bool {
		return hasRoute(rs, block6Of(0), v6[0]) && hasRoute(rs, block6Of(1), v6[1]) && hasRoute(rs, blockOf(0), addrs[0])
	}); !ok {
		t.Fatalf("e2 routes:%s", routesString(got))
	}
	// n has received e1's three prefixes and m's two; it keeps m's pool
	// block only.
	for {
		st, err := n.sp.Peers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st[0].Received == 2 && st[1].Received == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n never received m's and e1's prefixes: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, ok := n.watch.waitFor(deadline, func(rs []LearnedRoute) bool { return hasRoute(rs, block6Of(1), v6[1]) }); !ok {
		t.Fatalf("n did not learn m's IPv6 block:%s", routesString(got))
	}
	if rs, err := n.sp.learnedRoutes(); err != nil || len(rs) != 1 {
		t.Fatalf("n learned more than m's block (err %v):%s", err, routesString(rs))
	}

	// acceptDefault on the live session lets ::/0 in, tagged: it reaches
	// neither e2 nor m.
	nPeers[1].AcceptDefault = true
	if err := n.sp.SetPeers(ctx, nPeers); err != nil {
		t.Fatal(err)
	}
	if got, ok := n.watch.waitFor(time.Now().Add(convergeTimeout), func(rs []LearnedRoute) bool {
		return len(rs) == 2 && hasRoute(rs, def, v6[2]) && hasRoute(rs, block6Of(1), v6[1])
	}); !ok {
		t.Fatalf("with acceptDefault n routes:%s", routesString(got))
	}
	// m and e2 still hold n's block, and nothing of e1's.
	for _, o := range []*testNode{e2, m} {
		if _, ok := o.watch.waitFor(time.Now().Add(convergeTimeout), func(rs []LearnedRoute) bool { return hasRoute(rs, block6Of(0), v6[0]) }); !ok {
			t.Fatalf("%s lost n's IPv6 block", o.name)
		}
		rs, err := o.sp.learnedRoutes()
		if err != nil {
			t.Fatal(err)
		}
		if !lacksRoute(rs, def) || !lacksRoute(rs, foreign) || !lacksRoute(rs, pod) {
			t.Errorf("%s got e1's IPv6 routes through n:%s", o.name, routesString(rs))
		}
	}

	// The node's own pod address, had a cluster peer sent it, never
	// reaches the kernel (the agent's FilterLearned).
	kept, rejected := FilterLearned([]LearnedRoute{{pod, []netip.Addr{v6[1]}}, {block6Of(1), []netip.Addr{v6[1]}}},
		ImportContext{Workloads: []netip.Addr{pod.Addr()}, Blocks: []netip.Prefix{block6Of(0)}, NodeSubnets: []netip.Prefix{subnet6}})
	if len(kept) != 1 || kept[0].Prefix != block6Of(1) || len(rejected) != 1 || rejected[0].Over != pod {
		t.Errorf("FilterLearned kept %v, rejected %v", kept, rejected)
	}

	// An IPv6 flood over the limit of 10 shuts e1's session down.
	var flood []netip.Prefix
	for i := range 12 {
		flood = append(flood, netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0xee, 7: byte(i)}), 64))
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
		if st[1].PrefixLimitExceeded && st[1].State != session.Established {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("IPv6 flood did not trip max-prefix: %+v", st[1])
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, ok := n.watch.waitFor(time.Now().Add(convergeTimeout), func(rs []LearnedRoute) bool { return lacksRoute(rs, def) }); !ok {
		t.Errorf("routes of the shut-down peer kept:%s", routesString(got))
	}
}

// TestFiltersIPv6: a BGPFilter's importV6/exportV6 rules (converted as the
// agent converts them) on a live session between node n and router e, both
// with IPv6 addresses, next to importV4 rules: each list touches its own
// family only, a NotIn rule of the IPv4 list included (it would reject
// every IPv6 route if GoBGP matched it across families).
func TestFiltersIPv6(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("127.77.43.1"), netip.MustParseAddr("127.77.43.2")}
	v6 := []netip.Addr{addr6("2001:db8:43::1"), addr6("2001:db8:43::2")}
	port := freePort(t, addrs)
	ctx := context.Background()
	subnet, subnet6 := netip.MustParsePrefix("127.77.43.0/24"), netip.MustParsePrefix("2001:db8:43::/64")
	start := func(name string, i int, asn uint32) *testNode {
		return startNode6(t, name, Config{RouterID: addrs[i], RouterID6: v6[i], Subnet: subnet, Subnet6: subnet6, ASN: asn, ListenAddr: addrs[i], ListenPort: int32(port), GracefulRestart: true})
	}
	n, e := start("n", 0, api.DefaultASNumber), start("e", 1, 65001)
	if err := e.sp.SetPolicy(ctx, Policy{}); err != nil {
		t.Fatal(err)
	}
	all := []FilterRule{{CIDR: netip.MustParsePrefix("0.0.0.0/0"), Operator: MatchIn, Accept: true}, {CIDR: netip.MustParsePrefix("::/0"), Operator: MatchIn, Accept: true}}
	if err := e.sp.SetPeers(ctx, []Peer{{Address: n.addr, ASN: api.DefaultASNumber, Type: PeerGlobal, Port: port, LocalAddress: e.addr, Import: all}}); err != nil {
		t.Fatal(err)
	}
	maxLen := int32(56)
	f := &api.BGPFilter{Metadata: api.ObjectMeta{Name: "tor"}, Spec: api.BGPFilterSpec{
		ImportV4: []api.BGPFilterRule{
			{CIDR: "198.51.100.0/24", MatchOperator: api.MatchOperatorNotIn, Action: api.FilterActionReject},
			{CIDR: "198.51.100.0/24", MatchOperator: api.MatchOperatorEqual, Action: api.FilterActionAccept},
		},
		ImportV6: []api.BGPFilterRule{
			{CIDR: "2001:db8:77::/48", PrefixLength: &api.BGPFilterPrefixLength{Max: &maxLen}, Action: api.FilterActionAccept},
		},
		ExportV6: []api.BGPFilterRule{
			{CIDR: block6Of(0).String(), MatchOperator: api.MatchOperatorEqual, Action: api.FilterActionReject},
		},
	}}
	f.SetDefaults()
	if err := f.Validate(); err != nil {
		t.Fatal(err)
	}
	got := DesiredPeers("n", []*api.Node{node("n", "127.77.43.1/24")}, meshOff(), []*api.BGPPeer{bgpPeer("tor", api.BGPPeerSpec{PeerIP: e.addr.String(), ASNumber: 65001, Filters: []string{"tor"}})}, []*api.BGPFilter{f})
	if len(got) != 1 || len(got[0].Import) != 3 || len(got[0].Export) != 1 {
		t.Fatalf("DesiredPeers = %+v, want the ToR with 3 import and 1 export rules", got)
	}
	tor := Peer{Address: e.addr, ASN: 65001, Type: PeerGlobal, Port: port, LocalAddress: n.addr, Import: got[0].Import, Export: got[0].Export}
	if err := n.sp.SetPeers(ctx, []Peer{tor}); err != nil {
		t.Fatal(err)
	}
	foreign := netip.MustParsePrefix("2001:db8:77::/48")
	tooLong := netip.MustParsePrefix("2001:db8:77:1::/64") // inside, longer than prefixLength.max
	unmatched := netip.MustParsePrefix("2001:db8:78::/48") // no rule: rejected
	in4 := netip.MustParsePrefix("198.51.100.0/24")        // the IPv4 Equal rule
	out4 := netip.MustParsePrefix("203.0.113.0/24")        // the IPv4 NotIn rule
	other6 := block6Of(1)                                  // another of n's IPv6 blocks
	if err := e.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{foreign, tooLong, unmatched, in4, out4})); err != nil {
		t.Fatal(err)
	}
	if err := n.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{blockOf(0), block6Of(0), other6})); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(convergeTimeout)
	waitEstablished(t, n, 1, deadline)
	// n has received e's five prefixes; it keeps one of each family.
	for {
		st, err := n.sp.Peers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st[0].Received == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n never received e's prefixes: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, ok := n.watch.waitFor(deadline, func(rs []LearnedRoute) bool {
		return hasRoute(rs, foreign, v6[1]) && hasRoute(rs, in4, addrs[1])
	}); !ok {
		t.Fatalf("n did not learn %s and %s:%s", foreign, in4, routesString(got))
	}
	if rs, err := n.sp.learnedRoutes(); err != nil || len(rs) != 2 {
		t.Errorf("n learned more than %s and %s (err %v):%s", foreign, in4, err, routesString(rs))
	}
	// e gets n's IPv4 block and the IPv6 block the exportV6 rule lets
	// through, each with n's address of its family.
	if got, ok := e.watch.waitFor(deadline, func(rs []LearnedRoute) bool {
		return hasRoute(rs, blockOf(0), addrs[0]) && hasRoute(rs, other6, v6[0])
	}); !ok {
		t.Fatalf("e routes:%s", routesString(got))
	}
	if rs, err := e.sp.learnedRoutes(); err != nil || !lacksRoute(rs, block6Of(0)) || len(rs) != 2 {
		t.Errorf("e holds more than %s and %s (err %v):%s", blockOf(0), other6, err, routesString(rs))
	}
}

// TestRouteReflectorIPv6: with the mesh off, two clients peer only with a
// reflector, all three with IPv6 addresses. The reflector passes each
// client's IPv6 block (and its IPv4 one) on to the other client with the
// owner's IPv6 next hop, and passes on a withdrawal; an external router's
// ::/0, which the reflector accepts (acceptDefault), is not reflected to
// the clients, nor is its foreign IPv6 prefix (refused on import).
func TestRouteReflectorIPv6(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("127.77.44.1"), netip.MustParseAddr("127.77.44.2"), netip.MustParseAddr("127.77.44.3"), netip.MustParseAddr("127.77.44.4")}
	v6 := []netip.Addr{addr6("2001:db8:44::1"), addr6("2001:db8:44::2"), addr6("2001:db8:44::3"), addr6("2001:db8:44::4")}
	port := freePort(t, addrs)
	ctx := context.Background()
	subnet, subnet6 := netip.MustParsePrefix("127.77.44.0/24"), netip.MustParsePrefix("2001:db8:44::/64")
	start := func(name string, i int, asn uint32, clusterID string) *testNode {
		return startNode6(t, name, Config{RouterID: addrs[i], RouterID6: v6[i], Subnet: subnet, Subnet6: subnet6, ASN: asn, ClusterID: clusterID,
			ListenAddr: addrs[i], ListenPort: int32(port), GracefulRestart: true})
	}
	rr := start("rr", 0, api.DefaultASNumber, "1.1.1.1")
	c1, c2 := start("c1", 1, api.DefaultASNumber, ""), start("c2", 2, api.DefaultASNumber, "")
	e := start("e", 3, 65001, "")
	if err := e.sp.SetPolicy(ctx, Policy{}); err != nil {
		t.Fatal(err)
	}
	if err := e.sp.SetPeers(ctx, []Peer{{Address: rr.addr, ASN: api.DefaultASNumber, Type: PeerGlobal, Port: port, LocalAddress: e.addr}}); err != nil {
		t.Fatal(err)
	}
	if err := rr.sp.SetPeers(ctx, []Peer{
		{Address: c1.addr, ASN: api.DefaultASNumber, Type: PeerRRClient, RRClient: true, Port: port, LocalAddress: rr.addr},
		{Address: c2.addr, ASN: api.DefaultASNumber, Type: PeerRRClient, RRClient: true, Port: port, LocalAddress: rr.addr},
		{Address: e.addr, ASN: 65001, Type: PeerGlobal, Port: port, LocalAddress: rr.addr, AcceptDefault: true},
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*testNode{c1, c2} {
		if err := c.sp.SetPeers(ctx, []Peer{{Address: rr.addr, ASN: api.DefaultASNumber, Type: PeerRR, Port: port, LocalAddress: c.addr}}); err != nil {
			t.Fatal(err)
		}
	}
	def, foreign := netip.MustParsePrefix("::/0"), netip.MustParsePrefix("2001:db8:ffff::/48")
	if err := e.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{def, foreign})); err != nil {
		t.Fatal(err)
	}
	if err := c1.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{blockOf(1), block6Of(1)})); err != nil {
		t.Fatal(err)
	}
	if err := c2.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{block6Of(2)})); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(convergeTimeout)
	waitPeerFamilies(t, rr, map[netip.Addr][]string{c1.addr: {"ipv4", "ipv6"}, c2.addr: {"ipv4", "ipv6"}, e.addr: {"ipv4", "ipv6"}}, deadline)
	// The reflector itself holds the external ::/0 (the barrier for the
	// clients' checks below: it is there to be reflected, and must not be).
	if got, ok := rr.watch.waitFor(deadline, func(rs []LearnedRoute) bool {
		return hasRoute(rs, def, v6[3]) && hasRoute(rs, block6Of(1), v6[1]) && hasRoute(rs, block6Of(2), v6[2])
	}); !ok {
		t.Fatalf("reflector routes:%s", routesString(got))
	}
	if got, ok := c2.watch.waitFor(deadline, func(rs []LearnedRoute) bool {
		return hasRoute(rs, block6Of(1), v6[1]) && hasRoute(rs, blockOf(1), addrs[1])
	}); !ok {
		t.Fatalf("c2 did not get c1's blocks reflected with c1's next hops:%s", routesString(got))
	}
	if got, ok := c1.watch.waitFor(deadline, func(rs []LearnedRoute) bool { return hasRoute(rs, block6Of(2), v6[2]) }); !ok {
		t.Fatalf("c1 did not get c2's IPv6 block reflected with c2's next hop:%s", routesString(got))
	}
	for _, c := range []*testNode{c1, c2} {
		rs, err := c.sp.learnedRoutes()
		if err != nil {
			t.Fatal(err)
		}
		if !lacksRoute(rs, def) || !lacksRoute(rs, foreign) {
			t.Errorf("%s got the external router's IPv6 routes through the reflector:%s", c.name, routesString(rs))
		}
	}
	// A withdrawal is reflected too.
	if err := c1.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{blockOf(1)})); err != nil {
		t.Fatal(err)
	}
	if got, ok := c2.watch.waitFor(time.Now().Add(convergeTimeout), func(rs []LearnedRoute) bool {
		return lacksRoute(rs, block6Of(1)) && hasRoute(rs, blockOf(1), addrs[1])
	}); !ok {
		t.Fatalf("c2 after c1's IPv6 withdrawal:%s", routesString(got))
	}
}
