package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tabbynet/tabby/agent/routetable"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/syncer/syncertest"
)

// cluster is the test's model of etcd: what is stored, and the desired
// state computed from it from scratch, without the view.
type cluster struct {
	t   *testing.T
	kvs map[string]datastore.KV
	rev int64
}

func (c *cluster) put(key string, v any) datastore.Event {
	b, err := json.Marshal(v)
	if err != nil {
		c.t.Fatal(err)
	}
	c.rev++
	kv := datastore.KV{Key: key, Value: b, ModRevision: c.rev}
	c.kvs[key] = kv
	return datastore.Event{Type: datastore.EventPut, KV: kv, Revision: c.rev}
}

func (c *cluster) del(key string) (datastore.Event, bool) {
	if _, ok := c.kvs[key]; !ok {
		return datastore.Event{}, false
	}
	delete(c.kvs, key)
	c.rev++
	return datastore.Event{Type: datastore.EventDelete, KV: datastore.KV{Key: key, ModRevision: c.rev}, Revision: c.rev}, true
}

func (c *cluster) putObj(obj api.Object) datastore.Event {
	obj.SetDefaults()
	key, err := datastore.ResourceKey(obj.GetTypeMeta().Kind, obj.GetMeta().Namespace, obj.GetMeta().Name)
	if err != nil {
		c.t.Fatal(err)
	}
	return c.put(key, obj)
}

// desired computes the node's routes, peers and advertisements from the
// stored records alone.
func (c *cluster) desired(node string) (routes []dataplane.Route, peers []bgp.Peer, adv []netip.Prefix) {
	var (
		nodes    []*api.Node
		bgpPeers []*api.BGPPeer
		weps     []*api.WorkloadEndpoint
		pools    []*api.IPPool
		sums     []ipam.BlockSummary
	)
	bc := &api.BGPConfiguration{Metadata: api.ObjectMeta{Name: api.SingletonName}}
	confirmed := map[string]bool{}
	keys := make([]string, 0, len(c.kvs))
	for k := range c.kvs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		kv := c.kvs[k]
		switch {
		case strings.HasPrefix(k, ipam.BlockSummariesPrefix):
			s, err := ipam.DecodeSummaryRecord(k, kv.Value)
			if err != nil {
				c.t.Fatal(err)
			}
			sums = append(sums, s)
		case strings.HasPrefix(k, ipam.AffinitiesPrefix):
			a, err := ipam.DecodeAffinity(k, kv.Value)
			if err != nil {
				c.t.Fatal(err)
			}
			confirmed[a.Node+"|"+a.Block.String()] = a.Confirmed
		default:
			obj, err := datastore.DecodeResource(kv)
			if err != nil {
				c.t.Fatal(err)
			}
			switch o := obj.(type) {
			case *api.Node:
				nodes = append(nodes, o)
			case *api.BGPPeer:
				bgpPeers = append(bgpPeers, o)
			case *api.WorkloadEndpoint:
				weps = append(weps, o)
			case *api.IPPool:
				pools = append(pools, o)
			case *api.BGPConfiguration:
				bc = o
			}
		}
	}
	bc.SetDefaults()
	noExport := func(p netip.Prefix) bool {
		for _, pl := range pools {
			if pc := netip.MustParsePrefix(pl.Spec.CIDR); pc.Contains(p.Addr()) {
				return pl.Spec.DisableBGPExport
			}
		}
		return false
	}
	var infos []ipam.BlockInfo
	var borrowed []ipam.BorrowedAddr
	for _, s := range sums {
		infos = append(infos, ipam.BlockInfo{CIDR: s.CIDR, Affinity: s.Affinity, Confirmed: confirmed[s.Affinity+"|"+s.CIDR.String()], DisableBGPExport: noExport(s.CIDR)})
		for _, b := range s.Borrowed {
			b.DisableBGPExport = noExport(s.CIDR)
			borrowed = append(borrowed, b)
		}
	}
	routes = desiredLocalRoutes(node, weps, infos)
	peers = bgp.DesiredPeers(node, nodes, bc, bgpPeers, nil)
	affine, bor := bgpBlocks(node, infos, borrowed)
	adv = bgp.DesiredAdvertisements(affine, bor)
	return routes, peers, adv
}

// blockRecord writes a valid IPAM block record: owners maps ordinals to
// the node using them.
func blockRecord(cidr netip.Prefix, affinity string, owners map[int]string) map[string]any {
	// The view reads a block's summary record (ipam/block-summaries/):
	// its affinity and the addresses other nodes borrowed from it.
	var borrowed []map[string]any
	for ord := range 1 << (32 - cidr.Bits()) {
		if n, ok := owners[ord]; ok && n != affinity {
			a := cidr.Addr().As4()
			a[3] += byte(ord)
			borrowed = append(borrowed, map[string]any{"addr": netip.AddrFrom4(a).String(), "node": n})
		}
	}
	r := map[string]any{"cidr": cidr.String(), "borrowed": borrowed}
	if affinity != "" {
		r["affinity"] = "host:" + affinity
	}
	return r
}

