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

func svc(ns, name, policy string, nodes []string, external, lb []string) *api.Service {
	return &api.Service{Metadata: api.ObjectMeta{Namespace: ns, Name: name},
		Spec: api.ServiceSpec{ClusterIPs: []string{"10.96.0.10"}, ExternalIPs: external, LoadBalancerIPs: lb, ExternalTrafficPolicy: policy, EndpointNodes: nodes}}
}

func cidrs(s ...string) []api.ServiceCIDR {
	var out []api.ServiceCIDR
	for _, c := range s {
		out = append(out, api.ServiceCIDR{CIDR: c})
	}
	return out
}

var prefixCmp = cmp.Comparer(func(x, y netip.Prefix) bool { return x == y })

// TestServiceDecisions: what a node advertises of the Services, and why
// not, across traffic policies, endpoint readiness, ranges, families and
// a node's configuration overriding the cluster's.
func TestServiceDecisions(t *testing.T) {
	p := netip.MustParsePrefix
	global := &api.BGPConfiguration{Spec: api.BGPConfigurationSpec{
		ServiceClusterIPs:      cidrs("10.96.0.0/16", "fd00:96::/112"),
		ServiceExternalIPs:     cidrs("198.19.8.0/24"),
		ServiceLoadBalancerIPs: cidrs("198.19.0.0/24", "fd00:19::/120"),
	}}
	cluster := svc("default", "web", "Cluster", nil, []string{"198.19.8.5"}, []string{"198.19.0.1"})
	local := svc("default", "db", "Local", []string{"n2"}, nil, []string{"198.19.0.2", "fd00:19::2"})
	outside := svc("shop", "bad", "Cluster", []string{"n1"}, []string{"198.19.9.9"}, []string{"198.19.8.7"})
	tests := []struct {
		name string
		v    ServiceView
		want []ServiceDecision
	}{
		{"no configuration advertises nothing and refuses nothing", ServiceView{Node: "n1", Services: []*api.Service{cluster}}, []ServiceDecision{
			{Service: "default/web", Kind: ServiceLoadBalancerIP, Prefix: p("198.19.0.1/32"), Reason: "no serviceLoadBalancerIPs configured in BGPConfiguration"},
			{Service: "default/web", Kind: ServiceExternalIP, Prefix: p("198.19.8.5/32"), Reason: "no serviceExternalIPs configured in BGPConfiguration"},
		}},
		{"cluster policy from every node, local from a node without an endpoint, IPv4 only", ServiceView{Node: "n1", Config: global.Spec, Services: []*api.Service{cluster, local, outside}}, []ServiceDecision{
			{Kind: ServiceClusterIPRange, Prefix: p("10.96.0.0/16"), Advertised: true},
			{Service: "default/web", Kind: ServiceLoadBalancerIP, Prefix: p("198.19.0.1/32"), Advertised: true},
			{Service: "default/db", Kind: ServiceLoadBalancerIP, Prefix: p("198.19.0.2/32"), Reason: "externalTrafficPolicy Local and no ready endpoint on this node"},
			{Service: "default/web", Kind: ServiceExternalIP, Prefix: p("198.19.8.5/32"), Advertised: true},
			{Service: "shop/bad", Kind: ServiceLoadBalancerIP, Prefix: p("198.19.8.7/32"), Refused: true, Reason: "198.19.8.7 is outside serviceLoadBalancerIPs [198.19.0.0/24 fd00:19::/120]"},
			{Service: "shop/bad", Kind: ServiceExternalIP, Prefix: p("198.19.9.9/32"), Refused: true, Reason: "198.19.9.9 is outside serviceExternalIPs [198.19.8.0/24]"},
			{Service: "default/db", Kind: ServiceLoadBalancerIP, Prefix: p("fd00:19::2/128"), Reason: "externalTrafficPolicy Local and no ready endpoint on this node"},
			{Kind: ServiceClusterIPRange, Prefix: p("fd00:96::/112"), Reason: "IPv6: this node has no IPv6 address, so BGP carries no IPv6"},
		}},
		{"local from the node with the endpoint, both families", ServiceView{Node: "n2", Config: global.Spec, IPv6: true, Services: []*api.Service{local}}, []ServiceDecision{
			{Kind: ServiceClusterIPRange, Prefix: p("10.96.0.0/16"), Advertised: true},
			{Service: "default/db", Kind: ServiceLoadBalancerIP, Prefix: p("198.19.0.2/32"), Advertised: true},
			{Service: "default/db", Kind: ServiceLoadBalancerIP, Prefix: p("fd00:19::2/128"), Advertised: true},
			{Kind: ServiceClusterIPRange, Prefix: p("fd00:96::/112"), Advertised: true},
		}},
		{"a node's own ranges replace the cluster's", ServiceView{Node: "n2", Services: []*api.Service{local},
			Config: api.EffectiveServices(global, &api.BGPConfiguration{Spec: api.BGPConfigurationSpec{ServiceLoadBalancerIPs: cidrs("198.19.0.128/25")}})}, []ServiceDecision{
			{Kind: ServiceClusterIPRange, Prefix: p("10.96.0.0/16"), Advertised: true},
			{Service: "default/db", Kind: ServiceLoadBalancerIP, Prefix: p("198.19.0.2/32"), Refused: true, Reason: "198.19.0.2 is outside serviceLoadBalancerIPs [198.19.0.128/25]"},
			{Service: "default/db", Kind: ServiceLoadBalancerIP, Prefix: p("fd00:19::2/128"), Refused: true, Reason: "fd00:19::2 is outside serviceLoadBalancerIPs [198.19.0.128/25]"},
			{Kind: ServiceClusterIPRange, Prefix: p("fd00:96::/112"), Reason: "IPv6: this node has no IPv6 address, so BGP carries no IPv6"},
		}},
		{"a ClusterIP range over a pool is refused", ServiceView{Node: "n1", Pools: []netip.Prefix{p("10.244.0.0/16")},
			Config: api.BGPConfigurationSpec{ServiceClusterIPs: cidrs("10.0.0.0/8", "10.96.0.0/16")}}, []ServiceDecision{
			{Kind: ServiceClusterIPRange, Prefix: p("10.0.0.0/8"), Refused: true,
				Reason: "serviceClusterIPs range 10.0.0.0/8 overlaps IP pool 10.244.0.0/16: every node would draw the pool's traffic"},
			{Kind: ServiceClusterIPRange, Prefix: p("10.96.0.0/16"), Advertised: true},
		}},
		{"an endpoint that is not ready withdraws a local address", ServiceView{Node: "n2", Config: global.Spec,
			Services: []*api.Service{svc("default", "db", "Local", nil, nil, []string{"198.19.0.2"})}}, []ServiceDecision{
			{Kind: ServiceClusterIPRange, Prefix: p("10.96.0.0/16"), Advertised: true},
			{Service: "default/db", Kind: ServiceLoadBalancerIP, Prefix: p("198.19.0.2/32"), Reason: "externalTrafficPolicy Local and no ready endpoint on this node"},
			{Kind: ServiceClusterIPRange, Prefix: p("fd00:96::/112"), Reason: "IPv6: this node has no IPv6 address, so BGP carries no IPv6"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, ServiceDecisions(tt.v), prefixCmp); diff != "" {
				t.Errorf("ServiceDecisions (-want +got):\n%s", diff)
			}
		})
	}
}

