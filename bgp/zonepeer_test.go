package bgp

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	gobgpapi "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"github.com/tabbynet/tabby/api"
)

// zoneNode is one speaker of a reflector test cluster.
type zoneNode struct {
	zone     string
	elected  bool
	operator string // an operator-set routeReflectorClusterID
	labels   []string
}

// plainZones is zones with two elected reflectors and two clients each, the
// reflectors first, so that they have the lowest router IDs, as the
// harness's dedicated reflector nodes do (GoBGP v4.8.0 breaks ties between
// paths by router ID alone, which is what made reflected copies win).
func plainZones(zones ...string) []zoneNode {
	var out []zoneNode
	for _, z := range zones {
		out = append(out, zoneNode{zone: z, elected: true}, zoneNode{zone: z, elected: true})
	}
	for _, z := range zones {
		out = append(out, zoneNode{zone: z}, zoneNode{zone: z})
	}
	return out
}

// mixedZones is plainZones a, b and c, with b's second reflector given a
// cluster ID by its operator (it wins over the zone's), zone d without a
// reflector (node 12) and node 13 in zone c, a reflector chosen by hand
// (routeReflectorClusterID, not elected). With a BGPPeer that also made
// zone d's node a client of node 13 (withManualClients), zone d's node
// kept a withdrawn block of zone b in about one run of eight, held from
// node 13, which itself held no path for it: not understood, not solved
// (docs/bgp.md, "Peering").
func mixedZones() []zoneNode {
	out := plainZones("a", "b", "c")
	out[3].operator = "10.0.0.2"
	return append(out, zoneNode{zone: "d"}, zoneNode{zone: "c", operator: "10.0.0.1", labels: []string{"manual-rr", "true"}})
}

// zoneCluster is real speakers peered as PlanPeers says for
// routeReflectorMode Auto with a layout's choice.
type zoneCluster struct {
	*cluster
	layout  []zoneNode
	zoneOf  map[netip.Addr]string
	rrs     map[string][]netip.Addr // zone → its elected reflectors
	elected map[netip.Addr]bool
	cfg     *api.BGPConfiguration
	choice  *ReflectorChoice
	peers   []*api.BGPPeer
	// dead: nodes whose speaker stopped; advertise leaves them out.
	dead map[int]bool
}

// newZoneCluster starts layout's speakers, has each advertise its block
// and, with converge, waits until every node routes every other's block
// via its owner.
func newZoneCluster(t *testing.T, net byte, layout []zoneNode, peering string, converge bool) *zoneCluster {
	const withManualClients = false // see mixedZones
	t.Helper()
	zc := &zoneCluster{cluster: &cluster{}, layout: layout, zoneOf: map[netip.Addr]string{}, rrs: map[string][]netip.Addr{}, elected: map[netip.Addr]bool{}}
	var addrs []netip.Addr
	for i := range layout {
		addrs = append(addrs, netip.AddrFrom4([4]byte{127, 77, net, byte(i + 1)}))
	}
	zc.port = freePort(t, addrs)
	choice := &ReflectorChoice{Zones: map[string][]Reflector{}}
	for i, zn := range layout {
		name := fmt.Sprintf("node%02d", i)
		zc.api = append(zc.api, node(name, addrs[i].String()+"/32", withRR(zn.operator),
			withLabels(append([]string{api.DefaultZoneLabel, zn.zone}, zn.labels...)...)))
		zc.zoneOf[addrs[i]] = zn.zone
		clusterID := zn.operator
		if zn.elected {
			choice.Zones[zn.zone] = append(choice.Zones[zn.zone], Reflector{Node: name, ClusterID: ZoneClusterID(zn.zone)})
			zc.rrs[zn.zone] = append(zc.rrs[zn.zone], addrs[i])
			zc.elected[addrs[i]] = true
			clusterID = cmp.Or(clusterID, ZoneClusterID(zn.zone))
		}
		zc.nodes = append(zc.nodes, startNode(t, name, Config{RouterID: addrs[i], ASN: api.DefaultASNumber, ListenAddr: addrs[i],
			ListenPort: int32(zc.port), ClusterID: clusterID, GracefulRestart: true, RestartTime: 30 * time.Second}))
	}
	cfg := meshOff()
	cfg.Spec.ListenPort = &zc.port
	cfg.Spec.RouteReflectorMode, cfg.Spec.RouteReflectorPeering = api.RouteReflectorModeAuto, peering
	var peers []*api.BGPPeer
	if withManualClients {
		peers = []*api.BGPPeer{bgpPeer("manual", api.BGPPeerSpec{NodeSelector: sel("manual-rr", "true"), PeerSelector: sel(api.DefaultZoneLabel, "d")})}
	}
	zc.cfg, zc.choice, zc.peers = cfg, choice, peers
	for _, n := range zc.nodes {
		zc.setPeers(t, n, allReady(choice), nil)
	}
	zc.advertiseBlocks(t)
	if converge {
		zc.waitAllBlocks(t, time.Now().Add(convergeTimeout))
	}
	return zc
}

