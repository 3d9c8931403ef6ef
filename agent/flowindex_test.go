package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/flowlog"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/syncer"
	"github.com/tabbynet/tabby/syncer/syncertest"
)

// fullAddrIndex is the address index read from the whole view, as the
// flows owner rebuilt it on every change before it followed changes (its
// reindex), with the precedence rule of outranks: what the incremental
// index must equal.
func fullAddrIndex(v *syncer.Syncer, node string) map[netip.Addr]endpointInfo {
	m := map[netip.Addr]claim{}
	put := func(a netip.Addr, c claim) {
		a = a.Unmap()
		if cur, ok := m[a]; !ok || outranks(c, cur) {
			m[a] = c
		}
	}
	for _, n := range v.Nodes() {
		for _, p := range []func() (netip.Prefix, bool){n.IPv4, n.IPv6} {
			if a, ok := p(); ok {
				put(a.Addr(), claim{name: n.Metadata.Name, info: endpointInfo{ep: api.FlowEndpoint{Kind: api.FlowEndpointHost, Name: n.Metadata.Name}}})
			}
		}
	}
	for _, w := range v.Endpoints() {
		addrs, _ := w.Addrs()
		for _, a := range addrs {
			put(a, claim{name: w.Metadata.Name,
				info: flowPodInfo(w.Metadata.Namespace, w.Metadata.Name, w.Spec.Pod, w.Metadata.Labels, w.Spec.Node, node)})
		}
	}
	for _, r := range v.RemoteEndpoints() {
		addrs, _ := r.Addrs()
		for _, a := range addrs {
			put(a, claim{name: r.Name, info: flowPodInfo(r.Namespace, r.Name, r.Pod, r.Labels, r.Node, node)})
		}
	}
	out := make(map[netip.Addr]endpointInfo, len(m))
	for a, c := range m {
		out[a] = c.info
	}
	return out
}

// winners is what the index answers, address by address.
func (x *addrIndex) winners() map[netip.Addr]endpointInfo {
	x.mu.RLock()
	defer x.mu.RUnlock()
	out := make(map[netip.Addr]endpointInfo, len(x.cs.win))
	for a, c := range x.cs.win {
		out[a] = c.info
	}
	return out
}

// flowCluster is a small cluster whose records a test changes at random,
// fed to a view as watch events: few addresses, so that they collide
// (two pods, a pod and a node), endpoints that move between nodes (this
// one among them) and share pods.
type flowCluster struct {
	t   *testing.T
	rnd *rand.Rand
	src syncertest.Script
	rev int64
	kvs map[string]datastore.KV
}

func (c *flowCluster) addr() string {
	if c.rnd.IntN(8) == 0 {
		return fmt.Sprintf("fd00::%d", 1+c.rnd.IntN(4))
	}
	return fmt.Sprintf("10.244.0.%d", 1+c.rnd.IntN(12))
}

func (c *flowCluster) randomNode() *api.Node {
	n := &api.Node{Metadata: api.ObjectMeta{Name: fmt.Sprintf("n%d", c.rnd.IntN(4))}, Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{}}}
	if c.rnd.IntN(4) > 0 {
		n.Spec.BGP.IPv4Address = fmt.Sprintf("10.244.0.%d/24", 1+c.rnd.IntN(12))
	}
	if c.rnd.IntN(3) == 0 {
		n.Spec.BGP.IPv6Address = fmt.Sprintf("fd00::%d/64", 1+c.rnd.IntN(4))
	}
	return n
}

func (c *flowCluster) randomEndpoint() *api.WorkloadEndpoint {
	k := c.rnd.IntN(10)
	w := &api.WorkloadEndpoint{
		Metadata: api.ObjectMeta{Name: fmt.Sprintf("e%d", k), Namespace: []string{"a", "b"}[c.rnd.IntN(2)],
			Labels: map[string]string{"v": fmt.Sprint(c.rnd.IntN(3))}},
		Spec: api.WorkloadEndpointSpec{Node: fmt.Sprintf("n%d", c.rnd.IntN(3)), Orchestrator: "k8s", ContainerID: "c",
			Endpoint: "eth0", InterfaceName: fmt.Sprintf("cali%011x", k), IPNetworks: []string{c.addr() + "/32"}},
	}
	if c.rnd.IntN(3) > 0 {
		w.Spec.Pod = fmt.Sprintf("pod%d", k/2) // two endpoints of one pod
	}
	if c.rnd.IntN(4) == 0 {
		w.Spec.IPNetworks = append(w.Spec.IPNetworks, c.addr()+"/32")
	}
	w.SetDefaults()
	return w
}

