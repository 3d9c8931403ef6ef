package ipam

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
)

// BenchmarkAssign measures assigns per second with 1 and 10 nodes (each its
// own Allocator and etcd connection, assigning concurrently), and etcd round
// trips per assign.
//
// family=6 does the same in an IPv6 pool whose /122 blocks hold 64
// addresses like the IPv4 pool's /26 ones, so the two rates compare.
func BenchmarkAssign(b *testing.B) {
	for _, fam := range []struct {
		family    int
		cidr      string
		blockSize int
	}{{4, "10.64.0.0/12", 26}, {6, "fd00:64::/48", 122}} {
		for _, nodes := range []int{1, 10} {
			benchAssign(b, fam.family, fam.cidr, fam.blockSize, nodes)
		}
	}
}

func benchAssign(b *testing.B, family int, cidr string, blockSize, nodes int) {
	b.Run(fmt.Sprintf("family=%d/nodes=%d", family, nodes), func(b *testing.B) {
		e := storetest.Etcd(b)
		admin := New(storetest.Connect(b, e))
		mustCreatePool(b, admin, "bench", cidr, blockSize)
		var allocs []*Allocator
		var counters []*countingStore
		for range nodes {
			cs := &countingStore{Store: storetest.Connect(b, e)}
			counters = append(counters, cs)
			allocs = append(allocs, newAllocator(cs))
		}
		ctx := context.Background()
		b.ResetTimer()
		elapsed := spread(b, nodes, func(n, i int) error {
			req := AssignRequest{Node: fmt.Sprintf("node-%d", n), Handle: fmt.Sprintf("h-%d", i), Family: family}
			_, err := allocs[n].Assign(ctx, req)
			return err
		})
		var trips int64
		for _, c := range counters {
			trips += c.n.Load()
		}
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "assigns/s")
		b.ReportMetric(float64(trips)/float64(b.N), "roundtrips/assign")
	})
}

// BenchmarkAssignRelease measures a pod's full address life: assign, then
// release by handle, on one node.
func BenchmarkAssignRelease(b *testing.B) {
	e := storetest.Etcd(b)
	cs := &countingStore{Store: storetest.Connect(b, e)}
	a := newAllocator(cs)
	mustCreatePool(b, a, "bench", "10.64.0.0/16", 26)
	ctx := context.Background()
	cs.n.Store(0)
	b.ResetTimer()
	for i := range b.N {
		h := fmt.Sprintf("h-%d", i)
		if _, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: h}); err != nil {
			b.Fatal(err)
		}
		if err := a.ReleaseHandle(ctx, h); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cs.n.Load())/float64(b.N), "roundtrips/op")
}

// BenchmarkEtcdTxnReference is the same-run reference for BenchmarkAssign:
// one compare-and-swap transaction on a fresh key, the floor of any
// allocation that must write etcd once. Compare assigns/s with txns/s.
func BenchmarkEtcdTxnReference(b *testing.B) {
	for _, writers := range []int{1, 10} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			e := storetest.Etcd(b)
			stores := make([]*datastore.Store, writers)
			for i := range stores {
				stores[i] = storetest.Connect(b, e)
			}
			ctx := context.Background()
			b.ResetTimer()
			elapsed := spread(b, writers, func(n, i int) error {
				key := fmt.Sprintf("bench/%d", i)
				_, err := stores[n].Txn(ctx, []datastore.Cmp{{Key: key}}, []datastore.Op{{Key: key, Value: []byte("x")}})
				return err
			})
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "txns/s")
		})
	}
}

// spread runs op for i in [0, b.N), split over workers goroutines (worker n
// takes i ≡ n mod workers), stops the timer and returns the elapsed time.
func spread(b *testing.B, workers int, op func(worker, i int) error) time.Duration {
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for n := range workers {
		wg.Go(func() {
			for i := n; i < b.N; i += workers {
				if err := op(n, i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return elapsed
}
