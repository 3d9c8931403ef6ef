package agent

import (
	"context"
	"testing"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// A Node record that does not decode is skipped by List, but the node is
// not gone: its blocks and addresses must stay.
func TestReleaseGoneNodesKeepsUndecodableNode(t *testing.T) {
	ctx := context.Background()
	a := newGCAgent(t, "odd")
	store := a.store
	key, err := datastore.ResourceKey(api.KindNode, "", "odd")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.PutKV(ctx, key, []byte(`{"metadata":{"name":"odd"},"spec":{"bgp":{"asNumber":"not a number"}}}`), 0); err != nil {
		t.Fatal(err)
	}
	objs, _, err := store.List(ctx, api.KindNode, "")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, o := range objs {
		names[o.GetMeta().Name] = true
	}
	old := NodeGCGrace
	NodeGCGrace = 0
	t.Cleanup(func() { NodeGCGrace = old })
	for range 2 { // affinities on the first pass, addresses on a later one
		blocks, err := a.ipam.Blocks(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = a.releaseGoneNodes(ctx, names, blocks)
	}
	blocks, err := a.ipam.Blocks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	affine := 0
	for _, b := range blocks {
		if b.Affinity == "odd" {
			affine++
		}
	}
	if affine == 0 {
		t.Error("the blocks of a node whose record does not decode lost their affinity")
	}
	if addrs, _ := a.ipam.AddressesByHandle(ctx, "h1"); len(addrs) != 1 {
		t.Errorf("the addresses of a node whose record does not decode were released: %v", addrs)
	}
}
