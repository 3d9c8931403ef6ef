package bgp

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	gobgpapi "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"github.com/tabbynet/tabby/api"
)

// TestThirdPartyNextHop: two nodes (iBGP mesh) both peer with an eBGP
// router on their subnet. The router hears each node's block from both
// nodes, and every path keeps the owning node as next hop: a node passing
// on another node's block does not put itself in the path (GoBGP's
// next-hop-self would, and the router could then send traffic for one
// node's pods through the other).
func TestThirdPartyNextHop(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("127.77.11.1"), netip.MustParseAddr("127.77.11.2"), netip.MustParseAddr("127.77.11.3")}
	port := freePort(t, addrs)
	const torASN = 65001
	var nodes []*testNode
	var apiNodes []*api.Node
	for i, a := range addrs[:2] {
		name := fmt.Sprintf("node%02d", i)
		apiNodes = append(apiNodes, node(name, a.String()+"/32"))
		nodes = append(nodes, startNode(t, name, Config{RouterID: a, ASN: api.DefaultASNumber, ListenAddr: a, ListenPort: int32(port), GracefulRestart: true,
			Subnet: netip.MustParsePrefix("127.77.11.0/24")}))
	}
	tor := startNode(t, "tor", Config{RouterID: addrs[2], ASN: torASN, ListenAddr: addrs[2], ListenPort: int32(port), GracefulRestart: true})

	cfg := &api.BGPConfiguration{Spec: api.BGPConfigurationSpec{ListenPort: &port}}
	peers := []*api.BGPPeer{bgpPeer("tor", api.BGPPeerSpec{PeerIP: netip.AddrPortFrom(addrs[2], port).String(), ASNumber: torASN})}
	var torPeers []Peer
	for i, n := range nodes {
		if err := n.sp.SetPeers(context.Background(), DesiredPeers(n.name, apiNodes, cfg, peers, nil)); err != nil {
			t.Fatal(err)
		}
		if err := n.sp.SetAdvertisements(context.Background(), AdvertisementsOf([]netip.Prefix{blockOf(i)})); err != nil {
			t.Fatal(err)
		}
		torPeers = append(torPeers, Peer{Address: n.addr, ASN: api.DefaultASNumber, Type: PeerGlobal, Port: port,
			Import: []FilterRule{{CIDR: netip.MustParsePrefix("0.0.0.0/0"), Operator: MatchIn, Accept: true}}})
	}
	// The ToR is a router outside the cluster: no pools, accepts all.
	if err := tor.sp.SetPolicy(context.Background(), Policy{}); err != nil {
		t.Fatal(err)
	}
	if err := tor.sp.SetPeers(context.Background(), torPeers); err != nil {
		t.Fatal(err)
	}

	// want: each block heard from both nodes, always via its owner.
	want := map[netip.Prefix][]string{}
	for i, n := range nodes {
		for _, from := range nodes {
			want[blockOf(i)] = append(want[blockOf(i)], "from "+from.addr.String()+" via "+n.addr.String())
		}
		slices.Sort(want[blockOf(i)])
	}
	deadline := time.Now().Add(convergeTimeout)
	var got map[netip.Prefix][]string
	for {
		got = ribPaths(t, tor.sp)
		if cmp.Equal(got, want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("the eBGP router's paths (-want +got):\n%s", diff)
	}
	if rs, ok := tor.watch.waitFor(time.Now().Add(convergeTimeout), func(rs []LearnedRoute) bool {
		return len(rs) == 2 && hasRoute(rs, blockOf(0), addrs[0]) && hasRoute(rs, blockOf(1), addrs[1])
	}); !ok {
		t.Errorf("the eBGP router's routes:%s\nwant each block via its owner only", routesString(rs))
	}
}

// ribPaths lists every path in sp's global RIB as "from <peer> via <next
// hop>", per prefix, sorted.
func ribPaths(t *testing.T, sp *speaker) map[netip.Prefix][]string {
	t.Helper()
	out := map[netip.Prefix][]string{}
	err := sp.srv.ListPath(apiutil.ListPathRequest{TableType: gobgpapi.TableType_TABLE_TYPE_GLOBAL, Family: gobgp.RF_IPv4_UC},
		func(_ gobgp.NLRI, paths []*apiutil.Path) {
			for _, p := range paths {
				prefix, c, ok := candidateFromPath(p, sp.cfg.ASN)
				if !ok || c.local {
					continue
				}
				out[prefix] = append(out[prefix], fmt.Sprintf("from %v via %v", p.PeerAddress, c.nextHop))
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	for k := range out {
		slices.SortFunc(out[k], strings.Compare)
	}
	return out
}