// TestOwnersFollowShuffledUpdates replays random sequences of cluster
// changes (nodes joining and leaving, blocks claimed, released and lent,
// claims confirmed, endpoints added and removed, peers and configuration
// changed) into the view and, after each, checks that the route and BGP
// owners were woken whenever their desired state changed, and that after
// their passes the kernel's routes and the speaker's peers and
// advertisements equal the pure desired functions of the stored records.
func TestOwnersFollowShuffledUpdates(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) { replay(t, seed, 150) })
	}
}

func replay(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, 42))
	const self = "node1"
	c := &cluster{t: t, kvs: map[string]datastore.KV{}}
	src := make(syncertest.Script)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	v := syncertest.Start(t, src, testLogger(), false)
	src <- datastore.Event{Type: datastore.EventResync, Revision: 0}
	if err := v.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	kernel := fake.NewRoutes()
	sp := newFakeSpeaker()
	table := routetable.New(kernel, 0)
	ro := newRouteOwner(self, v, table, testLogger())
	bo := newBGPOwner(self, netip.MustParsePrefix("198.18.0.11/24"), v, table, sp, nil, time.Minute, newMetrics(), testLogger())
	bo.speakerCfg = bgp.Config{ASN: api.DefaultASNumber}
	nodes := []string{"node1", "node2", "node3"}
	blocks := []netip.Prefix{
		netip.MustParsePrefix("10.244.0.0/30"), netip.MustParsePrefix("10.244.0.4/30"),
		netip.MustParsePrefix("10.244.0.8/30"), netip.MustParsePrefix("10.244.1.0/30"),
	}
	pick := func(xs []string) string { return xs[rng.IntN(len(xs))] }

	step := func(i int) (datastore.Event, string, bool) {
		switch rng.IntN(9) {
		case 0: // a node joins or changes
			n := pick(nodes)
			return c.putObj(&api.Node{Metadata: api.ObjectMeta{Name: n}, Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{
				IPv4Address: fmt.Sprintf("198.18.0.%d/24", 11+slices.Index(nodes, n))}}}), "put node " + n, true
		case 1: // a node leaves
			n := pick(nodes[1:])
			key, _ := datastore.ResourceKey(api.KindNode, "", n)
			ev, ok := c.del(key)
			return ev, "delete node " + n, ok
		case 2: // a block is claimed, changes hands, or lends addresses
			b := blocks[rng.IntN(len(blocks))]
			aff := pick([]string{"", "node1", "node2"})
			owners := map[int]string{}
			for ord := range 4 {
				if rng.IntN(3) == 0 {
					owners[ord] = pick(nodes)
				}
			}
			return c.put(ipam.BlockSummariesPrefix+strings.Replace(b.String(), "/", "-", 1), blockRecord(b, aff, owners)), fmt.Sprintf("put block %s affine to %q lending %v", b, aff, owners), true
		case 3: // a block is released
			b := blocks[rng.IntN(len(blocks))]
			ev, ok := c.del(ipam.BlockSummariesPrefix + strings.Replace(b.String(), "/", "-", 1))
			return ev, "delete block " + b.String(), ok
		case 4: // a claim is written or confirmed
			n, b := pick(nodes[:2]), blocks[rng.IntN(len(blocks))]
			state := pick([]string{"confirmed", "pending"})
			return c.put(ipam.AffinitiesPrefix+n+"/"+strings.Replace(b.String(), "/", "-", 1), map[string]string{"state": state}),
				fmt.Sprintf("claim %s by %s %s", b, n, state), true
		case 5: // a claim goes
			n, b := pick(nodes[:2]), blocks[rng.IntN(len(blocks))]
			ev, ok := c.del(ipam.AffinitiesPrefix + n + "/" + strings.Replace(b.String(), "/", "-", 1))
			return ev, fmt.Sprintf("unclaim %s by %s", b, n), ok
		case 6: // an endpoint comes or moves
			i := rng.IntN(4)
			w := fmt.Sprintf("w%d", i)
			n := pick(nodes[:2])
			addr := fmt.Sprintf("10.244.0.%d", i+4*rng.IntN(3)) // IPAM never gives two endpoints one address
			return c.putObj(&api.WorkloadEndpoint{Metadata: api.ObjectMeta{Namespace: "default", Name: w}, Spec: api.WorkloadEndpointSpec{
					Node: n, Orchestrator: "cni", Pod: w, ContainerID: w, Endpoint: "eth0", InterfaceName: "cali" + w, IPNetworks: []string{addr + "/32"}}}),
				fmt.Sprintf("put endpoint %s on %s at %s", w, n, addr), true
		case 7: // an endpoint goes
			w := fmt.Sprintf("w%d", rng.IntN(4))
			key, _ := datastore.ResourceKey(api.KindWorkloadEndpoint, "default", w)
			ev, ok := c.del(key)
			return ev, "delete endpoint " + w, ok
		default: // peers, pools and configuration change
			switch rng.IntN(4) {
			case 0:
				return c.putObj(&api.BGPPeer{Metadata: api.ObjectMeta{Name: "tor"}, Spec: api.BGPPeerSpec{PeerIP: "198.18.0.1", ASNumber: 65000}}), "put peer", true
			case 1:
				key, _ := datastore.ResourceKey(api.KindBGPPeer, "", "tor")
				ev, ok := c.del(key)
				return ev, "delete peer", ok
			case 2:
				mesh := rng.IntN(2) == 0
				return c.putObj(&api.BGPConfiguration{Metadata: api.ObjectMeta{Name: api.SingletonName}, Spec: api.BGPConfigurationSpec{NodeToNodeMeshEnabled: &mesh}}), fmt.Sprintf("mesh %v", mesh), true
			default:
				off := rng.IntN(2) == 0
				return c.putObj(&api.IPPool{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", BlockSize: 30, DisableBGPExport: off}}), fmt.Sprintf("pool disableBGPExport %v", off), true
			}
		}
	}

	var history []string
	wantR, wantP, wantA := c.desired(self)
	for i := range steps {
		ev, what, ok := step(i)
		if !ok {
			continue
		}
		history = append(history, what)
		drain(ro.sub.C())
		drain(bo.sub.C())
		src <- ev
		if err := v.WaitRevision(ctx, ev.Revision); err != nil {
			t.Fatal(err)
		}
		r, p, a := c.desired(self)
		routesChanged := !cmp.Equal(r, wantR, cmpNetip)
		bgpChanged := !cmp.Equal(p, wantP, cmpNetip) || !cmp.Equal(a, wantA, cmpNetip)
		wantR, wantP, wantA = r, p, a
		routesWoken, bgpWoken := woken(ro.sub.C()), woken(bo.sub.C())
		if routesChanged && !routesWoken {
			t.Fatalf("after %q the desired routes changed but the route owner was not woken; history:\n%s", what, strings.Join(history, "\n"))
		}
		if bgpChanged && !bgpWoken {
			t.Fatalf("after %q the desired peers or advertisements changed but the BGP owner was not woken; history:\n%s", what, strings.Join(history, "\n"))
		}
		if routesWoken {
			if err := ro.pass(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if bgpWoken {
			if err := bo.pass(ctx); err != nil {
				t.Fatal(err)
			}
		}
		got, err := kernel.List(dataplane.RouteProtoWorkload)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(normalized(wantR), normalized(got), cmpNetip); diff != "" {
			t.Fatalf("after %q kernel routes differ from desired (-want +got):\n%s\nhistory:\n%s", what, diff, strings.Join(history, "\n"))
		}
		sp.mu.Lock()
		gotP, gotA := slices.Clone(sp.peers), slices.Clone(sp.advertised)
		sp.mu.Unlock()
		if diff := cmp.Diff(wantP, gotP, cmpNetip, cmpEmpty); diff != "" {
			t.Fatalf("after %q peers differ (-want +got):\n%s\nhistory:\n%s", what, diff, strings.Join(history, "\n"))
		}
		if diff := cmp.Diff(wantA, gotA, cmpNetip, cmpEmpty); diff != "" {
			t.Fatalf("after %q advertisements differ (-want +got):\n%s\nhistory:\n%s", what, diff, strings.Join(history, "\n"))
		}
	}
}

var (
	cmpNetip = cmpopts.EquateComparable(netip.Prefix{}, netip.Addr{})
	cmpEmpty = cmp.FilterValues(func(x, y any) bool {
		return isEmptySlice(x) && isEmptySlice(y)
	}, cmp.Comparer(func(_, _ any) bool { return true }))
)

func isEmptySlice(v any) bool {
	switch s := v.(type) {
	case []bgp.Peer:
		return len(s) == 0
	case []netip.Prefix:
		return len(s) == 0
	}
	return false
}

func normalized(rs []dataplane.Route) []dataplane.Route {
	out := make([]dataplane.Route, 0, len(rs))
	for _, r := range rs {
		r = r.Normalized()
		r.Proto = dataplane.RouteProtoWorkload
		out = append(out, r)
	}
	return sortRoutes(out)
}

func woken(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
