package bgp

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	gobgpapi "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"github.com/tabbynet/tabby/api"
)

var cmpPrefix = cmp.Comparer(func(x, y netip.Prefix) bool { return x == y })

func TestPoolAggregatesAndAddAggregates(t *testing.T) {
	p := netip.MustParsePrefix
	pool := func(cidr string, mode api.AggregateMode, noExport bool) *api.IPPool {
		return &api.IPPool{Spec: api.IPPoolSpec{CIDR: cidr, BGPAggregate: mode, DisableBGPExport: noExport}}
	}
	aggs := PoolAggregates([]*api.IPPool{
		pool("10.245.0.0/16", api.AggregateWithBlocks, false),
		pool("10.244.0.0/16", api.AggregateOnly, false),
		pool("10.246.0.0/16", api.AggregateNone, false),
		pool("10.247.0.0/16", api.AggregateOnly, true), // not exported at all
		pool("nope", api.AggregateOnly, false),
		nil,
	})
	wantAggs := []Aggregate{{Prefix: p("10.244.0.0/16")}, {Prefix: p("10.245.0.0/16"), WithBlocks: true}}
	if diff := cmp.Diff(wantAggs, aggs, cmpPrefix); diff != "" {
		t.Errorf("PoolAggregates (-want +got):\n%s", diff)
	}
	// A node advertises an aggregate while it holds a block or a borrowed
	// address in it; a node with nothing in a pool does not.
	got := AddAggregates([]netip.Prefix{p("10.246.0.0/26"), p("10.245.3.7/32"), p("10.246.0.0/26")}, aggs)
	want := []netip.Prefix{p("10.245.0.0/16"), p("10.245.3.7/32"), p("10.246.0.0/26")}
	if diff := cmp.Diff(want, got, cmpPrefix); diff != "" {
		t.Errorf("AddAggregates (-want +got):\n%s", diff)
	}
}

// attrsAt returns, for each prefix in n's global RIB learned from a peer,
// its standard communities (without the NO_ADVERTISE tag n's import adds
// to routes from external peers) and large communities, read the way
// readRIB reads (see there for the locking).
func attrsAt(t *testing.T, n *testNode) map[netip.Prefix][2][]string {
	t.Helper()
	out := map[netip.Prefix][2][]string{}
	servers.RLock()
	err := n.sp.srv.ListPath(apiutil.ListPathRequest{TableType: gobgpapi.TableType_TABLE_TYPE_GLOBAL, Family: gobgp.RF_IPv4_UC},
		func(_ gobgp.NLRI, paths []*apiutil.Path) {
			for _, p := range paths {
				nlri, ok := p.Nlri.(*gobgp.IPAddrPrefix)
				if !ok || !p.PeerAddress.IsValid() {
					continue
				}
				var v [2][]string
				for _, a := range p.Attrs {
					switch a := a.(type) {
					case *gobgp.PathAttributeCommunities:
						for _, c := range a.Value {
							if c != 0xFFFFFF02 {
								v[0] = append(v[0], communityString(c))
							}
						}
					case *gobgp.PathAttributeLargeCommunities:
						for _, c := range a.Values {
							v[1] = append(v[1], api.LargeCommunity{ASN: c.ASN, Local1: c.LocalData1, Local2: c.LocalData2}.String())
						}
					}
				}
				out[nlri.Prefix.Masked()] = v
			}
		})
	servers.RUnlock()
	if _, berr := n.sp.srv.GetBgp(context.Background(), &gobgpapi.GetBgpRequest{}); berr != nil && err == nil {
		err = berr
	}
	if err != nil {
		t.Fatalf("reading %s's RIB: %v", n.name, err)
	}
	return out
}

