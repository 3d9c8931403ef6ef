package bgp

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
)

func TestMergeAdvertisements(t *testing.T) {
	p := netip.MustParsePrefix
	lc := func(a, b, c uint32) api.LargeCommunity { return api.LargeCommunity{ASN: a, Local1: b, Local2: c} }
	in := []Advertisement{
		{Prefix: p("10.244.1.7/26"), Communities: []uint32{7, 3}},
		{Prefix: p("10.244.0.0/26")},
		{Prefix: p("10.244.1.0/26"), Communities: []uint32{3, 5}, LargeCommunities: []api.LargeCommunity{lc(2, 1, 1), lc(1, 9, 9)}},
		{Prefix: p("10.244.1.0/26"), LargeCommunities: []api.LargeCommunity{lc(1, 9, 9)}},
	}
	want := []Advertisement{
		{Prefix: p("10.244.0.0/26")},
		{Prefix: p("10.244.1.0/26"), Communities: []uint32{3, 5, 7}, LargeCommunities: []api.LargeCommunity{lc(1, 9, 9), lc(2, 1, 1)}},
	}
	if diff := cmp.Diff(want, MergeAdvertisements(in), cmpPrefix); diff != "" {
		t.Errorf("MergeAdvertisements (-want +got):\n%s", diff)
	}
	if in[0].Communities[0] != 7 {
		t.Error("MergeAdvertisements changed its input")
	}
}

// The default sources give what the agent advertised before they existed:
// every exported affine block and borrowed address, plus the aggregate of
// every aggregated pool that holds one of them.
func TestDefaultSources(t *testing.T) {
	p := netip.MustParsePrefix
	v := SourceView{
		Affine:     []Block{{CIDR: p("10.244.0.0/26")}, {CIDR: p("10.246.0.0/26"), DisableBGPExport: true}, {CIDR: p("fd00:10::/122")}},
		Borrowed:   []Block{{CIDR: p("10.245.3.7/32")}, {CIDR: p("10.244.9.9/32")}, {CIDR: p("fd00:10::1:5/128"), DisableBGPExport: true}},
		Aggregates: []Aggregate{{Prefix: p("10.245.0.0/16")}, {Prefix: p("10.247.0.0/16")}, {Prefix: p("10.244.0.0/16"), WithBlocks: true}},
	}
	want := AddAggregates(DesiredAdvertisements(v.Affine, v.Borrowed), v.Aggregates)
	got := DesiredAdvertisementsFrom(DefaultSources(), v)
	if diff := cmp.Diff(AdvertisementsOf(want), got, cmpPrefix); diff != "" {
		t.Errorf("default sources (-want +got):\n%s", diff)
	}
	names := map[string]bool{}
	for _, s := range DefaultSources() {
		if s.Name() == "" || names[s.Name()] {
			t.Errorf("source %T: name %q empty or taken", s, s.Name())
		}
		names[s.Name()] = true
	}
}

// An advertisement's communities travel on the path itself (GoBGP path
// attributes), with no pool or policy involved: router e sees them on the
// block n originates; a change of communities alone reaches e (the path
// is sent again), and so does their removal.
func TestAdvertisementCommunities(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("127.77.17.1"), netip.MustParseAddr("127.77.17.2")}
	port := freePort(t, addrs)
	ctx := context.Background()
	start := func(name string, a netip.Addr, asn uint32) *testNode {
		return startNode(t, name, Config{RouterID: a, ASN: asn, ListenAddr: a, ListenPort: int32(port), GracefulRestart: true})
	}
	n, e := start("n", addrs[0], api.DefaultASNumber), start("e", addrs[1], 65001)
	if err := e.sp.SetPolicy(ctx, Policy{}); err != nil { // a router: no pools
		t.Fatal(err)
	}
	all := []FilterRule{{CIDR: netip.MustParsePrefix("0.0.0.0/0"), Operator: MatchIn, Accept: true}}
	if err := e.sp.SetPeers(ctx, []Peer{{Address: n.addr, ASN: api.DefaultASNumber, Type: PeerGlobal, Port: port, LocalAddress: e.addr, Import: all}}); err != nil {
		t.Fatal(err)
	}
	if err := n.sp.SetPeers(ctx, []Peer{{Address: e.addr, ASN: 65001, Type: PeerGlobal, Port: port, LocalAddress: n.addr}}); err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix
	tagged, plain := p("10.244.0.0/26"), p("10.244.0.64/26")
	deadline := time.Now().Add(convergeTimeout)
	waitEstablished(t, n, 1, deadline)
	expect := func(step string, want map[netip.Prefix][2][]string) {
		t.Helper()
		for {
			got := attrsAt(t, e)
			if cmp.Equal(want, got, cmpPrefix) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: e's communities and large communities (-want +got):\n%s", step, cmp.Diff(want, got, cmpPrefix))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	ads := []Advertisement{
		{Prefix: tagged, Communities: []uint32{65001<<16 | 300, 64512<<16 | 1}, LargeCommunities: []api.LargeCommunity{{ASN: 65001, Local1: 3, Local2: 300}}},
		{Prefix: plain},
	}
	if err := n.sp.SetAdvertisements(ctx, ads); err != nil {
		t.Fatal(err)
	}
	expect("tagged", map[netip.Prefix][2][]string{
		tagged: {{"64512:1", "65001:300"}, {"65001:3:300"}},
		plain:  {},
	})

	ads[0].Communities, ads[0].LargeCommunities = []uint32{65001<<16 | 301}, nil
	if err := n.sp.SetAdvertisements(ctx, ads); err != nil {
		t.Fatal(err)
	}
	expect("changed", map[netip.Prefix][2][]string{tagged: {{"65001:301"}, nil}, plain: {}})

	if err := n.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{tagged})); err != nil {
		t.Fatal(err)
	}
	expect("removed", map[netip.Prefix][2][]string{tagged: {}})
}