func (c *flowCluster) record(obj api.Object) datastore.KV {
	key, err := datastore.ResourceKey(api.KindOf(obj), obj.GetMeta().Namespace, obj.GetMeta().Name)
	if err != nil {
		c.t.Fatal(err)
	}
	b, err := json.Marshal(obj)
	if err != nil {
		c.t.Fatal(err)
	}
	c.rev++
	return datastore.KV{Key: key, Value: b, ModRevision: c.rev}
}

// step makes one random change and returns the event that tells it.
func (c *flowCluster) step() datastore.Event {
	var obj api.Object = c.randomEndpoint()
	if c.rnd.IntN(4) == 0 {
		obj = c.randomNode()
	}
	kv := c.record(obj)
	switch r := c.rnd.IntN(10); {
	case r < 3: // a deletion (of a record that may not exist)
		delete(c.kvs, kv.Key)
		return datastore.Event{Type: datastore.EventDelete, KV: datastore.KV{Key: kv.Key, ModRevision: c.rev}, Revision: c.rev}
	case r == 3: // a re-list: what changed meanwhile, in one snapshot
		for range 3 {
			kv := c.record(c.randomEndpoint())
			c.kvs[kv.Key] = kv
		}
		for k := range c.kvs {
			if c.rnd.IntN(6) == 0 {
				delete(c.kvs, k)
			}
		}
		snap := make([]datastore.KV, 0, len(c.kvs))
		for _, kv := range c.kvs {
			snap = append(snap, kv)
		}
		return datastore.Event{Type: datastore.EventResync, Snapshot: snap, Revision: c.rev}
	default:
		c.kvs[kv.Key] = kv
		return datastore.Event{Type: datastore.EventPut, KV: kv, Revision: c.rev}
	}
}

// TestAddrIndexEqualsRebuild applies random sequences of changes to a view
// and checks, after each batch the flows owner takes, that the index it
// follows them with answers what reading the whole view gives, also when
// a rebuild already read some of the changes it then applies.
func TestAddrIndexEqualsRebuild(t *testing.T) {
	const node = "n0"
	for seed := range uint64(40) {
		c := &flowCluster{t: t, rnd: rand.New(rand.NewPCG(seed, 29)), src: make(syncertest.Script), kvs: map[string]datastore.KV{}}
		v := syncertest.Start(t, c.src, quietLog(), false)
		v.CompactRemote(node)
		fs := watchFlowFeeds(v)
		x := newAddrIndex(node)
		c.rev = 1
		c.src <- datastore.Event{Type: datastore.EventResync, Revision: 1}
		if err := v.WaitSynced(t.Context()); err != nil {
			t.Fatal(err)
		}
		x.start(v, fs)
		for i := range 60 {
			for range 1 + c.rnd.IntN(5) {
				c.src <- c.step()
			}
			if err := v.WaitRevision(t.Context(), c.rev); err != nil {
				t.Fatal(err)
			}
			if c.rnd.IntN(3) == 0 {
				// A rebuild that read the view after these changes, which
				// the feeds still hold (follow's take before a rebuild, the
				// changes arriving between it and the read), then more:
				// the next follow applies changes the index already has.
				x.rebuild(v)
				for range c.rnd.IntN(4) {
					c.src <- c.step()
				}
				if err := v.WaitRevision(t.Context(), c.rev); err != nil {
					t.Fatal(err)
				}
			}
			if _, rebuilt := x.follow(v, fs); rebuilt {
				t.Fatalf("seed %d step %d: rebuilt, want the changes", seed, i)
			}
			if diff := cmp.Diff(fullAddrIndex(v, node), x.winners(), cmp.AllowUnexported(endpointInfo{})); diff != "" {
				t.Fatalf("seed %d step %d: index differs from a rebuild (-rebuild +index):\n%s", seed, i, diff)
			}
		}
	}
}

