package ipam

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/tabbynet/tabby/datastore/storetest"
	"golang.org/x/sync/errgroup"
)

// TestConcurrentNodes runs 10 simulated nodes, each its own Allocator on its
// own etcd connection (as separate agents would be), each with 100
// concurrent pods that assign and, every other one, release again. The pool
// is small enough that nodes must borrow. Afterwards every kept handle holds
// its address, nothing else is allocated, no address is duplicated and
// Check agrees.
func TestConcurrentNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode")
	}
	const nodes, pods = 10, 100
	e := storetest.Etcd(t)
	admin := New(storetest.Connect(t, e), WithLeakGrace(0))
	// 1024 addresses in 32 blocks of 32: at most 1000 are in use at once,
	// but 10 nodes × 4 blocks do not fit, so some must borrow.
	mustCreatePool(t, admin, "default-pool", "10.244.0.0/22", 27)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	var mu sync.Mutex
	kept := map[string]netip.Addr{}
	borrowed := 0
	g, gctx := errgroup.WithContext(ctx)
	for n := range nodes {
		node := fmt.Sprintf("node-%d", n)
		a := New(storetest.Connect(t, e))
		for p := range pods {
			h := fmt.Sprintf("net.%s-pod-%d", node, p)
			g.Go(func() error {
				r, err := a.Assign(gctx, AssignRequest{Node: node, Handle: h})
				if err != nil {
					return fmt.Errorf("assign %s: %w", h, err)
				}
				switch p % 4 {
				case 0:
					return a.ReleaseHandle(gctx, h)
				case 2:
					return a.ReleaseAddr(gctx, r.Addr)
				}
				mu.Lock()
				defer mu.Unlock()
				kept[h] = r.Addr
				if r.Borrowed {
					borrowed++
				}
				return nil
			})
		}
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d assigns and %d releases on %d nodes in %v; %d kept addresses borrowed",
		nodes*pods, nodes*pods/2, nodes, time.Since(start), borrowed)

	got := allocated(t, admin) // fails on duplicates
	want := map[netip.Addr]string{}
	for h, addr := range kept {
		if prev, dup := want[addr]; dup {
			t.Errorf("%s handed to both %s and %s", addr, prev, h)
		}
		want[addr] = h
	}
	if diff := cmp.Diff(want, got, netipOpts); diff != "" {
		t.Errorf("allocations (-kept +stored):\n%s", diff)
	}
	r := mustCheckClean(t, admin)
	// No endpoints exist and the grace is 0: every kept address, and only
	// those, is a leak.
	leaked := map[netip.Addr]string{}
	for _, l := range r.Leaks {
		leaked[l.Addr] = l.Handle
	}
	if diff := cmp.Diff(want, leaked, netipOpts); diff != "" {
		t.Errorf("leaks (-kept +reported):\n%s", diff)
	}
	// Usage agrees with the count.
	u, err := admin.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(u) != 1 || u[0].InUse != len(kept) || u[0].Free != 1024-len(kept) {
		t.Errorf("usage = %+v, want %d in use", u, len(kept))
	}
}
