package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
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

	// A bound on a hang, not a performance target: 1,000 contending
	// transactions with -race on a loaded machine took over 60 s.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
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

// TestConcurrentOverlappingPools creates overlapping pools at the same time
// from separate allocators: no two survivors may overlap, and exactly the
// survivors' creates report success.
func TestConcurrentOverlappingPools(t *testing.T) {
	e := storetest.Etcd(t)
	allocs := []*Allocator{New(storetest.Connect(t, e)), New(storetest.Connect(t, e)), New(storetest.Connect(t, e))}
	ctx := testCtx(t)
	for round := range 5 {
		cidrs := []string{
			fmt.Sprintf("10.%d.0.0/16", 100+round),
			fmt.Sprintf("10.%d.128.0/17", 100+round),
			fmt.Sprintf("10.%d.0.0/24", 100+round),
		}
		var g errgroup.Group
		created := make([]bool, len(allocs))
		for i, a := range allocs {
			g.Go(func() error {
				p := &api.IPPool{Metadata: api.ObjectMeta{Name: fmt.Sprintf("r%d-p%d", round, i)}, Spec: api.IPPoolSpec{CIDR: cidrs[i], BlockSize: 26}}
				_, err := a.CreatePool(ctx, p)
				if err == nil {
					created[i] = true
					return nil
				}
				if errors.Is(err, ErrPoolOverlap) {
					return nil
				}
				return err
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		pools, err := allocs[0].listPools(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var survivors []poolInfo
		for _, p := range pools {
			if strings.HasPrefix(p.name, fmt.Sprintf("r%d-", round)) {
				survivors = append(survivors, p)
			}
		}
		for i, p := range survivors {
			for _, q := range survivors[i+1:] {
				if p.prefix.Overlaps(q.prefix) {
					t.Errorf("round %d: pools %s (%s) and %s (%s) both survived", round, p.name, p.prefix, q.name, q.prefix)
				}
			}
		}
		n := len(survivors)
		nCreated := 0
		for _, c := range created {
			if c {
				nCreated++
			}
		}
		if n == 0 || nCreated != n {
			t.Errorf("round %d: %d pools stored, %d creates reported success", round, n, nCreated)
		}
	}
}

// TestDeletePoolRacesAssigns deletes a pool while nodes keep assigning from
// it: either the delete is refused, or the pool is gone and so is every
// block and address in it.
func TestDeletePoolRacesAssigns(t *testing.T) {
	e := storetest.Etcd(t)
	admin := New(storetest.Connect(t, e))
	ctx := testCtx(t)
	mustCreatePool(t, admin, "doomed", "10.244.0.0/24", 28)
	var g errgroup.Group
	for n := range 3 {
		a := New(storetest.Connect(t, e))
		g.Go(func() error {
			for i := range 20 {
				h := fmt.Sprintf("n%d-%d", n, i)
				if _, err := a.Assign(ctx, AssignRequest{Node: fmt.Sprintf("n%d", n), Handle: h}); err != nil {
					if errors.Is(err, ErrNoPool) {
						return nil // the pool is disabled or gone
					}
					return err
				}
				if err := a.ReleaseHandle(ctx, h); err != nil {
					return err
				}
			}
			return nil
		})
	}
	var delErr error
	for range 20 {
		if delErr = admin.DeletePool(ctx, "doomed"); delErr == nil {
			break
		}
		if !errors.Is(delErr, ErrInUse) {
			t.Fatalf("DeletePool: %v", delErr)
		}
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	obj, perr := storetest.Connect(t, e).Get(ctx, api.KindIPPool, "", "doomed")
	switch {
	case delErr == nil:
		if !errors.Is(perr, datastore.ErrNotFound) {
			t.Errorf("pool still there after a successful delete: %v", perr)
		}
		if got := allocated(t, admin); len(got) != 0 {
			t.Errorf("addresses allocated in a deleted pool: %v", got)
		}
		if b, _ := admin.Blocks(ctx); len(b) != 0 {
			t.Errorf("blocks left in a deleted pool: %+v", b)
		}
	default:
		if perr != nil {
			t.Fatalf("pool gone although every delete was refused: %v", perr)
		}
		if obj.(*api.IPPool).Spec.Disabled {
			t.Errorf("refused deletes left the pool disabled")
		}
	}
	r := mustCheckClean(t, admin)
	t.Logf("delete: %v; check: %d blocks, %d allocated", delErr, r.Blocks, r.Allocated)
}