// TestPoolAggregatesExport: node n (mesh peer m) peers with router e. Of
// n's three pools, one is aggregated Only (e gets the pool, not the
// block), one WithBlocks (e gets both), one not at all (e gets the
// block); m gets the three blocks and no aggregate. The pools' standard
// and large communities reach e on the aggregates and blocks alike, once
// each also on a block n passes on from m.
func TestPoolAggregatesExport(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("127.77.15.1"), netip.MustParseAddr("127.77.15.2"), netip.MustParseAddr("127.77.15.3")}
	port := freePort(t, addrs)
	ctx := context.Background()
	start := func(name string, a netip.Addr, asn uint32) *testNode {
		return startNode(t, name, Config{RouterID: a, ASN: asn, ListenAddr: a, ListenPort: int32(port), GracefulRestart: true})
	}
	n, m, e := start("n", addrs[0], api.DefaultASNumber), start("m", addrs[1], api.DefaultASNumber), start("e", addrs[2], 65001)

	pools := []*api.IPPool{
		{Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", BGPAggregate: api.AggregateOnly, BGPLargeCommunities: []string{"4200000001:1:100"}}},
		{Spec: api.IPPoolSpec{CIDR: "10.245.0.0/16", BGPAggregate: api.AggregateWithBlocks, BGPCommunities: []string{"65001:200"},
			BGPLargeCommunities: []string{"65001:2:200", "65001:2:201"}}},
		{Spec: api.IPPoolSpec{CIDR: "10.246.0.0/16"}},
	}
	pol := Policy{Pools: poolPrefixesOf(pools), Communities: PoolCommunities(pools), Aggregates: PoolAggregates(pools)}
	for _, c := range []*testNode{n, m} {
		if err := c.sp.SetPolicy(ctx, pol); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.sp.SetPolicy(ctx, Policy{}); err != nil { // a router: no pools
		t.Fatal(err)
	}
	all := []FilterRule{{CIDR: netip.MustParsePrefix("0.0.0.0/0"), Operator: MatchIn, Accept: true}}
	if err := e.sp.SetPeers(ctx, []Peer{{Address: n.addr, ASN: api.DefaultASNumber, Type: PeerGlobal, Port: port, LocalAddress: e.addr, Import: all}}); err != nil {
		t.Fatal(err)
	}
	if err := m.sp.SetPeers(ctx, []Peer{{Address: n.addr, ASN: api.DefaultASNumber, Type: PeerMesh, ClusterNode: true, Port: port, LocalAddress: m.addr}}); err != nil {
		t.Fatal(err)
	}
	if err := n.sp.SetPeers(ctx, []Peer{
		{Address: m.addr, ASN: api.DefaultASNumber, Type: PeerMesh, ClusterNode: true, Port: port, LocalAddress: n.addr},
		{Address: e.addr, ASN: 65001, Type: PeerGlobal, Port: port, LocalAddress: n.addr},
	}); err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix
	blockA, blockB, blockC := p("10.244.0.0/26"), p("10.245.0.0/26"), p("10.246.0.0/26")
	aggA, aggB := p("10.244.0.0/16"), p("10.245.0.0/16")
	adv := AddAggregates([]netip.Prefix{blockA, blockB, blockC}, pol.Aggregates)
	if want := []netip.Prefix{aggA, blockA, aggB, blockB, blockC}; !slices.Equal(adv, want) {
		t.Fatalf("n advertises %v, want %v", adv, want)
	}
	if err := n.sp.SetAdvertisements(ctx, AdvertisementsOf(adv)); err != nil {
		t.Fatal(err)
	}
	// m's block in pool b reaches n tagged by m; n passes it on to e
	// (WithBlocks) and tags it again: e must see each community once.
	blockBm := p("10.245.1.0/26")
	if err := m.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{blockBm})); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(convergeTimeout)
	waitEstablished(t, n, 2, deadline)
	// Each watcher's last set is the peer's whole table: exactly these.
	exactly := func(want ...netip.Prefix) func([]LearnedRoute) bool {
		return func(rs []LearnedRoute) bool {
			if len(rs) != len(want) {
				return false
			}
			for _, w := range want {
				if !hasRoute(rs, w, n.addr) {
					return false
				}
			}
			return true
		}
	}
	if got, ok := e.watch.waitFor(deadline, exactly(aggA, aggB, blockB, blockBm, blockC)); !ok {
		t.Errorf("router e's table:%s\nwant 10.244.0.0/16 (not its block), 10.245.0.0/16 and its two blocks, 10.246.0.0/26", routesString(got))
	}
	if got, ok := m.watch.waitFor(deadline, exactly(blockA, blockB, blockC)); !ok {
		t.Errorf("mesh peer m's table:%s\nwant the three blocks and no aggregate", routesString(got))
	}
	want := map[netip.Prefix][2][]string{
		aggA:    {nil, {"4200000001:1:100"}},
		aggB:    {{"65001:200"}, {"65001:2:200", "65001:2:201"}},
		blockB:  {{"65001:200"}, {"65001:2:200", "65001:2:201"}},
		blockBm: {{"65001:200"}, {"65001:2:200", "65001:2:201"}},
		blockC:  {},
	}
	for {
		got := attrsAt(t, e)
		if cmp.Equal(want, got, cmpPrefix) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("e's communities and large communities (-want +got):\n%s", cmp.Diff(want, got, cmpPrefix))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestNoTransitDespiteExportAccept: n accepts a prefix from router e1 (an
// import rule) and has an export rule towards router e2 that accepts that
// very prefix, and every other: e2 still never gets it (no transit; the
// export rules come after the no-transit policy).
func TestNoTransitDespiteExportAccept(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("127.77.16.1"), netip.MustParseAddr("127.77.16.2"), netip.MustParseAddr("127.77.16.3")}
	port := freePort(t, addrs)
	ctx := context.Background()
	start := func(name string, a netip.Addr, asn uint32) *testNode {
		return startNode(t, name, Config{RouterID: a, ASN: asn, ListenAddr: a, ListenPort: int32(port), GracefulRestart: true})
	}
	n, e1, e2 := start("n", addrs[0], api.DefaultASNumber), start("e1", addrs[1], 65001), start("e2", addrs[2], 65002)
	all := []FilterRule{{CIDR: netip.MustParsePrefix("0.0.0.0/0"), Operator: MatchIn, Accept: true}}
	for _, r := range []*testNode{e1, e2} {
		if err := r.sp.SetPolicy(ctx, Policy{}); err != nil {
			t.Fatal(err)
		}
		if err := r.sp.SetPeers(ctx, []Peer{{Address: n.addr, ASN: api.DefaultASNumber, Type: PeerGlobal, Port: port, LocalAddress: r.addr, Import: all}}); err != nil {
			t.Fatal(err)
		}
	}
	foreign := netip.MustParsePrefix("203.0.113.0/24")
	if err := n.sp.SetPeers(ctx, []Peer{
		{Address: e1.addr, ASN: 65001, Type: PeerGlobal, Port: port, LocalAddress: n.addr,
			Import: []FilterRule{{CIDR: foreign, Operator: MatchEqual, Accept: true}}},
		{Address: e2.addr, ASN: 65002, Type: PeerGlobal, Port: port, LocalAddress: n.addr,
			Export: []FilterRule{{CIDR: foreign, Operator: MatchEqual, Accept: true}, {CIDR: netip.MustParsePrefix("0.0.0.0/0"), Operator: MatchIn, Accept: true}}},
	}); err != nil {
		t.Fatal(err)
	}
	if err := e1.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{foreign})); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(convergeTimeout)
	waitEstablished(t, n, 2, deadline)
	if got, ok := n.watch.waitFor(deadline, func(rs []LearnedRoute) bool { return hasRoute(rs, foreign, e1.addr) }); !ok {
		t.Fatalf("n did not accept e1's prefix:%s", routesString(got))
	}
	// n's own block, advertised after n accepted e1's prefix: once e2 has
	// it, n has sent e2 everything it was going to send before it.
	if err := n.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{blockOf(0)})); err != nil {
		t.Fatal(err)
	}
	got, ok := e2.watch.waitFor(deadline, func(rs []LearnedRoute) bool { return hasRoute(rs, blockOf(0), n.addr) })
	if !ok {
		t.Fatalf("e2 did not learn n's block:%s", routesString(got))
	}
	rs, err := e2.sp.learnedRoutes()
	if err != nil {
		t.Fatal(err)
	}
	if !lacksRoute(rs, foreign) || len(rs) != 1 {
		t.Errorf("e2's table:%s\nwant n's block only: e1's prefix must not transit n, whatever n's export rules say", routesString(rs))
	}
}