// setPeers gives n the peers PlanPeers plans for it under zc's choice with
// ready (PeerInput.Ready), less the sessions to the nodes in without.
func (zc *zoneCluster) setPeers(t *testing.T, n *testNode, ready map[string]time.Time, without []string) {
	t.Helper()
	ps, refused := PlanPeers(PeerInput{Self: n.name, Nodes: zc.api, Config: zc.cfg, Peers: zc.peers, Reflectors: zc.choice, Ready: ready})
	if len(refused) > 0 {
		t.Fatalf("%s: refused %v", n.name, refused)
	}
	ps = slices.DeleteFunc(ps, func(p Peer) bool { return slices.Contains(without, p.Name) })
	if err := n.sp.SetPeers(context.Background(), ps); err != nil {
		t.Fatalf("SetPeers on %s: %v", n.name, err)
	}
}

// thirdZone describes every path an elected reflector holds for a block
// of another zone with reflectors from an elected reflector of a third
// zone.
func (zc *zoneCluster) thirdZone(t *testing.T) (found []string) {
	t.Helper()
	for i, n := range zc.nodes {
		if !zc.layout[i].elected {
			continue
		}
		for prefix, from := range pathSources(t, n) {
			oz := zc.zoneOf[zc.nodes[prefix.Addr().As4()[2]].addr] // blockOf(j) is 10.244.j.0/26
			if oz == zc.layout[i].zone || len(zc.rrs[oz]) == 0 {
				continue
			}
			for _, src := range from {
				if zc.elected[src] && !slices.Contains(zc.rrs[oz], src) {
					found = append(found, fmt.Sprintf("%s (zone %s) holds %s (zone %s) from %s (zone %s)", n.name, zc.layout[i].zone, prefix, oz, src, zc.zoneOf[src]))
				}
			}
		}
	}
	return found
}