// TestAddrIndexCases walks through the cases by name: an address that
// moves from one pod to another, a node's address change, an endpoint
// moving to this node, deletions.
func TestAddrIndexCases(t *testing.T) {
	const node = "n0"
	c := &flowCluster{t: t, src: make(syncertest.Script), kvs: map[string]datastore.KV{}, rev: 1}
	v := syncertest.Start(t, c.src, quietLog(), false)
	v.CompactRemote(node)
	fs := watchFlowFeeds(v)
	x := newAddrIndex(node)
	c.src <- datastore.Event{Type: datastore.EventResync, Revision: 1}
	if err := v.WaitSynced(t.Context()); err != nil {
		t.Fatal(err)
	}
	x.start(v, fs)
	wep := func(name, on, addr string) *api.WorkloadEndpoint {
		w := &api.WorkloadEndpoint{Metadata: api.ObjectMeta{Name: name, Namespace: "ns"},
			Spec: api.WorkloadEndpointSpec{Node: on, Orchestrator: "k8s", Pod: name, ContainerID: "c", Endpoint: "eth0",
				InterfaceName: "cali" + name, IPNetworks: []string{addr + "/32"}}}
		w.SetDefaults()
		return w
	}
	put := func(obj api.Object) {
		kv := c.record(obj)
		c.src <- datastore.Event{Type: datastore.EventPut, KV: kv, Revision: c.rev}
	}
	del := func(obj api.Object) {
		kv := c.record(obj)
		c.src <- datastore.Event{Type: datastore.EventDelete, KV: datastore.KV{Key: kv.Key, ModRevision: c.rev}, Revision: c.rev}
	}
	nodeAt := func(addr string) *api.Node {
		return &api.Node{Metadata: api.ObjectMeta{Name: "n1"}, Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: addr + "/24"}}}
	}
	type want struct {
		addr, name string
		local      bool
	}
	for _, tc := range []struct {
		what   string
		change func()
		want   []want // "" name: external
	}{
		{"a remote pod", func() { put(wep("a", "n1", "10.244.1.1")) }, []want{{"10.244.1.1", "a", false}}},
		{"its address taken by another pod first", func() { put(wep("b", "n2", "10.244.1.1")) }, []want{{"10.244.1.1", "b", false}}},
		{"the first released", func() { del(wep("a", "n1", "10.244.1.1")) }, []want{{"10.244.1.1", "b", false}}},
		{"the second moves on", func() { put(wep("b", "n2", "10.244.1.2")) }, []want{{"10.244.1.1", "", false}, {"10.244.1.2", "b", false}}},
		{"it moves to this node", func() { put(wep("b", node, "10.244.1.2")) }, []want{{"10.244.1.2", "b", true}}},
		{"a node", func() { put(nodeAt("198.18.0.1")) }, []want{{"198.18.0.1", "n1", false}}},
		{"its address changes", func() { put(nodeAt("198.18.0.2")) }, []want{{"198.18.0.1", "", false}, {"198.18.0.2", "n1", false}}},
		{"it is deleted", func() { del(nodeAt("198.18.0.2")) }, []want{{"198.18.0.2", "", false}}},
		{"the pod is deleted", func() { del(wep("b", node, "10.244.1.2")) }, []want{{"10.244.1.2", "", false}}},
	} {
		tc.change()
		if err := v.WaitRevision(t.Context(), c.rev); err != nil {
			t.Fatal(err)
		}
		x.follow(v, fs)
		for _, w := range tc.want {
			e, ok := x.lookup(netip.MustParseAddr(w.addr))
			if got := e.ep.Name; got != w.name || ok != (w.name != "") || e.local != w.local {
				t.Errorf("%s: %s is %q (found %v, local %v), want %q (local %v)", tc.what, w.addr, got, ok, e.local, w.name, w.local)
			}
		}
	}
}

// TestAddrIndexLostTrack: more changes than a feed keeps between two
// takes make the next one read the whole view, which is then right.
func TestAddrIndexLostTrack(t *testing.T) {
	const node = "n0"
	c := &flowCluster{t: t, rnd: rand.New(rand.NewPCG(7, 29)), src: make(syncertest.Script), kvs: map[string]datastore.KV{}, rev: 1}
	v := syncertest.Start(t, c.src, quietLog(), false)
	v.CompactRemote(node)
	fs := watchFlowFeeds(v)
	x := newAddrIndex(node)
	c.src <- datastore.Event{Type: datastore.EventResync, Revision: 1}
	if err := v.WaitSynced(t.Context()); err != nil {
		t.Fatal(err)
	}
	x.start(v, fs)
	for i := range 5000 {
		w := c.randomEndpoint()
		w.Metadata.Name, w.Spec.Node = fmt.Sprintf("e%d", i%3000), "n1"
		kv := c.record(w)
		c.src <- datastore.Event{Type: datastore.EventPut, KV: kv, Revision: c.rev}
	}
	if err := v.WaitRevision(t.Context(), c.rev); err != nil {
		t.Fatal(err)
	}
	if _, rebuilt := x.follow(v, fs); !rebuilt {
		t.Fatal("5,000 changes in one take: not rebuilt")
	}
	if diff := cmp.Diff(fullAddrIndex(v, node), x.winners(), cmp.AllowUnexported(endpointInfo{})); diff != "" {
		t.Fatalf("index differs from a rebuild (-rebuild +index):\n%s", diff)
	}
}