func TestServiceAdvertisementsCommunities(t *testing.T) {
	v := ServiceView{Node: "n1", Config: api.BGPConfigurationSpec{
		ServiceClusterIPs:      cidrs("10.96.0.0/16"),
		ServiceLoadBalancerIPs: cidrs("198.19.0.0/24"),
		PrefixAdvertisements: []api.PrefixAdvertisement{
			{CIDR: "198.19.0.0/24", Communities: []string{"65001:300", "65001:1:300"}},
			{CIDR: "198.19.0.0/16", Communities: []string{"65001:301", "65001:300"}},
		},
	}, Services: []*api.Service{
		svc("a", "one", "Cluster", nil, nil, []string{"198.19.0.1"}),
		svc("b", "two", "Cluster", nil, nil, []string{"198.19.0.1"}), // the same address twice: one advertisement
	}}
	got := ServiceSource{}.Advertisements(SourceView{Services: &v})
	want := []Advertisement{
		{Prefix: netip.MustParsePrefix("10.96.0.0/16"), ExternalOnly: true},
		{Prefix: netip.MustParsePrefix("198.19.0.1/32"), Communities: []uint32{65001<<16 | 300, 65001<<16 | 301},
			LargeCommunities: []api.LargeCommunity{{ASN: 65001, Local1: 1, Local2: 300}}, ExternalOnly: true},
	}
	if diff := cmp.Diff(want, got, prefixCmp); diff != "" {
		t.Errorf("Advertisements (-want +got):\n%s", diff)
	}
	if got := (ServiceSource{}).Advertisements(SourceView{}); got != nil {
		t.Errorf("without a ServiceView: %v", got)
	}
	wantPrefixes := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("198.19.0.1/32")}
	if diff := cmp.Diff(wantPrefixes, ServicePrefixes(ServiceDecisions(v)), prefixCmp); diff != "" {
		t.Errorf("ServicePrefixes (-want +got):\n%s", diff)
	}
}

