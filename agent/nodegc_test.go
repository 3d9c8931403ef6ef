package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/ipam"
)

// gcEnv is node GC over a real etcd with a pool, two nodes (node1 and
// gone), one address (handle h1) and one endpoint of gone, and a clock the
// test moves.
type gcEnv struct {
	store *datastore.Store
	ipam  *ipam.Allocator
	gc    *nodeGC
	now   time.Time
	gcs   []*nodeGC // every nodeGC made, one per simulated agent (re)start
}

func newGCEnv(t *testing.T) *gcEnv {
	t.Helper()
	ctx := context.Background()
	store := storetest.New(t)
	if _, err := store.Create(ctx, &api.IPPool{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/24", BlockSize: 28}}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"node1", "gone"} {
		if _, err := store.Create(ctx, &api.Node{Metadata: api.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	al := ipam.New(store)
	asg, err := al.Assign(ctx, ipam.AssignRequest{Node: "gone", Handle: "h1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Create(ctx, testWEP("gone", "ns1", "web", "cali0000000gone", asg.Addr.String(), map[string]string{"app": "web"})); err != nil {
		t.Fatal(err)
	}
	e := &gcEnv{store: store, ipam: al, now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	e.restart(t)
	return e
}

// restart makes a new nodeGC over a new view, as an agent restart does.
func (e *gcEnv) restart(t *testing.T, opts ...ipam.Option) {
	t.Helper()
	v := startView(t, e.store)
	e.gc = newNodeGC(v, e.store, ipam.New(e.store, opts...), DefaultNodeGCGrace, testLogger())
	e.gc.now = func() time.Time { return e.now }
	e.gcs = append(e.gcs, e.gc)
}

// passUntil runs GC passes until cond holds (the view follows etcd a few
// milliseconds behind) or fails after a deadline.
func (e *gcEnv) passUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := e.gc.pass(context.Background()); err != nil {
			t.Fatal(err)
		}
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// passes runs n passes that must not fail.
func (e *gcEnv) passes(t *testing.T, n int) {
	t.Helper()
	for range n {
		if err := e.gc.pass(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

func (e *gcEnv) affine(t *testing.T, node string) int {
	t.Helper()
	blocks, err := e.ipam.Blocks(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, b := range blocks {
		if b.Affinity == node {
			n++
		}
	}
	return n
}

func (e *gcEnv) held(t *testing.T) int {
	t.Helper()
	addrs, err := e.ipam.AddressesByHandle(context.Background(), "h1")
	if err != nil {
		t.Fatal(err)
	}
	return len(addrs)
}

func (e *gcEnv) endpointsOf(t *testing.T, node string) int {
	t.Helper()
	objs, _, err := e.store.List(context.Background(), api.KindWorkloadEndpoint, "")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, o := range objs {
		if o.(*api.WorkloadEndpoint).Spec.Node == node {
			n++
		}
	}
	return n
}

func (e *gcEnv) record(t *testing.T, node string) bool {
	t.Helper()
	_, err := e.store.GetKV(context.Background(), datastore.NodeGCKey(node))
	if err != nil && !errors.Is(err, datastore.ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

// intact says the node's endpoint, block and address are all there.
func (e *gcEnv) intact(t *testing.T, node string) bool {
	return e.affine(t, node) > 0 && e.held(t) == 1 && e.endpointsOf(t, node) == 1
}

// released says everything of the node is gone, once, and IPAM is clean.
func (e *gcEnv) released(t *testing.T, node string) bool {
	t.Helper()
	if e.affine(t, node) != 0 || e.held(t) != 0 || e.endpointsOf(t, node) != 0 || e.record(t, node) {
		return false
	}
	rep, err := e.ipam.Check(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Errorf("ipam check after node gc: %+v", rep)
	}
	return true
}

func (e *gcEnv) setLiveness(t *testing.T, node string, on bool) {
	t.Helper()
	ctx := context.Background()
	var err error
	if on {
		_, err = e.store.PutKV(ctx, datastore.NodeLivenessKey(node), []byte(`{}`), 0)
	} else {
		err = e.store.DeleteKV(ctx, datastore.NodeLivenessKey(node), 0)
	}
	if err != nil && !errors.Is(err, datastore.ErrNotFound) {
		t.Fatal(err)
	}
}

func (e *gcEnv) deleteNode(t *testing.T, node string) {
	t.Helper()
	if err := e.store.Delete(context.Background(), api.KindNode, "", node, ""); err != nil {
		t.Fatal(err)
	}
}

// A deleted node is released only after the grace, counted from a record
// in etcd that agent restarts do not reset; then its endpoints, addresses,
// handles, blocks and affinities all go, and its record.
func TestNodeGCGraceSurvivesRestarts(t *testing.T) {
	e := newGCEnv(t)
	e.passes(t, 2)
	if !e.intact(t, "gone") || e.record(t, "gone") {
		t.Fatal("a live node was touched")
	}
	e.deleteNode(t, "gone")
	e.passUntil(t, "the gone record", func() bool { return e.record(t, "gone") })
	if !e.intact(t, "gone") {
		t.Fatal("released before the grace")
	}
	// Restarts through the grace: none starts the grace again.
	for range 2 {
		e.now = e.now.Add(DefaultNodeGCGrace / 3)
		e.restart(t)
		e.passes(t, 2)
		if !e.intact(t, "gone") {
			t.Fatal("released before the grace")
		}
	}
	e.now = e.now.Add(DefaultNodeGCGrace/3 + time.Second)
	e.restart(t)
	e.passUntil(t, "the node released", func() bool { return e.released(t, "gone") })
	total := 0
	for _, g := range e.gcs {
		total += g.released
	}
	if total != 1 {
		t.Errorf("the node was released %d times, want once", total)
	}
	e.passes(t, 2)
	if e.gc.released != 1 {
		t.Errorf("released again: %d", e.gc.released)
	}
	if e.affine(t, "node1") != 0 || e.endpointsOf(t, "node1") != 0 {
		t.Error("node1 has state it never had") // sanity
	}
}

// A missing Node record alone is not evidence: a node whose agent keeps
// its liveness record keeps everything, whatever the time; when the
// liveness record goes the grace starts, and it starts again if the
// liveness record comes back.
func TestNodeGCNeedsPositiveEvidence(t *testing.T) {
	e := newGCEnv(t)
	e.setLiveness(t, "gone", true)
	e.deleteNode(t, "gone")
	for range 3 {
		e.now = e.now.Add(DefaultNodeGCGrace)
		e.passes(t, 2)
	}
	if !e.intact(t, "gone") || e.record(t, "gone") {
		t.Fatal("a live node without a Node record lost its state")
	}
	e.setLiveness(t, "gone", false)
	e.passUntil(t, "the gone record", func() bool { return e.record(t, "gone") })
	e.now = e.now.Add(DefaultNodeGCGrace / 2)
	e.passes(t, 1)
	e.setLiveness(t, "gone", true) // it was only restarting
	e.passUntil(t, "the record cancelled", func() bool { return !e.record(t, "gone") })
	e.now = e.now.Add(DefaultNodeGCGrace)
	e.passes(t, 2)
	if !e.intact(t, "gone") {
		t.Fatal("a node that came back lost its state")
	}
	e.setLiveness(t, "gone", false)
	e.passUntil(t, "a new gone record", func() bool { return e.record(t, "gone") })
	e.now = e.now.Add(DefaultNodeGCGrace - time.Second)
	e.passes(t, 2)
	if !e.intact(t, "gone") {
		t.Fatal("the second grace was counted from the first")
	}
	e.now = e.now.Add(2 * time.Second)
	e.passUntil(t, "the node released", func() bool { return e.released(t, "gone") })
}

// One pass releases at most NodeGCMaxPerPass nodes.
func TestNodeGCCapPerPass(t *testing.T) {
	e := newGCEnv(t)
	ctx := context.Background()
	for _, n := range []string{"dead1", "dead2"} {
		if _, err := e.ipam.Assign(ctx, ipam.AssignRequest{Node: n, Handle: "h-" + n}); err != nil {
			t.Fatal(err)
		}
	}
	e.deleteNode(t, "gone")
	e.passUntil(t, "three gone records", func() bool {
		return e.record(t, "gone") && e.record(t, "dead1") && e.record(t, "dead2")
	})
	e.now = e.now.Add(DefaultNodeGCGrace + time.Second)
	for i := 1; i <= 3; i++ {
		e.passes(t, 1)
		if e.gc.released != i {
			t.Fatalf("after %d passes %d nodes released, want %d", i, e.gc.released, i)
		}
	}
	if !e.released(t, "gone") || e.affine(t, "dead1")+e.affine(t, "dead2") != 0 {
		t.Error("not everything released after three passes")
	}
}

// A crash after any IPAM write of a release leaves what the next pass
// (of a restarted agent) finishes: the node ends released, IPAM clean.
func TestNodeGCCrashAtEveryWrite(t *testing.T) {
	for k := 1; ; k++ {
		e := newGCEnv(t)
		e.deleteNode(t, "gone")
		e.passUntil(t, "the gone record", func() bool { return e.record(t, "gone") })
		e.now = e.now.Add(DefaultNodeGCGrace + time.Second)
		writes := 0
		crash := errors.New("injected crash")
		e.restart(t, ipam.WithFaultHook(func(step string) error {
			writes++
			if writes == k {
				return crash
			}
			return nil
		}))
		err := e.gc.pass(context.Background())
		if err == nil {
			if k == 1 {
				t.Fatal("the release made no IPAM write")
			}
			if !e.released(t, "gone") {
				t.Fatal("a pass without a crash did not release the node")
			}
			t.Logf("a release makes %d IPAM writes; a crash after each was recovered", k-1)
			return
		}
		if !errors.Is(err, crash) {
			t.Fatalf("crash at write %d: %v", k, err)
		}
		e.restart(t)
		e.passUntil(t, fmt.Sprintf("recovery from a crash at write %d", k), func() bool { return e.released(t, "gone") })
	}
}

// A Node record that does not decode is not a deleted node: its blocks
// and addresses stay.
func TestNodeGCKeepsUndecodableNode(t *testing.T) {
	ctx := context.Background()
	e := newGCEnv(t)
	key, err := datastore.ResourceKey(api.KindNode, "", "gone")
	if err != nil {
		t.Fatal(err)
	}
	rev, err := e.store.PutKV(ctx, key, []byte(`{"metadata":{"name":"gone"},"spec":{"bgp":{"asNumber":"not a number"}}}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.gc.view.WaitRevision(ctx, rev); err != nil {
		t.Fatal(err)
	}
	e.gc.grace = 0
	for range 2 { // claims on the first pass, addresses on a later one
		if err := e.gc.pass(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if e.affine(t, "gone") == 0 {
		t.Error("the blocks of a node whose record does not decode lost their affinity")
	}
	if e.held(t) != 1 {
		t.Error("the addresses of a node whose record does not decode were released")
	}
}

func TestSpeakerRestartsWhenIdentityChanges(t *testing.T) {
	ctx := context.Background()
	store := storetest.New(t)
	node := &api.Node{Metadata: api.ObjectMeta{Name: "node1"}, Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: "198.18.0.11/24"}}}
	if _, err := store.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	v := startView(t, store)
	var made []*fakeSpeaker
	first := newFakeSpeaker()
	b := newBGPOwner("node1", netip.MustParsePrefix("198.18.0.11/24"), v, nil, first, func() bgp.Speaker {
		s := newFakeSpeaker()
		made = append(made, s)
		return s
	}, time.Minute, newMetrics(), testLogger())
	b.speakerCfg = bgp.Config{ASN: 64512}
	bc := v.BGPConfiguration()

	if err := b.ensureSpeakerIdentity(ctx, bc); err != nil || len(made) != 0 {
		t.Fatalf("unchanged identity: err %v, %d new speakers", err, len(made))
	}
	cur, err := datastore.GetAs[*api.Node](ctx, store, api.KindNode, "", "node1")
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.BGP.RouteReflectorClusterID = "244.0.0.1"
	upd, err := store.Update(ctx, cur)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.WaitRevision(ctx, mustRev(t, upd)); err != nil {
		t.Fatal(err)
	}
	if err := b.ensureSpeakerIdentity(ctx, bc); err != nil {
		t.Fatal(err)
	}
	if len(made) != 1 || b.current() != made[0] {
		t.Fatalf("speaker not replaced: %d made", len(made))
	}
	if !first.stopped || !first.graceful {
		t.Errorf("old speaker stopped=%v graceful=%v, want a graceful stop", first.stopped, first.graceful)
	}
	if got := made[0].cfg; got.ClusterID != "244.0.0.1" || !got.LocalRestarting {
		t.Errorf("new speaker config %+v", got)
	}

	// An IPv6-only node's router ID comes from its record: a new one
	// restarts the speaker with it.
	b.routerIDFor = func(n *api.Node) netip.Addr { return routerID(Config{NodeName: "node1"}, n, netip.Prefix{}) }
	b.speakerCfg.RouterID = bgp.RouterIDFor("node1", "")
	cur, err = datastore.GetAs[*api.Node](ctx, store, api.KindNode, "", "node1")
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.BGP.RouterID = "240.0.0.9"
	if upd, err = store.Update(ctx, cur); err != nil {
		t.Fatal(err)
	}
	if err := v.WaitRevision(ctx, mustRev(t, upd)); err != nil {
		t.Fatal(err)
	}
	if err := b.ensureSpeakerIdentity(ctx, bc); err != nil {
		t.Fatal(err)
	}
	if len(made) != 2 || made[1].cfg.RouterID != netip.MustParseAddr("240.0.0.9") {
		t.Fatalf("router ID change: %d speakers made, last config %+v", len(made), made[len(made)-1].cfg)
	}
}

// The loop passes again when a grace ends, without waiting for the
// periodic pass (here an hour away) or another node event.
func TestNodeGCWakesWhenGraceEnds(t *testing.T) {
	e := newGCEnv(t)
	e.gc.now = time.Now
	e.gc.grace = 300 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	l := loop{name: "nodegc", every: time.Hour, wake: [2]<-chan struct{}{e.gc.sub.C(), e.gc.due}, pass: e.gc.pass, log: testLogger()}
	go func() { defer close(done); l.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	e.deleteNode(t, "gone")
	deadline := time.Now().Add(20 * time.Second)
	for !e.released(t, "gone") {
		if time.Now().After(deadline) {
			t.Fatal("the node was not released after its grace ended: no pass ran")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
