package bgp

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	gobgpapi "github.com/osrg/gobgp/v4/api"

	"github.com/tabbynet/tabby/api"
)

func filter(name string, imp, exp []api.BGPFilterRule) *api.BGPFilter {
	return &api.BGPFilter{Metadata: api.ObjectMeta{Name: name}, Spec: api.BGPFilterSpec{ImportV4: imp, ExportV4: exp}}
}

func TestDesiredPeersFilters(t *testing.T) {
	nodes := []*api.Node{node("n1", "198.18.0.11/24"), node("n2", "198.18.0.12/24")}
	max := int32(28)
	filters := []*api.BGPFilter{
		filter("a", []api.BGPFilterRule{{CIDR: "203.0.113.0/24", MatchOperator: "In", PrefixLength: &api.BGPFilterPrefixLength{Max: &max}, Action: "Accept"}},
			[]api.BGPFilterRule{{CIDR: "10.244.128.0/17", Action: "Reject"}}),
		filter("b", []api.BGPFilterRule{{Action: "Reject"}}, []api.BGPFilterRule{{CIDR: "10.244.0.0/16", MatchOperator: "NotIn", Action: "Reject"}}),
		filter("broken", []api.BGPFilterRule{{CIDR: "10.0.0.1/8", Action: "Accept"}}, nil),
	}
	mult := uint32(4)
	peers := []*api.BGPPeer{
		bgpPeer("tor", api.BGPPeerSpec{PeerIP: "198.18.0.1", ASNumber: 65001, AcceptDefault: true, MaxPrefixes: 50,
			Filters: []string{"b", "missing", "a", "broken"}, BFD: &api.BGPPeerBFD{Enabled: true, Multiplier: &mult}}),
		bgpPeer("nodes", api.BGPPeerSpec{PeerSelector: sel(), Filters: []string{"a"}, BFD: &api.BGPPeerBFD{Enabled: false}}),
	}
	got := DesiredPeers("n1", nodes, meshOff(), peers, filters)
	all := netip.MustParsePrefix("0.0.0.0/0")
	aImport := FilterRule{CIDR: netip.MustParsePrefix("203.0.113.0/24"), Operator: MatchIn, PrefixLength: &PrefixLengthRange{Max: 28}, Accept: true}
	aExport := FilterRule{CIDR: netip.MustParsePrefix("10.244.128.0/17"), Operator: MatchIn}
	want := []Peer{
		{Address: a("198.18.0.1"), ASN: 65001, Type: PeerGlobal, Name: "tor", LocalAddress: a("198.18.0.11"),
			AcceptDefault: true, MaxPrefixes: 50, BFD: &BFD{Interval: 300 * time.Millisecond, Multiplier: 4},
			Import: []FilterRule{{CIDR: all, Operator: MatchIn}, aImport},
			Export: []FilterRule{{CIDR: netip.MustParsePrefix("10.244.0.0/16"), Operator: MatchNotIn}, aExport}},
		{Address: a("198.18.0.12"), ASN: api.DefaultASNumber, Type: PeerNode, Name: "n2", LocalAddress: a("198.18.0.11"), ClusterNode: true,
			Import: []FilterRule{aImport}, Export: []FilterRule{aExport}},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(x, y netip.Addr) bool { return x == y }), cmp.Comparer(func(x, y netip.Prefix) bool { return x == y })); diff != "" {
		t.Errorf("DesiredPeers (-want +got):\n%s", diff)
	}

	problems := UnusableFilters(peers, filters)
	if len(problems) != 2 || problems[0] != "bgppeer/tor: bgpfilter/broken is invalid: spec.importV4[0].cidr: \"10.0.0.1/8\" has host bits set (did you mean \"10.0.0.0/8\"?)" ||
		problems[1] != "bgppeer/tor: bgpfilter/missing not found" {
		t.Errorf("UnusableFilters = %q", problems)
	}
}

func TestPoolCommunities(t *testing.T) {
	pool := func(cidr string, cs ...string) *api.IPPool {
		return &api.IPPool{Spec: api.IPPoolSpec{CIDR: cidr, BGPCommunities: cs}}
	}
	got := PoolCommunities([]*api.IPPool{pool("10.245.0.0/16", "65001:200"), pool("10.244.0.0/16", "65001:100", "0:7", "65001:100", "bad"), pool("10.246.0.0/16"), pool("nope", "1:1")})
	want := []PrefixCommunities{
		{Prefix: netip.MustParsePrefix("10.244.0.0/16"), Communities: []uint32{65001<<16 | 100, 7}},
		{Prefix: netip.MustParsePrefix("10.245.0.0/16"), Communities: []uint32{65001<<16 | 200}},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(x, y netip.Prefix) bool { return x == y })); diff != "" {
		t.Errorf("PoolCommunities (-want +got):\n%s", diff)
	}
}

// communitiesAt returns the communities of the best path for each prefix
// learned from a peer in n's global RIB (pathsAt's, without the
// NO_ADVERTISE tag n's own import adds to routes from external peers).
func communitiesAt(t *testing.T, n *testNode) map[netip.Prefix][]uint32 {
	t.Helper()
	out := map[netip.Prefix][]uint32{}
	for p, pi := range pathsAt(t, n) {
		out[p] = append([]uint32{}, pi.Communities...)
	}
	return out
}

