package agent

import (
	"context"
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
// gone) and one address (handle h1) of gone.
type gcEnv struct {
	store *datastore.Store
	ipam  *ipam.Allocator
	gc    *nodeGC
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
	if _, err := al.Assign(ctx, ipam.AssignRequest{Node: "gone", Handle: "h1"}); err != nil {
		t.Fatal(err)
	}
	v := startView(t, store)
	return &gcEnv{store: store, ipam: al, gc: newNodeGC(v, store, al, testLogger())}
}

// passWhen runs GC passes until cond holds (the view follows etcd a few
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

func TestNodeGCReleasesGoneNodes(t *testing.T) {
	ctx := context.Background()
	e := newGCEnv(t)
	old := NodeGCGrace
	t.Cleanup(func() { NodeGCGrace = old })

	if err := e.gc.pass(ctx); err != nil {
		t.Fatal(err)
	}
	if e.affine(t, "gone") == 0 || e.held(t) != 1 {
		t.Fatal("a live node's blocks or addresses were released")
	}
	if err := e.store.Delete(ctx, api.KindNode, "", "gone", ""); err != nil {
		t.Fatal(err)
	}
	e.passUntil(t, "the deleted node's claims to go", func() bool { return e.affine(t, "gone") == 0 })
	if e.held(t) != 1 {
		t.Error("addresses released before the grace period")
	}
	NodeGCGrace = 0
	e.passUntil(t, "the deleted node's addresses to go", func() bool { return e.held(t) == 0 })
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
	old := NodeGCGrace
	NodeGCGrace = 0
	t.Cleanup(func() { NodeGCGrace = old })
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
}