// BenchmarkFlowIndexRemoteEvent is what a pod event on another node costs
// the flows owner's address index in the cluster of
// BenchmarkPolicyRemotePodAdd (30,000 endpoints on 1,000 nodes, this node
// node0): "rebuild" reads the whole view again on every event, as the
// owner did before it followed changes (fullAddrIndex, its reindex);
// "incremental" applies the event's change (addrIndex.follow). The events
// delete and add again remote endpoints, as the scale harness's churn.
// owner-µs/event is the owner's work alone, after the view applied the
// event (the view's own cost, the same for both, is in ns/op). Run it with
// a fixed count: -benchtime=400x.
func BenchmarkFlowIndexRemoteEvent(b *testing.B) {
	kvs, err := scaleSnapshot(scaleNodes)
	if err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"rebuild", "incremental"} {
		b.Run(mode, func(b *testing.B) {
			ctx := b.Context()
			src := make(syncertest.Script)
			v := syncertest.Start(b, src, quietLog(), false)
			v.CompactRemote(scaleNode(0))
			fs := watchFlowFeeds(v)
			x := newAddrIndex(scaleNode(0))
			src <- datastore.Event{Type: datastore.EventResync, Snapshot: kvs, Revision: 1}
			if err := v.WaitSynced(ctx); err != nil {
				b.Fatal(err)
			}
			x.start(v, fs)
			var published atomic.Pointer[map[netip.Addr]endpointInfo]
			// Each remote endpoint in turn, deleted and then added back.
			events := make([]datastore.Event, b.N)
			for i := range events {
				n, k := 1+i/2%(scaleNodes-1), i/2/(scaleNodes-1)%scaleEpsPerNode
				w := scaleWEP(n, k, map[string]string{"app": fmt.Sprintf("svc-%d", k%100), "role": fmt.Sprintf("r-%d", k%50)})
				key, _ := datastore.ResourceKey(api.KindWorkloadEndpoint, w.Metadata.Namespace, w.Metadata.Name)
				rev := int64(2 + i)
				if i%2 == 0 {
					events[i] = datastore.Event{Type: datastore.EventDelete, KV: datastore.KV{Key: key, ModRevision: rev}, Revision: rev}
					continue
				}
				val, err := json.Marshal(w)
				if err != nil {
					b.Fatal(err)
				}
				events[i] = datastore.Event{Type: datastore.EventPut, KV: datastore.KV{Key: key, Value: val, ModRevision: rev}, Revision: rev}
			}
			var owner time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				src <- events[i]
				if err := v.WaitRevision(ctx, events[i].Revision); err != nil {
					b.Fatal(err)
				}
				t0 := time.Now()
				if mode == "rebuild" {
					m := fullAddrIndex(v, scaleNode(0))
					published.Store(&m)
				} else if n, rebuilt := x.follow(v, fs); n != 1 || rebuilt {
					b.Fatalf("event %d: followed %d changes (rebuilt %v), want 1", i, n, rebuilt)
				}
				owner += time.Since(t0)
			}
			b.StopTimer()
			b.ReportMetric(float64(owner.Nanoseconds())/1e3/float64(b.N), "owner-µs/event")
		})
	}
}

// BenchmarkFlowIndexLookup is Endpoint's read: "atomic-map" a load of an
// immutable map's pointer, as before; "rwlock" the incremental index's
// read lock. serial reads on one goroutine (the usual case: the
// aggregator's two sources rarely read at the same instant), parallel on
// two per CPU at once (the read lock's counter shared between CPUs).
func BenchmarkFlowIndexLookup(b *testing.B) {
	v := scaleView(b)
	x := newAddrIndex(scaleNode(0))
	x.rebuild(v)
	m := fullAddrIndex(v, scaleNode(0))
	var published atomic.Pointer[map[netip.Addr]endpointInfo]
	published.Store(&m)
	addrs := make([]netip.Addr, 0, 1024)
	for a := range m {
		if addrs = append(addrs, a); len(addrs) == cap(addrs) {
			break
		}
	}
	read := map[string]func(netip.Addr) bool{
		"atomic-map": func(a netip.Addr) bool { _, ok := (*published.Load())[a]; return ok },
		"rwlock":     func(a netip.Addr) bool { _, ok := x.lookup(a); return ok },
	}
	for _, how := range []string{"atomic-map", "rwlock"} {
		found := read[how]
		b.Run(how+"/serial", func(b *testing.B) {
			i := 0
			for b.Loop() {
				if !found(addrs[i%len(addrs)]) {
					b.Fatal("not found")
				}
				i++
			}
		})
		b.Run(how+"/parallel", func(b *testing.B) {
			b.SetParallelism(2)
			b.RunParallel(func(pb *testing.PB) {
				for i := 0; pb.Next(); i++ {
					if !found(addrs[i%len(addrs)]) {
						b.Error("not found")
						return
					}
				}
			})
		})
	}
}