// TestFilterLearnedServices: a node never installs a learned route to a
// Service prefix (another node's advertisement reflected, or sent back
// by a router).
func TestFilterLearnedServices(t *testing.T) {
	lb, cip := netip.MustParsePrefix("198.19.0.1/32"), netip.MustParsePrefix("10.96.0.0/16")
	learned := []LearnedRoute{
		{Prefix: lb, NextHops: []netip.Addr{netip.MustParseAddr("198.18.0.12")}},
		{Prefix: netip.MustParsePrefix("10.96.4.0/24"), NextHops: []netip.Addr{netip.MustParseAddr("198.18.0.12")}},
		{Prefix: netip.MustParsePrefix("10.244.1.0/26"), NextHops: []netip.Addr{netip.MustParseAddr("198.18.0.12")}},
	}
	learned = append(learned, LearnedRoute{Prefix: cip, NextHops: []netip.Addr{netip.MustParseAddr("198.18.0.13")}})
	// A range written over a pool protects itself, not the pod routes
	// inside it.
	kept, rejected := FilterLearned(learned, ImportContext{Services: []netip.Prefix{cip, lb, netip.MustParsePrefix("10.0.0.0/8")}})
	if len(kept) != 2 || kept[0].Prefix != learned[1].Prefix || kept[1].Prefix != learned[2].Prefix {
		t.Errorf("kept %v, want the pod block and the route inside the range", kept)
	}
	if len(rejected) != 2 || rejected[0].Over != lb || rejected[1].Over != cip {
		t.Errorf("rejected %v", rejected)
	}
}

