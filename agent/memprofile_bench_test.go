package agent

import (
	"context"
	"os"
	"runtime"
	"testing"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/syncer/syncertest"
)

// BenchmarkAgentHeapAtScale is the heap the view and the policy owner hold
// together at 30,000 endpoints and 1,000 policies (the cluster of
// BenchmarkPolicyRemotePodAdd) after the owner's first pass and a full GC,
// the records' bytes released: heap-B/endpoint. TABBY_BENCH_HEAPPROFILE
// names a file for the heap profile taken at that point.
func BenchmarkAgentHeapAtScale(b *testing.B) {
	if os.Getenv("TABBY_BENCH_HEAPPROFILE") != "" {
		runtime.MemProfileRate = 2048
	}
	for b.Loop() {
		b.StopTimer()
		before := testkit.HeapAfterGC()
		b.StartTimer()
		// A snapshot of its own: the view keeps the keys' strings, as it
		// keeps those of the watch responses that carry them.
		kvs, err := buildScaleSnapshot(scaleNodes)
		if err != nil {
			b.Fatal(err)
		}
		v, p, stop := scaleOwner(b, kvs)
		kvs = nil
		b.StopTimer()
		b.ReportMetric(float64(testkit.HeapAfterGC()-before)/float64(scaleNodes*scaleEpsPerNode), "heap-B/endpoint")
		if f := os.Getenv("TABBY_BENCH_HEAPPROFILE"); f != "" {
			if err := testkit.WriteHeapProfile(f); err != nil {
				b.Fatal(err)
			}
		}
		runtime.KeepAlive(v)
		runtime.KeepAlive(p)
		stop()
		b.StartTimer()
	}
}

// scaleOwner is a view fed kvs and a policy owner after its first pass.
func scaleOwner(b *testing.B, kvs []datastore.KV) (any, *policyOwner, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	src := make(syncertest.Script)
	v := syncertest.Start(b, src, quietLog(), false)
	v.CompactRemote(scaleNode(0)) // as the agent's view
	p := newPolicyOwner(scaleNode(0), v, &memoFirewall{}, quietLog())
	src <- datastore.Event{Type: datastore.EventResync, Snapshot: kvs, Revision: 1}
	if err := v.WaitSynced(ctx); err != nil {
		b.Fatal(err)
	}
	if err := p.sync(ctx, false); err != nil {
		b.Fatal(err)
	}
	return v, p, cancel
}