// TestFlowOwnerFollowsView: the flows owner's loop indexes what the view
// holds when it starts and follows each change after, through Endpoint.
func TestFlowOwnerFollowsView(t *testing.T) {
	const node = "n0"
	c := &flowCluster{t: t, src: make(syncertest.Script), kvs: map[string]datastore.KV{}, rev: 1}
	v := syncertest.Start(t, c.src, quietLog(), false)
	v.CompactRemote(node)
	cfg := flowlog.Default()
	cfg.Mode = flowlog.ModeDeny
	f := newFlowOwner(cfg, node, v, FlowSources{}, quietLog())
	w := &api.WorkloadEndpoint{Metadata: api.ObjectMeta{Name: "w", Namespace: "ns"},
		Spec: api.WorkloadEndpointSpec{Node: "n1", Orchestrator: "k8s", Pod: "p", ContainerID: "c", Endpoint: "eth0",
			InterfaceName: "caliw", IPNetworks: []string{"10.244.3.1/32"}}}
	w.SetDefaults()
	c.src <- datastore.Event{Type: datastore.EventResync, Snapshot: []datastore.KV{c.record(w)}, Revision: c.rev}
	if err := v.WaitSynced(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); f.run(ctx) }()
	defer func() { cancel(); <-done }()
	resolves := func(addr, name string) {
		t.Helper()
		testkit.Eventually(t, 10*time.Second, addr+" resolved to "+name, func() error {
			ep, _ := f.Endpoint(netip.MustParseAddr(addr))
			if ep.Name != name {
				return fmt.Errorf("%s is %+v", addr, ep)
			}
			return nil
		})
	}
	resolves("10.244.3.1", "p")
	w.Spec.IPNetworks = []string{"10.244.3.2/32"}
	kv := c.record(w)
	c.src <- datastore.Event{Type: datastore.EventPut, KV: kv, Revision: c.rev}
	resolves("10.244.3.2", "p")
	resolves("10.244.3.1", "")
}

// BenchmarkFlowIndexHeap is the heap an address index holds at 30,000
// endpoints (the cluster of BenchmarkPolicyRemotePodAdd), after a full GC:
// "map" the immutable map the owner rebuilt before, "index" the
// incremental one; heap-B/address.
func BenchmarkFlowIndexHeap(b *testing.B) {
	v := scaleView(b)
	build := map[string]func() (any, int){
		"map": func() (any, int) { m := fullAddrIndex(v, scaleNode(0)); return m, len(m) },
		"index": func() (any, int) {
			x := newAddrIndex(scaleNode(0))
			x.rebuild(v)
			return x, len(x.cs.win)
		},
	}
	for _, what := range []string{"map", "index"} {
		b.Run(what, func(b *testing.B) {
			var heap, addrs int
			for b.Loop() {
				before := testkit.HeapAfterGC()
				idx, n := build[what]()
				heap, addrs = int(testkit.HeapAfterGC()-before), n
				runtime.KeepAlive(idx)
			}
			b.ReportMetric(float64(heap)/float64(addrs), "heap-B/address")
		})
	}
}

// scaleView is a view of node0 holding the cluster of
// BenchmarkPolicyRemotePodAdd (30,000 endpoints), synced.
func scaleView(b *testing.B) *syncer.Syncer {
	b.Helper()
	kvs, err := scaleSnapshot(scaleNodes)
	if err != nil {
		b.Fatal(err)
	}
	src := make(syncertest.Script)
	v := syncertest.Start(b, src, quietLog(), false)
	v.CompactRemote(scaleNode(0))
	src <- datastore.Event{Type: datastore.EventResync, Snapshot: kvs, Revision: 1}
	if err := v.WaitSynced(b.Context()); err != nil {
		b.Fatal(err)
	}
	return v
}
