package ipam

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
)

// BenchmarkClaimAmong1000Blocks is a new node's first Assign (a block
// claim) in a cluster of 1,000 nodes with a /26 block of 30 pods each: the
// claim that the scale harness times at 1,000 simulated nodes (0.6-2.5 s
// under load there), which read every block record (≈ 8 KB each) to find
// a free range, and now reads the block keys and summaries.
func BenchmarkClaimAmong1000Blocks(b *testing.B) {
	ctx := context.Background()
	s := storetest.Connect(b, storetest.Etcd(b))
	a := newAllocator(s)
	mustCreatePool(b, a, "bench", "10.64.0.0/12", 26)
	pools, err := a.listPools(ctx)
	if err != nil {
		b.Fatal(err)
	}
	var ops []datastore.Op
	for i := range 1000 {
		node := fmt.Sprintf("node-%d", i)
		cidr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 64 + byte(i/1024), byte(i % 1024 / 4), byte(i % 4 * 64)}), 26)
		nb := newBlock(cidr, node, pools[0].name)
		for k := range 30 {
			nb.allocate(attrRecord{Handle: fmt.Sprintf("k8s-pod-network.%s-p%d", node, k), Node: node, Namespace: "default", Pod: fmt.Sprintf("%s-p%d", node, k)})
		}
		ops = append(ops, datastore.Op{Key: blockKey(cidr), Value: nb.encode()}, datastore.Op{Key: affinityKey(node, cidr), Value: encodeAffinity(affinityConfirmed)})
		ops = append(ops, summaryOps(nil, nb)...)
		if len(ops) >= 96 {
			if _, err := s.Txn(ctx, nil, ops); err != nil {
				b.Fatal(err)
			}
			ops = nil
		}
	}
	if _, err := s.Txn(ctx, nil, ops); err != nil {
		b.Fatal(err)
	}
	i := 0
	for b.Loop() {
		res, err := a.Assign(ctx, AssignRequest{Node: fmt.Sprintf("new-%d", i), Handle: fmt.Sprintf("h-%d", i)})
		if err != nil || !res.NewBlock {
			b.Fatalf("assign %d = %+v, %v; want a new block", i, res, err)
		}
		i++
	}
}