// TestServicesNotSentToClusterPeers: a node sends its Service prefixes to
// a router outside the cluster, with their communities, and never to
// another node, which would otherwise accept a LoadBalancer IP inside one
// of its pools.
func TestServicesNotSentToClusterPeers(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("127.77.15.1"), netip.MustParseAddr("127.77.15.2"), netip.MustParseAddr("127.77.15.3")}
	port := freePort(t, addrs)
	ctx := context.Background()
	n := startNode(t, "n", Config{RouterID: addrs[0], ASN: api.DefaultASNumber, ListenAddr: addrs[0], ListenPort: int32(port), GracefulRestart: true})
	m := startNode(t, "m", Config{RouterID: addrs[1], ASN: api.DefaultASNumber, ListenAddr: addrs[1], ListenPort: int32(port), GracefulRestart: true})
	e := startNode(t, "e", Config{RouterID: addrs[2], ASN: 65001, ListenAddr: addrs[2], ListenPort: int32(port), GracefulRestart: true})
	lbPool := netip.MustParsePrefix("198.19.0.0/24")
	pools := []netip.Prefix{testPool, lbPool}
	nodes := []*api.Node{node("n", addrs[0].String()+"/32"), node("m", addrs[1].String()+"/32")}
	cfg := &api.BGPConfiguration{Spec: api.BGPConfigurationSpec{ListenPort: &port}}
	peers := []*api.BGPPeer{bgpPeer("e", api.BGPPeerSpec{PeerIP: addrs[2].String(), ASNumber: 65001, Node: "n"})}
	all := []FilterRule{{CIDR: netip.MustParsePrefix("0.0.0.0/0"), Operator: MatchIn, Accept: true}}
	if err := e.sp.SetPolicy(ctx, Policy{}); err != nil { // a router with no pools
		t.Fatal(err)
	}
	if err := e.sp.SetPeers(ctx, []Peer{{Address: n.addr, ASN: api.DefaultASNumber, Type: PeerGlobal, Port: port, LocalAddress: e.addr, Import: all}}); err != nil {
		t.Fatal(err)
	}
	if err := m.sp.SetPolicy(ctx, Policy{Pools: pools}); err != nil {
		t.Fatal(err)
	}
	if err := m.sp.SetPeers(ctx, DesiredPeers("m", nodes, cfg, peers, nil)); err != nil {
		t.Fatal(err)
	}
	v := ServiceView{Node: "n", Config: api.BGPConfigurationSpec{
		ServiceClusterIPs: cidrs("10.96.0.0/16"), ServiceLoadBalancerIPs: cidrs(lbPool.String()),
		PrefixAdvertisements: []api.PrefixAdvertisement{{CIDR: lbPool.String(), Communities: []string{"65001:300"}}},
	}, Services: []*api.Service{svc("a", "web", "Cluster", nil, nil, []string{"198.19.0.1"})}}
	if err := n.sp.SetPolicy(ctx, Policy{Pools: pools}); err != nil {
		t.Fatal(err)
	}
	if err := n.sp.SetPeers(ctx, DesiredPeers("n", nodes, cfg, peers, nil)); err != nil {
		t.Fatal(err)
	}
	block := netip.MustParsePrefix("10.244.0.0/26")
	ads := DesiredAdvertisementsFrom(DefaultSources(), SourceView{Affine: []Block{{CIDR: block}}, Services: &v})
	if err := n.sp.SetAdvertisements(ctx, ads); err != nil {
		t.Fatal(err)
	}
	lb, cip := netip.MustParsePrefix("198.19.0.1/32"), netip.MustParsePrefix("10.96.0.0/16")
	if got, ok := e.watch.waitFor(time.Now().Add(convergeTimeout), func(rs []LearnedRoute) bool {
		return len(rs) == 3 && hasRoute(rs, block, n.addr) && hasRoute(rs, lb, n.addr) && hasRoute(rs, cip, n.addr)
	}); !ok {
		t.Fatalf("the external router should learn the block and both Service prefixes:%s", routesString(got))
	}
	if got, ok := m.watch.waitFor(time.Now().Add(convergeTimeout), func(rs []LearnedRoute) bool {
		return len(rs) > 0 && hasRoute(rs, block, n.addr)
	}); !ok || len(got) != 1 {
		t.Fatalf("the other node should learn the block only:%s", routesString(got))
	}
	deadline := time.Now().Add(convergeTimeout)
	for {
		cs := communitiesAt(t, e)
		if cmp.Equal(cs[lb], []uint32{65001<<16 | 300}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("communities at the router: %v", cs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The marker that keeps them from the cluster never leaves the node.
	if large := largeCommunitiesAt(t, e); len(large[lb]) != 0 || len(large[cip]) != 0 {
		t.Errorf("the router got large communities on the Service prefixes: %v", large)
	}
	// Nothing arrives later at m either: its route set stays the block.
	if rs, _ := m.watch.get(); len(rs) != 1 {
		t.Errorf("m's routes: %s", routesString(rs))
	}
}

// largeCommunitiesAt returns the large communities of the paths in n's
// global RIB that a peer sent, by prefix (see communitiesAt).
func largeCommunitiesAt(t *testing.T, n *testNode) map[netip.Prefix][]string {
	t.Helper()
	out := map[netip.Prefix][]string{}
	servers.RLock()
	err := n.sp.srv.ListPath(apiutil.ListPathRequest{TableType: gobgpapi.TableType_TABLE_TYPE_GLOBAL, Family: gobgp.RF_IPv4_UC},
		func(_ gobgp.NLRI, paths []*apiutil.Path) {
			for _, p := range paths {
				nlri, ok := p.Nlri.(*gobgp.IPAddrPrefix)
				if !ok || !p.PeerAddress.IsValid() {
					continue
				}
				for _, a := range p.Attrs {
					if c, ok := a.(*gobgp.PathAttributeLargeCommunities); ok {
						for _, v := range c.Values {
							out[nlri.Prefix.Masked()] = append(out[nlri.Prefix.Masked()], v.String())
						}
					}
				}
			}
		})
	servers.RUnlock()
	if err != nil {
		t.Fatalf("reading %s's RIB: %v", n.name, err)
	}
	return out
}

// TestMergeExternalOnly: a prefix is external-only when every source
// that gives it says so.
func TestMergeExternalOnly(t *testing.T) {
	p := netip.MustParsePrefix("198.19.0.1/32")
	got := MergeAdvertisements([]Advertisement{{Prefix: p, ExternalOnly: true}, {Prefix: p}})
	if len(got) != 1 || got[0].ExternalOnly {
		t.Errorf("merged %+v, want one entry that reaches the cluster", got)
	}
	got = MergeAdvertisements([]Advertisement{{Prefix: p, ExternalOnly: true}, {Prefix: p, ExternalOnly: true}})
	if len(got) != 1 || !got[0].ExternalOnly {
		t.Errorf("merged %+v, want one external-only entry", got)
	}
	if !slices.Equal(Prefixes(got), []netip.Prefix{p}) {
		t.Errorf("prefixes %v", Prefixes(got))
	}
}