// flaps returns how often each of n's sessions went down (GoBGP's flop
// count) and when each came up.
func flaps(t *testing.T, n *testNode) map[string][2]int64 {
	t.Helper()
	out := map[string][2]int64{}
	err := n.sp.srv.ListPeer(context.Background(), &gobgpapi.ListPeerRequest{}, func(p *gobgpapi.Peer) {
		var up int64
		if p.Timers != nil && p.Timers.State != nil && p.Timers.State.Uptime != nil {
			up = p.Timers.State.Uptime.AsTime().UnixNano()
		}
		out[p.Conf.NeighborAddress] = [2]int64{int64(p.State.Flops), up}
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestExportFiltersAndCommunities: node n exports its blocks to router e
// through a BGPFilter (exportV4) and tags them with its pools'
// communities. e sees the communities; export rules and communities
// changed on the live session take effect without a session flap.
func TestExportFiltersAndCommunities(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("127.77.14.1"), netip.MustParseAddr("127.77.14.2")}
	port := freePort(t, addrs)
	ctx := context.Background()
	n := startNode(t, "n", Config{RouterID: addrs[0], ASN: api.DefaultASNumber, ListenAddr: addrs[0], ListenPort: int32(port), GracefulRestart: true})
	e := startNode(t, "e", Config{RouterID: addrs[1], ASN: 65001, ListenAddr: addrs[1], ListenPort: int32(port), GracefulRestart: true})
	all := []FilterRule{{CIDR: netip.MustParsePrefix("0.0.0.0/0"), Operator: MatchIn, Accept: true}}
	if err := e.sp.SetPolicy(ctx, Policy{}); err != nil {
		t.Fatal(err)
	}
	if err := e.sp.SetPeers(ctx, []Peer{{Address: n.addr, ASN: api.DefaultASNumber, Type: PeerGlobal, Port: port, LocalAddress: e.addr, Import: all}}); err != nil {
		t.Fatal(err)
	}

	pools := []*api.IPPool{
		{Metadata: api.ObjectMeta{Name: "a"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", BGPCommunities: []string{"65001:100"}}},
		{Metadata: api.ObjectMeta{Name: "b"}, Spec: api.IPPoolSpec{CIDR: "10.245.0.0/16", BGPCommunities: []string{"65001:200", "65001:201"}}},
	}
	nodes := []*api.Node{node("n", addrs[0].String()+"/32")}
	cfg := &api.BGPConfiguration{Spec: api.BGPConfigurationSpec{ListenPort: &port}}
	peers := []*api.BGPPeer{bgpPeer("e", api.BGPPeerSpec{PeerIP: addrs[1].String(), ASNumber: 65001, Filters: []string{"out"}})}
	out := filter("out", nil, []api.BGPFilterRule{{CIDR: "10.245.0.0/16", MatchOperator: "In", Action: "Reject"}})
	configure := func() {
		t.Helper()
		if err := n.sp.SetPolicy(ctx, Policy{Pools: poolPrefixesOf(pools), Communities: PoolCommunities(pools)}); err != nil {
			t.Fatal(err)
		}
		if err := n.sp.SetPeers(ctx, DesiredPeers("n", nodes, cfg, peers, []*api.BGPFilter{out})); err != nil {
			t.Fatal(err)
		}
	}
	configure()
	blockA, blockB := netip.MustParsePrefix("10.244.0.0/26"), netip.MustParsePrefix("10.245.0.0/26")
	if err := n.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{blockA, blockB})); err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, n, 1, time.Now().Add(convergeTimeout))
	if got, ok := e.watch.waitFor(time.Now().Add(convergeTimeout), func(rs []LearnedRoute) bool {
		return len(rs) == 1 && hasRoute(rs, blockA, n.addr)
	}); !ok {
		t.Fatalf("e should have only pool a's block:%s", routesString(got))
	}
	waitCommunities := func(want map[netip.Prefix][]uint32) {
		t.Helper()
		deadline := time.Now().Add(convergeTimeout)
		for {
			got := communitiesAt(t, e)
			if cmp.Equal(want, got, cmp.Comparer(func(x, y netip.Prefix) bool { return x == y })) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("e's communities = %v, want %v", got, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitCommunities(map[netip.Prefix][]uint32{blockA: {65001<<16 | 100}})
	before := flaps(t, n)

	// Live changes: the filter now rejects pool a's block only, pool a's
	// community changes.
	out.Spec.ExportV4 = []api.BGPFilterRule{{CIDR: blockA.String(), MatchOperator: "Equal", Action: "Reject"}}
	pools[0].Spec.BGPCommunities = []string{"65001:101"}
	configure()
	if got, ok := e.watch.waitFor(time.Now().Add(convergeTimeout), func(rs []LearnedRoute) bool {
		return len(rs) == 1 && hasRoute(rs, blockB, n.addr)
	}); !ok {
		t.Fatalf("after the filter change e should have only pool b's block:%s", routesString(got))
	}
	waitCommunities(map[netip.Prefix][]uint32{blockB: {65001<<16 | 200, 65001<<16 | 201}})
	// No filter: both blocks, with their communities.
	peers[0].Spec.Filters = nil
	configure()
	waitCommunities(map[netip.Prefix][]uint32{blockA: {65001<<16 | 101}, blockB: {65001<<16 | 200, 65001<<16 | 201}})
	if after := flaps(t, n); !cmp.Equal(before, after) {
		t.Errorf("filter and community changes flapped the session: flops/uptime before %v, after %v", before, after)
	}
	if st := waitEstablished(t, e, 1, time.Now().Add(time.Second)); !slices.ContainsFunc(st, func(p PeerStatus) bool { return p.Address == n.addr }) {
		t.Errorf("e's peers: %+v", st)
	}
}

func poolPrefixesOf(pools []*api.IPPool) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range pools {
		if c, err := p.Prefix(); err == nil {
			out = append(out, c)
		}
	}
	return out
}