// advertise has the nodes in gone advertise nothing and every other node
// its block, and waits until every node routes exactly the advertised
// blocks via their owners: a withdrawal that does not get through leaves
// a route behind.
func (zc *zoneCluster) advertise(t *testing.T, gone map[int]bool) {
	t.Helper()
	gone = maps.Clone(gone)
	if gone == nil {
		gone = map[int]bool{}
	}
	maps.Copy(gone, zc.dead)
	for i, n := range zc.nodes {
		if zc.dead[i] {
			continue
		}
		var ads []Advertisement
		if !gone[i] {
			ads = AdvertisementsOf([]netip.Prefix{blockOf(i)})
		}
		if err := n.sp.SetAdvertisements(context.Background(), ads); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(convergeTimeout)
	for i, n := range zc.nodes {
		if zc.dead[i] {
			continue
		}
		got, ok := n.watch.waitFor(deadline, func(rs []LearnedRoute) bool {
			want := 0
			for j, o := range zc.nodes {
				if j == i || gone[j] {
					continue
				}
				if want++; !hasRoute(rs, blockOf(j), o.addr) {
					return false
				}
			}
			return len(rs) == want
		})
		if !ok {
			var from []string // where each node holds the withdrawn blocks from
			for k, m := range zc.nodes {
				if zc.dead[k] {
					continue
				}
				for p, srcs := range pathSources(t, m) {
					if j := int(p.Addr().As4()[2]); gone[j] {
						from = append(from, fmt.Sprintf("%s: %s from %v", m.name, p, srcs))
					}
				}
			}
			t.Errorf("%s (zone %s) with nodes %v advertising nothing has:%s\nwithdrawn blocks' paths: %v", n.name, zc.layout[i].zone, slices.Sorted(maps.Keys(gone)), routesString(got), from)
		}
	}
}

// TestZoneReflectorRoutes runs real speakers peered as PlanPeers says for
// routeReflectorMode Auto, with the default routeReflectorPeering
// (NonClient) in three zones, a zone without reflectors, an elected
// reflector with its operator's cluster ID and a reflector chosen by hand:
// every node routes every other node's block via its owner (the
// reflectors' own blocks too), and loses it when the owner withdraws it,
// also after it came back; an elected reflector holds another zone's block
// only from that zone's reflectors. With Client (Calico's rule) in three
// zones that last check fails: the UPDATEs that zones multiplied
// (docs/scale.md, "Reflector zones at 1,000").
func TestZoneReflectorRoutes(t *testing.T) {
	t.Run("NonClient", func(t *testing.T) {
		zc := newZoneCluster(t, 40, mixedZones(), "", true)
		if found := zc.thirdZone(t); len(found) > 0 {
			t.Errorf("a reflector holds another zone's block from a third zone:\n%s", strings.Join(found, "\n"))
		}
		// A client of zone b, a reflector of zone c (its own block), zone
		// d's node, the manual reflector; then back; then gone again.
		gone := map[int]bool{8: true, 4: true, 12: true, 13: true}
		zc.advertise(t, gone)
		zc.advertise(t, nil)
		zc.advertise(t, gone)
		if found := zc.thirdZone(t); len(found) > 0 {
			t.Errorf("after the withdrawals a reflector holds another zone's block from a third zone:\n%s", strings.Join(found, "\n"))
		}
	})
	t.Run("Client", func(t *testing.T) {
		// Only that the check above can fail: with Calico's rule GoBGP
		// v4.8.0 loses and keeps routes in three zones (docs/bgp.md), so
		// nothing waits for the routes.
		zc := newZoneCluster(t, 41, plainZones("a", "b", "c"), api.ReflectorPeeringClient, false)
		deadline := time.Now().Add(convergeTimeout)
		for len(zc.thirdZone(t)) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("with Calico's rule no reflector holds another zone's block from a third zone")
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// TestReflectorPairWithdrawals: two reflectors chosen by hand with one
// cluster ID and their clients (manifests/route-reflectors): a client's
// withdrawn block leaves every node, also after it came back. GoBGP v4.8.0
// passes a client's route from one reflector to the other without a
// CLUSTER_LIST and may prefer that copy (a lower router ID); without
// OwnRoutesOnly the route stayed at both reflectors and the other clients
// (three runs of three, and two of three with one withdrawal only).
func TestReflectorPairWithdrawals(t *testing.T) {
	c := newCluster(t, 42, 6, func(i int, n *api.Node) {
		if i < 2 {
			n.Spec.BGP.RouteReflectorClusterID = "1.1.1.1"
			n.Metadata.Labels = map[string]string{"role": "rr"}
		}
	})
	c.configure(t, meshOff(), []*api.BGPPeer{
		bgpPeer("to-rr", api.BGPPeerSpec{NodeSelector: &api.LabelSelector{}, PeerSelector: sel("role", "rr")}),
	})
	zc := &zoneCluster{cluster: c, layout: make([]zoneNode, len(c.nodes))}
	for range 3 {
		zc.advertise(t, map[int]bool{2: true, 3: true})
		zc.advertise(t, nil)
	}
}

// TestReflectorPromotion replays TestAutoReflectors' replacement with real
// speakers (two zones, two elected reflectors each, two clients each): a
// reflector of zone a dies and leaves, and a client of zone a (node04) is
// elected in its place. node04 restarts its speaker with the zone's
// cluster ID, as the agent does, and every node peers by the new choice,
// but the sessions between node04 and zone b's reflectors are held back
// (they were what came up last in the lab). Meanwhile every node must
// route every other's block via its owner: zone a's other reflector
// (elected first) keeps node04 its client and sends it every route,
// since node04 has not reported its sessions ready. Sending it its own
// routes only at once (the reverted branch zonepeer) left node04 without
// zone b's blocks and zone b without node04's until those sessions came
// up: 33–36 pings lost in the lab. Then the sessions come up, node04
// reports ready, zone a's first reflector sends it its own routes only,
// and routes and withdrawals hold; node04 then has zone b's blocks from
// zone b's reflectors.
func TestReflectorPromotion(t *testing.T) {
	skipStaleRaceUnderDetector(t) // node04's speaker restarts gracefully
	zc := newZoneCluster(t, 43, plainZones("a", "b"), "", true)
	const victim, promoted = 0, 4
	ready := allReady(zc.choice)
	if err := zc.nodes[victim].sp.Stop(false); err != nil {
		t.Fatal(err)
	}
	// The victim's Node goes (the lab removes it); node04 is elected
	// later than node01.
	zc.dead = map[int]bool{victim: true}
	vname, pname := zc.nodes[victim].name, zc.nodes[promoted].name
	zc.api = slices.DeleteFunc(slices.Clone(zc.api), func(n *api.Node) bool { return n.Metadata.Name == vname })
	delete(ready, vname)
	zc.advertise(t, nil)
	zc.choice = &ReflectorChoice{Zones: map[string][]Reflector{
		"a": {zc.choice.Zones["a"][1], {Node: pname, ClusterID: ZoneClusterID("a"), Since: time.Now().UTC().Truncate(time.Second)}},
		"b": zc.choice.Zones["b"],
	}}
	marks := zc.marks()
	p := zc.restart(t, promoted, ZoneClusterID("a"))
	bRRs := []string{zc.nodes[2].name, zc.nodes[3].name}
	for i, n := range zc.nodes {
		var without []string
		switch {
		case zc.dead[i]:
			continue
		case n == p:
			without = bRRs
		case slices.Contains(bRRs, n.name):
			without = []string{pname}
		}
		zc.setPeers(t, n, ready, without)
	}
	zc.advertise(t, nil)
	zc.heldSince(t, marks, promoted, "promoted, its sessions to zone b's reflectors not yet up")
	if t.Failed() {
		t.FailNow()
	}
	// The sessions come up; node04 reports ready once they have.
	for i, n := range zc.nodes {
		if !zc.dead[i] {
			zc.setPeers(t, n, ready, nil)
		}
	}
	waitEstablished(t, p, 4, time.Now().Add(convergeTimeout))
	marks = zc.marks()
	ready[pname] = zc.choice.Zones["a"][1].Since
	for i, n := range zc.nodes {
		if !zc.dead[i] {
			zc.setPeers(t, n, ready, nil)
		}
	}
	zc.advertise(t, nil)
	// node01's withdrawals of what it reflected reach node04 after the
	// soft reset: poll.
	bAddrs := []netip.Addr{zc.nodes[2].addr, zc.nodes[3].addr}
	var copies []string
	for deadline := time.Now().Add(convergeTimeout); ; time.Sleep(50 * time.Millisecond) {
		copies = copies[:0]
		for prefix, from := range pathSources(t, p) {
			if zc.zoneOf[zc.nodes[prefix.Addr().As4()[2]].addr] != "b" {
				continue
			}
			for _, src := range from {
				if !slices.Contains(bAddrs, src) {
					copies = append(copies, fmt.Sprintf("%s (zone b) from %s", prefix, src))
				}
			}
		}
		if len(copies) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(copies) > 0 {
		t.Errorf("%s, reported ready, still holds zone b's blocks from other than zone b's reflectors: %v", pname, copies)
	}
	zc.heldSince(t, marks, -1, "reported ready")
	// A client of each zone and the new reflector's own block go, come
	// back and go again.
	gone := map[int]bool{promoted: true, 5: true, 6: true}
	zc.advertise(t, gone)
	zc.advertise(t, nil)
	zc.advertise(t, gone)
	zc.advertise(t, nil)

	// node04 is demoted (routeReflectorsPerZone lowered, say): zone b's
	// reflectors drop their sessions with it first; node01 had it as its
	// client all along and passes its block on.
	zc.choice = &ReflectorChoice{Zones: map[string][]Reflector{"a": zc.choice.Zones["a"][:1], "b": zc.choice.Zones["b"]}}
	marks = zc.marks()
	for _, i := range []int{2, 3} {
		zc.setPeers(t, zc.nodes[i], ready, nil)
	}
	zc.restart(t, promoted, "")
	for i, n := range zc.nodes {
		if !zc.dead[i] && i != 2 && i != 3 {
			zc.setPeers(t, n, ready, nil)
		}
	}
	zc.advertise(t, nil)
	zc.heldSince(t, marks, promoted, "demoted")
	zc.advertise(t, gone)
	zc.advertise(t, nil)
}

// restart replaces node i's speaker by one with clusterID, stopped and
// started gracefully as the agent does when the node's election changes,
// advertising its block at once (the agent's pass does so before the new
// sessions are up); its peers are the caller's to set.
func (zc *zoneCluster) restart(t *testing.T, i int, clusterID string) *testNode {
	t.Helper()
	old := zc.nodes[i]
	if err := old.sp.Stop(true); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, old.name, Config{RouterID: old.addr, ASN: api.DefaultASNumber, ListenAddr: old.addr, ListenPort: int32(zc.port),
		ClusterID: clusterID, GracefulRestart: true, RestartTime: 30 * time.Second, LocalRestarting: true})
	if err := n.sp.SetAdvertisements(context.Background(), AdvertisementsOf([]netip.Prefix{blockOf(i)})); err != nil {
		t.Fatal(err)
	}
	zc.nodes[i] = n
	return n
}

// marks is how many route sets each node's watch has received so far.
func (zc *zoneCluster) marks() []int {
	out := make([]int, len(zc.nodes))
	for i, n := range zc.nodes {
		out[i] = n.watch.count()
	}
	return out
}

// heldSince fails the test for each node (but skip, whose speaker
// restarted: its agent holds its kernel routes until BGP converges) that
// received a route set since marks lacking another live node's block via
// its owner: a route lost on the way, however briefly.
func (zc *zoneCluster) heldSince(t *testing.T, marks []int, skip int, what string) {
	t.Helper()
	for i, n := range zc.nodes {
		if zc.dead[i] || i == skip {
			continue
		}
		for k, rs := range n.watch.since(marks[i]) {
			var lacking []string
			for j, o := range zc.nodes {
				if j != i && !zc.dead[j] && !hasRoute(rs, blockOf(j), o.addr) {
					lacking = append(lacking, fmt.Sprintf("%s (%s)", blockOf(j), o.name))
				}
			}
			if len(lacking) > 0 {
				t.Errorf("%s: %s's route set %d since lacked %v", what, n.name, k+1, lacking)
				break
			}
		}
	}
}

// allReady is PeerInput.Ready with every reflector of c ready: the steady
// state, after every elected reflector reported its sessions.
func allReady(c *ReflectorChoice) map[string]time.Time {
	out := map[string]time.Time{}
	for _, rs := range c.Zones {
		for _, r := range rs {
			out[r.Node] = r.Since
		}
	}
	return out
}

// pathSources reads n's global RIB: per IPv4 prefix, the peers it holds a
// path from.
func pathSources(t *testing.T, n *testNode) map[netip.Prefix][]netip.Addr {
	t.Helper()
	out := map[netip.Prefix][]netip.Addr{}
	servers.RLock()
	err := n.sp.srv.ListPath(apiutil.ListPathRequest{TableType: gobgpapi.TableType_TABLE_TYPE_GLOBAL, Family: gobgp.RF_IPv4_UC},
		func(_ gobgp.NLRI, paths []*apiutil.Path) {
			for _, p := range paths {
				if nlri, ok := p.Nlri.(*gobgp.IPAddrPrefix); ok && p.PeerAddress.IsValid() && !p.Withdrawal {
					out[nlri.Prefix.Masked()] = append(out[nlri.Prefix.Masked()], p.PeerAddress)
				}
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
