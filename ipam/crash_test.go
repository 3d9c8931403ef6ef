package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
)

var errCrash = errors.New("injected crash")

type crashOp struct {
	name string
	run  func(ctx context.Context, a *Allocator) error
}

func assignOp(node, h string) crashOp {
	return crashOp{"assign " + h + " on " + node, func(ctx context.Context, a *Allocator) error {
		_, err := a.Assign(ctx, AssignRequest{Node: node, Handle: h})
		return err
	}}
}

// crashScenario touches every write Assign and the releases make: claims,
// fast-path allocations, a borrow, a specific address, releases by handle
// and by address, and a node removal.
var crashScenario = []crashOp{
	assignOp("n1", "h1"), // claim
	assignOp("n1", "h2"), // fast path
	assignOp("n1", "h3"),
	assignOp("n1", "h4"),
	assignOp("n1", "h5"), // second claim
	assignOp("n2", "b1"),
	{"specific address on n3", func(ctx context.Context, a *Allocator) error {
		_, err := a.Assign(ctx, AssignRequest{Node: "n3", Handle: "s1", Addr: netip.MustParseAddr("10.244.0.61")})
		return err
	}},
	{"release h2", func(ctx context.Context, a *Allocator) error { return a.ReleaseHandle(ctx, "h2") }},
	{"release h3 by address", func(ctx context.Context, a *Allocator) error {
		addrs, err := a.AddressesByHandle(ctx, "h3")
		if err != nil || len(addrs) == 0 {
			return err
		}
		return a.ReleaseAddr(ctx, addrs[0])
	}},
	{"release node n2", func(ctx context.Context, a *Allocator) error { return a.ReleaseNode(ctx, "n2", true) }},
	assignOp("n1", "h6"),
	{"release empty blocks of n1", func(ctx context.Context, a *Allocator) error {
		if err := a.ReleaseHandle(ctx, "h5"); err != nil {
			return err
		}
		_, err := a.ReleaseEmptyBlocks(ctx, "n1")
		return err
	}},
}

// TestCrashAfterEachWrite runs the scenario once to count its etcd writes,
// then once per write with a crash injected right after that write. The
// crashed operation is retried, as the agent (or the runtime) would; then no
// address may be duplicated, Check must find nothing wrong and the handles
// holding addresses must be those of the crash-free run.
func TestCrashAfterEachWrite(t *testing.T) {
	e := storetest.Etcd(t)
	run := func(t *testing.T, prefix string, crashAt int) (map[netip.Addr]string, []string) {
		s := storetest.Connect(t, e, func(c *datastore.Config) { c.Prefix = prefix })
		writes := 0
		var steps []string
		a := New(s, WithFaultHook(func(step string) error {
			writes++
			steps = append(steps, step)
			if writes == crashAt {
				return errCrash
			}
			return nil
		}))
		mustCreatePool(t, a, "default-pool", "10.244.0.0/26", 30)
		ctx := testCtx(t)
		crashed := false
		for _, op := range crashScenario {
			err := op.run(ctx, a)
			if errors.Is(err, errCrash) {
				crashed = true
				// A crashed process lost its memory too.
				a.caches = map[string]*nodeCache{}
				err = op.run(ctx, a)
			}
			if err != nil {
				t.Fatalf("%s (crash at write %d): %v", op.name, crashAt, err)
			}
		}
		if crashAt > 0 && !crashed {
			t.Fatalf("no crash happened at write %d of %d", crashAt, writes)
		}
		got := allocated(t, a)
		mustCheckClean(t, a)
		return got, steps
	}
	handles := func(m map[netip.Addr]string) []string {
		var out []string
		for _, h := range m {
			out = append(out, h)
		}
		slices.Sort(out)
		return out
	}
	want, steps := run(t, "/baseline", 0)
	t.Logf("scenario writes: %v", steps)
	if diff := cmp.Diff([]string{"h1", "h4", "h6", "s1"}, handles(want)); diff != "" {
		t.Fatalf("crash-free run (-want +got):\n%s", diff)
	}
	for k := 1; k <= len(steps); k++ {
		t.Run(fmt.Sprintf("crash after write %d (%s)", k, steps[k-1]), func(t *testing.T) {
			got, _ := run(t, fmt.Sprintf("/crash-%d", k), k)
			if diff := cmp.Diff(handles(want), handles(got)); diff != "" {
				t.Errorf("handles holding addresses (-crash-free +crashed):\n%s", diff)
			}
		})
	}
}

// TestRepairPartialClaims plants what a Calico-style three-step claim
// (pending affinity, block, confirm) leaves when its writer dies between
// steps, checks that Check reports it, and that the node's next Assign
// repairs it.
// Each repair write is itself followed by a crash, once.
func TestRepairPartialClaims(t *testing.T) {
	repairs := 0
	a, s := newTestAllocator(t, WithFaultHook(func(step string) error {
		if step == "repair" {
			repairs++
			return errCrash
		}
		return nil
	}))
	ctx := testCtx(t)
	mustCreatePool(t, a, "default-pool", "10.244.0.0/24", 30)
	put := func(key string, val []byte) {
		t.Helper()
		if _, err := s.PutKV(ctx, key, val, 0); err != nil {
			t.Fatal(err)
		}
	}
	pfx := netip.MustParsePrefix
	// n1: died after writing the pending affinity: no block.
	put(affinityKey("n1", pfx("10.244.0.0/30")), encodeAffinity(affinityPending))
	// n2: died after creating the block: affinity still pending.
	put(affinityKey("n2", pfx("10.244.0.4/30")), encodeAffinity(affinityPending))
	put(blockKey(pfx("10.244.0.4/30")), newBlock(pfx("10.244.0.4/30"), "n2", "default-pool").encode())
	// n3: the block is there but its affinity record was lost.
	put(blockKey(pfx("10.244.0.8/30")), newBlock(pfx("10.244.0.8/30"), "n3", "default-pool").encode())

	r, err := a.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{
		"affinity-missing 10.244.0.8-30",
		"affinity-not-confirmed 10.244.0.4-30",
		"affinity-stale ipam/affinities/n1/10.244.0.0-30",
		// The multi-step writer wrote no summaries; the repairs write them.
		"summary-mismatch ipam/block-summaries/10.244.0.4-30",
		"summary-mismatch ipam/block-summaries/10.244.0.8-30",
	}, kinds(r)); diff != "" {
		t.Fatalf("check before repair (-want +got):\n%s", diff)
	}

	assign := func(node string) Assignment {
		t.Helper()
		req := AssignRequest{Node: node, Handle: "h-" + node}
		got, err := a.Assign(ctx, req)
		if !errors.Is(err, errCrash) {
			t.Fatalf("%s's assign = %+v, %v; want a crash after its repair", node, got, err)
		}
		if got, err = a.Assign(ctx, req); err != nil {
			t.Fatalf("%s's assign after the crash: %v", node, err)
		}
		return got
	}
	for node, wantBlock := range map[string]string{"n2": "10.244.0.4/30", "n3": "10.244.0.8/30"} {
		got := assign(node)
		if got.Block.String() != wantBlock || got.Borrowed {
			t.Errorf("%s's assign = %+v, want from its half-claimed block %s", node, got, wantBlock)
		}
	}
	got := assign("n1")
	if repairs != 3 {
		t.Errorf("%d repair writes, want 3", repairs)
	}
	if got.Borrowed {
		t.Errorf("n1's assign = %+v, want a fresh claim", got)
	}
	mustCheckClean(t, a)
}
