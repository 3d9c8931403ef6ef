package agent

import (
	"context"
	"fmt"
	"testing"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore/storetest"
)

// BenchmarkTunnelPassNoTunnel1k is the tunnel owner's pass on a node that
// does not tunnel (no pool encapsulates), in a cluster of 1,000 nodes:
// the pass every node and block claim in the cluster wakes on every agent.
// It read every node, block and borrowed address before finding it had
// nothing to do (docs/scale.md, "Where block → route goes").
func BenchmarkTunnelPassNoTunnel1k(b *testing.B) {
	ctx := context.Background()
	store := storetest.New(b)
	pool := &api.IPPool{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", VXLANMode: api.VXLANModeNever}}
	if _, err := store.Create(ctx, pool); err != nil {
		b.Fatal(err)
	}
	const nodes = 1000
	for i := range nodes {
		if _, err := store.Create(ctx, tunnelNode(fmt.Sprintf("n%d", i), fmt.Sprintf("198.18.%d.%d/24", 1+i/200, 10+i%200), "")); err != nil {
			b.Fatal(err)
		}
	}
	e := newTunnelEnv(b, store, "n0", "198.18.1.10/24")
	if n := len(e.view.Nodes()); n != nodes {
		b.Fatalf("the view has %d nodes, want %d", n, nodes)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := e.owner.pass(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
