package agent

import (
	"context"
	"testing"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/ipam"
)

func TestReleaseGoneNodes(t *testing.T) {
	ctx := context.Background()
	store := storetest.New(t)
	if _, err := store.Create(ctx, &api.IPPool{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/24", BlockSize: 28}}); err != nil {
		t.Fatal(err)
	}
	a := New(Default(), testLogger(), Deps{})
	a.store, a.ipam = store, ipam.New(store)
	if _, err := a.ipam.Assign(ctx, ipam.AssignRequest{Node: "gone", Handle: "h1"}); err != nil {
		t.Fatal(err)
	}
	live := map[string]bool{"node1": true}
	pass := func() {
		t.Helper()
		blocks, err := a.ipam.Blocks(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.releaseGoneNodes(ctx, live, blocks); err != nil {
			t.Fatal(err)
		}
	}
	old := NodeGCGrace
	t.Cleanup(func() { NodeGCGrace = old })

	pass()
	blocks, _ := a.ipam.Blocks(ctx)
	for _, b := range blocks {
		if b.Affinity == "gone" {
			t.Errorf("block %s still affine to the deleted node", b.CIDR)
		}
	}
	if addrs, _ := a.ipam.AddressesByHandle(ctx, "h1"); len(addrs) != 1 {
		t.Errorf("addresses released before the grace period: %v", addrs)
	}

	NodeGCGrace = 0
	pass()
	if addrs, _ := a.ipam.AddressesByHandle(ctx, "h1"); len(addrs) != 0 {
		t.Errorf("addresses of the deleted node still allocated after the grace period: %v", addrs)
	}
}
