package bgp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	gobgpapi "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"github.com/tabbynet/tabby/api"
)

// pathInfo is what a test reads of a best path.
type pathInfo struct {
	ASPath      []uint32
	Communities []uint32
	Large       []string
	NextHop     netip.Addr
	LocalPref   uint32
}

// pathsAt returns the IPv4 path per prefix learned from a peer in
// n's global RIB (read as communitiesAt does), without the NO_ADVERTISE
// tag n's import adds to routes from external peers.
func pathsAt(t *testing.T, n *testNode) map[netip.Prefix]pathInfo {
	t.Helper()
	out := map[netip.Prefix]pathInfo{}
	servers.RLock()
	err := n.sp.srv.ListPath(apiutil.ListPathRequest{TableType: gobgpapi.TableType_TABLE_TYPE_GLOBAL, Family: gobgp.RF_IPv4_UC},
		func(_ gobgp.NLRI, paths []*apiutil.Path) {
			for _, p := range paths {
				nlri, ok := p.Nlri.(*gobgp.IPAddrPrefix)
				if !ok || !p.PeerAddress.IsValid() {
					continue
				}
				var pi pathInfo
				for _, a := range p.Attrs {
					switch a := a.(type) {
					case *gobgp.PathAttributeAsPath:
						for _, seg := range a.Value {
							pi.ASPath = append(pi.ASPath, seg.GetAS()...)
						}
					case *gobgp.PathAttributeCommunities:
						pi.Communities = slices.DeleteFunc(slices.Clone(a.Value), func(v uint32) bool { return v == 0xFFFFFF02 })
					case *gobgp.PathAttributeLargeCommunities:
						for _, c := range a.Values {
							pi.Large = append(pi.Large, fmt.Sprintf("%d:%d:%d", c.ASN, c.LocalData1, c.LocalData2))
						}
					case *gobgp.PathAttributeNextHop:
						pi.NextHop = a.Value
					case *gobgp.PathAttributeLocalPref:
						pi.LocalPref = a.Value
					}
				}
				out[nlri.Prefix.Masked()] = pi
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

// waitPaths polls n's RIB until it holds exactly want.
func waitPaths(t *testing.T, n *testNode, want map[netip.Prefix]pathInfo) {
	t.Helper()
	deadline := time.Now().Add(convergeTimeout)
	opts := cmp.Options{cmpopts.EquateEmpty(), cmp.Comparer(func(x, y netip.Addr) bool { return x == y }), cmp.Comparer(func(x, y netip.Prefix) bool { return x == y })}
	for {
		got := pathsAt(t, n)
		if cmp.Equal(want, got, opts) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's paths (-want +got):\n%s", n.name, cmp.Diff(want, got, opts))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLocalASAndRichFilters (real GoBGP speakers): node n (AS 64512)
// peers with router e (AS 65001) as AS 65010 (BGPPeer localASNumber). Its
// import filter accepts, of e's four routes, the one carrying community
// 65001:100 (and sets LOCAL_PREF 300 and adds 65010:1 on it) and the one
// whose AS path begins with 65001 by an AS-path rule, and refuses the one
// carrying 65001:200 and an AS-path rule that names another AS. Its
// export filter matches its pool's large community, prepends 65020 65021
// and adds 65001:300, and rejects the other pool's block. e sees the
// session from AS 65010 and the path 65020 65021 65010.
func TestLocalASAndRichFilters(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("127.77.31.1"), netip.MustParseAddr("127.77.31.2")}
	port := freePort(t, addrs)
	ctx := context.Background()
	n := startNode(t, "n", Config{RouterID: addrs[0], ASN: api.DefaultASNumber, ListenAddr: addrs[0], ListenPort: int32(port), GracefulRestart: true})
	e := startNode(t, "e", Config{RouterID: addrs[1], ASN: 65001, ListenAddr: addrs[1], ListenPort: int32(port), GracefulRestart: true})
	all := []FilterRule{{CIDR: netip.MustParsePrefix("0.0.0.0/0"), Operator: MatchIn, Accept: true}}
	if err := e.sp.SetPolicy(ctx, Policy{}); err != nil {
		t.Fatal(err)
	}
	// e expects n as AS 65010: the session comes up only if n speaks as it.
	if err := e.sp.SetPeers(ctx, []Peer{{Address: n.addr, ASN: 65010, Type: PeerGlobal, Port: port, LocalAddress: e.addr, Import: all}}); err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix
	tagged, other, byPath, wrongPath := p("203.0.113.0/25"), p("203.0.113.128/25"), p("198.51.100.0/24"), p("192.0.2.0/24")
	if err := e.sp.SetAdvertisements(ctx, []Advertisement{
		{Prefix: tagged, Communities: []uint32{65001<<16 | 100}},
		{Prefix: other, Communities: []uint32{65001<<16 | 200}},
		{Prefix: byPath}, {Prefix: wrongPath},
	}); err != nil {
		t.Fatal(err)
	}

	pools := []*api.IPPool{
		{Metadata: api.ObjectMeta{Name: "a"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", BGPLargeCommunities: []string{"65001:1:7"}}},
		{Metadata: api.ObjectMeta{Name: "b"}, Spec: api.IPPoolSpec{CIDR: "10.245.0.0/16"}},
	}
	lp := uint32(300)
	f := &api.BGPFilter{Metadata: api.ObjectMeta{Name: "rich"}, Spec: api.BGPFilterSpec{
		ImportV4: []api.BGPFilterRule{
			{Communities: &api.BGPFilterCommunityMatch{Values: []string{"65001:200"}}, Action: "Reject"},
			{Communities: &api.BGPFilterCommunityMatch{Values: []string{"65001:100"}}, Action: "Accept", Operations: []api.BGPFilterOperation{
				{SetLocalPreference: &api.BGPFilterSetLocalPreference{Value: lp}}, {AddCommunity: &api.BGPFilterAddCommunity{Value: "65010:1"}}}},
			{CIDR: wrongPath.String(), ASPathPrefix: []uint32{65099}, Action: "Accept"},
			{CIDR: byPath.String(), ASPathPrefix: []uint32{65001}, Action: "Accept"},
			{PeerType: api.FilterPeerIBGP, Action: "Accept"}, // not for this eBGP session
		},
		ExportV4: []api.BGPFilterRule{
			{Communities: &api.BGPFilterCommunityMatch{Values: []string{"65001:1:7"}}, Action: "Accept", Operations: []api.BGPFilterOperation{
				{PrependASPath: &api.BGPFilterPrependASPath{Prefix: []uint32{65020, 65021}}}, {AddCommunity: &api.BGPFilterAddCommunity{Value: "65001:300"}}}},
			{Action: "Reject"},
		},
	}}
	if err := f.Validate(); err != nil {
		t.Fatal(err)
	}
	nodes := []*api.Node{node("n", addrs[0].String()+"/32")}
	cfg := &api.BGPConfiguration{Spec: api.BGPConfigurationSpec{ListenPort: &port}}
	peers := []*api.BGPPeer{bgpPeer("e", api.BGPPeerSpec{PeerIP: addrs[1].String(), ASNumber: 65001, LocalASNumber: 65010, Filters: []string{"rich"}})}
	if err := n.sp.SetPolicy(ctx, Policy{Pools: poolPrefixesOf(pools), Communities: PoolCommunities(pools)}); err != nil {
		t.Fatal(err)
	}
	desired := DesiredPeers("n", nodes, cfg, peers, []*api.BGPFilter{f})
	if len(desired) != 1 || desired[0].LocalASN != 65010 || len(desired[0].Import) != 4 {
		t.Fatalf("DesiredPeers = %+v, want one peer with local AS 65010 and 4 import rules (the iBGP one left out)", desired)
	}
	if err := n.sp.SetPeers(ctx, desired); err != nil {
		t.Fatal(err)
	}
	blockA, blockB := p("10.244.0.0/26"), p("10.245.0.0/26")
	if err := n.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{blockA, blockB})); err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, n, 1, time.Now().Add(convergeTimeout))

	waitPaths(t, n, map[netip.Prefix]pathInfo{
		tagged: {ASPath: []uint32{65001}, Communities: []uint32{65001<<16 | 100, 65010<<16 | 1}, NextHop: e.addr, LocalPref: lp},
		byPath: {ASPath: []uint32{65001}, NextHop: e.addr}, // no LOCAL_PREF over eBGP
	})
	waitPaths(t, e, map[netip.Prefix]pathInfo{
		blockA: {ASPath: []uint32{65020, 65021, 65010}, Communities: []uint32{65001<<16 | 300}, Large: []string{"65001:1:7"}, NextHop: n.addr},
	})
}

// TestNextHopModes (real GoBGP speakers): n1 and n2 are mesh peers, n1
// peers with router e. Without a subnet (no third-party next hop) Auto
// sends e n2's block with n1 as next hop; Keep with n2's; Self with n1's
// again. A change of the mode changes the policy only: no session flap.
func TestNextHopModes(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("127.77.32.1"), netip.MustParseAddr("127.77.32.2"), netip.MustParseAddr("127.77.32.3")}
	port := freePort(t, addrs)
	ctx := context.Background()
	var ns []*testNode
	for i, name := range []string{"n1", "n2"} {
		ns = append(ns, startNode(t, name, Config{RouterID: addrs[i], ASN: api.DefaultASNumber, ListenAddr: addrs[i], ListenPort: int32(port), GracefulRestart: true}))
	}
	e := startNode(t, "e", Config{RouterID: addrs[2], ASN: 65001, ListenAddr: addrs[2], ListenPort: int32(port), GracefulRestart: true})
	if err := e.sp.SetPolicy(ctx, Policy{}); err != nil {
		t.Fatal(err)
	}
	all := []FilterRule{{CIDR: netip.MustParsePrefix("0.0.0.0/0"), Operator: MatchIn, Accept: true}}
	if err := e.sp.SetPeers(ctx, []Peer{{Address: addrs[0], ASN: api.DefaultASNumber, Type: PeerGlobal, Port: port, LocalAddress: e.addr, Import: all}}); err != nil {
		t.Fatal(err)
	}
	nodes := []*api.Node{node("n1", addrs[0].String()+"/32"), node("n2", addrs[1].String()+"/32")}
	cfg := &api.BGPConfiguration{Spec: api.BGPConfigurationSpec{ListenPort: &port}}
	tor := bgpPeer("e", api.BGPPeerSpec{PeerIP: addrs[2].String(), ASNumber: 65001, Node: "n1"})
	configure := func(mode string) {
		t.Helper()
		tor.Spec.NextHopMode = mode
		for _, n := range ns {
			if err := n.sp.SetPeers(ctx, DesiredPeers(n.name, nodes, cfg, []*api.BGPPeer{tor}, nil)); err != nil {
				t.Fatal(err)
			}
		}
	}
	configure("")
	for i, n := range ns {
		if err := n.sp.SetAdvertisements(ctx, AdvertisementsOf([]netip.Prefix{blockOf(i)})); err != nil {
			t.Fatal(err)
		}
	}
	waitEstablished(t, ns[0], 2, time.Now().Add(convergeTimeout))
	want := func(hop2 netip.Addr) map[netip.Prefix]pathInfo {
		return map[netip.Prefix]pathInfo{
			blockOf(0): {ASPath: []uint32{api.DefaultASNumber}, NextHop: addrs[0]},
			blockOf(1): {ASPath: []uint32{api.DefaultASNumber}, NextHop: hop2},
		}
	}
	waitPaths(t, e, want(addrs[0]))
	before := flaps(t, ns[0])
	configure(api.NextHopModeKeep)
	waitPaths(t, e, want(addrs[1]))
	configure(api.NextHopModeSelf)
	waitPaths(t, e, want(addrs[0]))
	tor.Spec.NextHopMode, tor.Spec.KeepOriginalNextHop = "", true
	configure("")
	waitPaths(t, e, want(addrs[1]))
	if after := flaps(t, ns[0]); !cmp.Equal(before, after) {
		t.Errorf("next-hop mode changes flapped a session: flops/uptime before %v, after %v", before, after)
	}
}

func TestResolvePasswords(t *testing.T) {
	secrets := map[string]string{"tor/md5": "s3cret", "long/md5": string(make([]byte, 81))}
	lookup := func(r api.SecretKeyRef) (string, error) {
		v, ok := secrets[r.String()]
		if !ok {
			return "", errors.New("not found in Secret tabby-system/" + r.Name)
		}
		return v, nil
	}
	ref := func(name string) *api.SecretKeyRef { return &api.SecretKeyRef{Name: name, Key: "md5"} }
	peers := []Peer{
		{Address: a("198.18.0.1"), Password: "plain"},
		{Address: a("198.18.0.2"), PasswordRef: ref("tor")},
		{Address: a("198.18.0.3"), PasswordRef: ref("gone")},
		{Address: a("198.18.0.4"), PasswordRef: ref("long")},
		{Address: a("198.18.0.5"), Type: PeerMesh},
	}
	ok, down := ResolvePasswords(peers, lookup)
	var got []string
	for _, p := range ok {
		got = append(got, p.Address.String()+"="+p.Password)
	}
	for _, d := range down {
		got = append(got, d.Peer.Address.String()+" down: "+d.Reason)
	}
	want := []string{"198.18.0.1=plain", "198.18.0.2=s3cret", "198.18.0.5=",
		"198.18.0.3 down: password: secret key gone/md5: not found in Secret tabby-system/gone",
		"198.18.0.4 down: password: secret key long/md5: the value has 81 bytes; a TCP-MD5 key has 1 to 80"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ResolvePasswords (-want +got):\n%s", diff)
	}
	// A cluster peer with a reference never gets the mesh key instead.
	mesh := WithMeshPassword([]Peer{{Address: a("198.18.0.6"), Type: PeerMesh, PasswordRef: ref("gone")}}, "meshkey")
	if mesh[0].Password != "" {
		t.Errorf("WithMeshPassword gave a peer with a reference the mesh key")
	}
	cfg := &api.BGPConfiguration{Spec: api.BGPConfigurationSpec{NodeMeshPassword: api.BGPPassword{SecretKeyRef: ref("tor")}}}
	if pw, err := MeshPasswordFrom(cfg, "k", lookup); pw != "s3cret" || err != nil {
		t.Errorf("MeshPasswordFrom = %q, %v", pw, err)
	}
	cfg.Spec.NodeMeshPassword.SecretKeyRef = ref("gone")
	if pw, err := MeshPasswordFrom(cfg, "k", lookup); pw != "k" || err == nil {
		t.Errorf("MeshPasswordFrom with a missing key = %q, %v; want the mesh key and an error", pw, err)
	}
}

func TestLocalASProblems(t *testing.T) {
	nodes := []*api.Node{node("n1", "198.18.0.11/24"), node("n2", "198.18.0.12/24")}
	peers := []*api.BGPPeer{
		bgpPeer("to-n2", api.BGPPeerSpec{PeerIP: "198.18.0.12", ASNumber: 64512, LocalASNumber: 65010}),
		bgpPeer("tor", api.BGPPeerSpec{PeerIP: "198.18.0.1", ASNumber: 65001, LocalASNumber: 65010}),
	}
	got := LocalASProblems(nodes, peers)
	want := []string{"bgppeer/to-n2: spec.localASNumber 65010 ignored: spec.peerIP 198.18.0.12 is node n2, which peers as its own AS number"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("LocalASProblems (-want +got):\n%s", diff)
	}
	for _, p := range DesiredPeers("n1", nodes, meshOff(), peers, nil) {
		if wantAS := map[string]uint32{"198.18.0.12": 0, "198.18.0.1": 65010}[p.Address.String()]; p.LocalASN != wantAS {
			t.Errorf("peer %s: local AS %d, want %d", p.Address, p.LocalASN, wantAS)
		}
	}
}
