package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tabbynet/tabby/api"
)

func TestAssignAffineBlocksAndIdempotency(t *testing.T) {
	a, _ := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "default-pool", "10.244.0.0/24", 30)

	var got []Assignment
	for _, h := range []string{"h1", "h2", "h3", "h4", "h5"} {
		got = append(got, mustAssign(t, a, "n1", h))
	}
	// Four from the first block, the fifth claims a second one.
	first := got[0].Block
	for i, r := range got[:4] {
		if r.Block != first || r.Borrowed || r.Pool != "default-pool" {
			t.Errorf("assignment %d = %+v, want in %s, not borrowed", i, r, first)
		}
	}
	if got[4].Block == first || got[4].Borrowed {
		t.Errorf("fifth assignment %+v should come from a new affine block", got[4])
	}
	// Idempotent per handle; the repeat is said to be one.
	again := mustAssign(t, a, "n1", "h3")
	if !again.Existing || got[2].Existing {
		t.Errorf("Existing: first %v, repeat %v; want false, true", got[2].Existing, again.Existing)
	}
	again.Existing = false
	if diff := cmp.Diff(got[2], again, netipOpts); diff != "" {
		t.Errorf("second assign of h3 (-first +second):\n%s", diff)
	}
	addrs, err := a.AddressesByHandle(ctx, "h3")
	if err != nil || len(addrs) != 1 || addrs[0] != got[2].Addr {
		t.Errorf("AddressesByHandle(h3) = %v, %v; want [%s]", addrs, err, got[2].Addr)
	}
	if addrs, err := a.AddressesByHandle(ctx, "nope"); err != nil || len(addrs) != 0 {
		t.Errorf("AddressesByHandle(nope) = %v, %v", addrs, err)
	}

	blocks, err := a.Blocks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 2 {
		t.Fatalf("Blocks() = %+v, want 2", blocks)
	}
	for _, b := range blocks {
		if b.Affinity != "n1" || !b.Confirmed || b.Pool != "default-pool" {
			t.Errorf("block %+v: want confirmed affinity to n1 in default-pool", b)
		}
	}
	if seen := allocated(t, a); len(seen) != 5 {
		t.Errorf("allocated %d addresses, want 5", len(seen))
	}
	mustCheckClean(t, a)
}

func TestAssignValidation(t *testing.T) {
	a, _ := newTestAllocator(t)
	ctx := testCtx(t)
	for name, req := range map[string]AssignRequest{
		"no node":   {Handle: "h"},
		"no handle": {Node: "n1"},
		"ipv6":      {Node: "n1", Handle: "h", Addr: netip.MustParseAddr("fd00::1")},
	} {
		if _, err := a.Assign(ctx, req); err == nil {
			t.Errorf("%s: assign succeeded", name)
		}
	}
	if _, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "h"}); !errors.Is(err, ErrNoPool) {
		t.Errorf("assign without pools: %v, want ErrNoPool", err)
	}
}

// setupTiny makes a /28 pool of four /30 blocks and has nodes n1–n4 claim
// one block each, n1 filling its block.
func setupTiny(t *testing.T, a *Allocator) {
	t.Helper()
	mustCreatePool(t, a, "tiny", "10.244.0.0/28", 30)
	for _, h := range []string{"a1", "a2", "a3", "a4"} {
		if r := mustAssign(t, a, "n1", h); r.Borrowed {
			t.Fatalf("%s borrowed: %+v", h, r)
		}
	}
	for _, n := range []string{"n2", "n3", "n4"} {
		if r := mustAssign(t, a, n, "first-"+n); r.Borrowed {
			t.Fatalf("first address of %s borrowed: %+v", n, r)
		}
	}
}

func TestExhaustionTinyPool(t *testing.T) {
	a, _ := newTestAllocator(t)
	setupTiny(t, a)
	// 16 addresses, 7 taken: 9 more fit (borrowing from n2–n4's blocks).
	for i := range 9 {
		if _, err := a.Assign(testCtx(t), AssignRequest{Node: "n1", Handle: "more-" + string(rune('a'+i))}); err != nil {
			t.Fatalf("assign %d: %v", i, err)
		}
	}
	_, err := a.Assign(testCtx(t), AssignRequest{Node: "n1", Handle: "one-too-many"})
	if !errors.Is(err, ErrExhausted) {
		t.Fatalf("17th assign: %v, want ErrExhausted", err)
	}
	if want := "ipam: pools [tiny] exhausted for node n1"; err.Error() != want {
		t.Errorf("error = %q, want %q", err, want)
	}
	if seen := allocated(t, a); len(seen) != 16 {
		t.Errorf("allocated %d, want 16", len(seen))
	}
	mustCheckClean(t, a)
}

func TestBorrowing(t *testing.T) {
	a, _ := newTestAllocator(t)
	ctx := testCtx(t)
	setupTiny(t, a)
	n1Block := mustAssign(t, a, "n1", "a1").Block
	r := mustAssign(t, a, "n1", "borrower")
	if !r.Borrowed || r.Block == n1Block {
		t.Fatalf("assignment %+v: want borrowed from another node's block", r)
	}
	borrowed, err := a.Borrowed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(borrowed) != 1 || borrowed[0].Addr != r.Addr || borrowed[0].Node != "n1" || borrowed[0].Block != r.Block ||
		borrowed[0].BlockNode == "" || borrowed[0].BlockNode == "n1" {
		t.Errorf("Borrowed() = %+v, want %s used by n1 from another node's block", borrowed, r.Addr)
	}
	// Idempotent also for borrowed addresses.
	if again := mustAssign(t, a, "n1", "borrower"); again.Addr != r.Addr || again.Block != r.Block || !again.Borrowed || !again.Existing {
		t.Errorf("second assign = %+v, want %+v again, as existing", again, r)
	}
	mustCheckClean(t, a)
}

func TestStrictAffinity(t *testing.T) {
	a, s := newTestAllocator(t)
	setupTiny(t, a)
	mustConfig(t, s, api.IPAMConfigSpec{StrictAffinity: true})
	_, err := a.Assign(testCtx(t), AssignRequest{Node: "n1", Handle: "borrower"})
	if !errors.Is(err, ErrExhausted) {
		t.Fatalf("assign with strict affinity: %v, want ErrExhausted", err)
	}
}

func TestMaxBlocksPerHostAndAutoAllocate(t *testing.T) {
	a, s := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "tiny", "10.244.0.0/28", 30)
	mustConfig(t, s, api.IPAMConfigSpec{MaxBlocksPerHost: 1})
	for _, h := range []string{"a1", "a2", "a3", "a4"} {
		mustAssign(t, a, "n1", h)
	}
	// Free blocks exist, but n1 may not claim a second one and there is no
	// other block to borrow from.
	if _, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "a5"}); !errors.Is(err, ErrExhausted) {
		t.Fatalf("assign beyond maxBlocksPerHost: %v, want ErrExhausted", err)
	}
	b2 := mustAssign(t, a, "n2", "b1")
	r := mustAssign(t, a, "n1", "a5")
	if !r.Borrowed || r.Block != b2.Block {
		t.Errorf("n1's fifth = %+v, want borrowed from n2's %s", r, b2.Block)
	}
	no := false
	mustConfig(t, s, api.IPAMConfigSpec{AutoAllocateBlocks: &no})
	if _, err := a.Assign(ctx, AssignRequest{Node: "n3", Handle: "c1"}); err != nil {
		t.Fatalf("n3 should borrow when it may not claim: %v", err)
	}
	blocks, err := a.Blocks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks {
		if b.Affinity == "n3" {
			t.Errorf("n3 claimed %s with autoAllocateBlocks off", b.CIDR)
		}
	}
}

func TestSpecificAddress(t *testing.T) {
	a, s := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "default-pool", "10.244.0.0/24", 28)
	mustCreatePool(t, a, "off", "10.245.0.0/24", 28, func(p *api.IPPool) { p.Spec.Disabled = true })
	want := netip.MustParseAddr("10.244.0.77")
	r, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "h1", Addr: want})
	if err != nil {
		t.Fatal(err)
	}
	if r.Addr != want || r.Block.String() != "10.244.0.64/28" || r.Borrowed {
		t.Errorf("assignment = %+v, want %s in a block claimed for n1", r, want)
	}
	// Same handle, same address: idempotent, and said to be a repeat. Same
	// handle, other address: error.
	wantAgain := r
	wantAgain.Existing, wantAgain.NewBlock = true, false
	if again, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "h1", Addr: want}); err != nil || again != wantAgain {
		t.Errorf("repeat = %+v, %v", again, err)
	}
	if _, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "h1", Addr: netip.MustParseAddr("10.244.0.78")}); err == nil {
		t.Error("a handle holding an address got a second specific one")
	}
	// Taken by h1: the error names the holder.
	_, err = a.Assign(ctx, AssignRequest{Node: "n2", Handle: "h2", Addr: want})
	var inUse *InUseError
	if !errors.As(err, &inUse) || inUse.Handle != "h1" || !strings.Contains(err.Error(), `"h1"`) {
		t.Errorf("taken address: %v, want InUseError naming h1", err)
	}
	// Another address in n1's block, asked for by n2: allocated in the
	// existing block, borrowed.
	r2, err := a.Assign(ctx, AssignRequest{Node: "n2", Handle: "h2", Addr: netip.MustParseAddr("10.244.0.65")})
	if err != nil || !r2.Borrowed || r2.Block != r.Block {
		t.Errorf("assign in n1's block for n2 = %+v, %v; want borrowed from %s", r2, err, r.Block)
	}
	for addr, wantErr := range map[string]string{
		"10.9.9.9":   "is not in any ip pool",
		"10.245.0.5": "is in pool off, which is disabled",
	} {
		_, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "x" + addr, Addr: netip.MustParseAddr(addr)})
		if !errors.Is(err, ErrNotInPool) || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("assign %s: %v, want ErrNotInPool containing %q", addr, err, wantErr)
		}
	}
	// With strict affinity and no claims allowed, an unclaimed block is
	// refused rather than created unowned.
	no := false
	mustConfig(t, s, api.IPAMConfigSpec{StrictAffinity: true, AutoAllocateBlocks: &no})
	if _, err := a.Assign(ctx, AssignRequest{Node: "n3", Handle: "h3", Addr: netip.MustParseAddr("10.244.0.200")}); err == nil {
		t.Error("strict affinity: specific address in an unclaimed block was allocated")
	}
	mustCheckClean(t, a)
}

func TestPoolNodeSelector(t *testing.T) {
	a, s := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "rack1", "10.244.0.0/24", 28, func(p *api.IPPool) {
		p.Spec.NodeSelector = &api.LabelSelector{MatchLabels: map[string]string{"rack": "1"}}
	})
	// The node does not exist: no labels, the pool does not select it.
	if _, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "h1"}); !errors.Is(err, ErrNoPool) {
		t.Fatalf("assign for unlabelled node: %v, want ErrNoPool", err)
	}
	node := &api.Node{Metadata: api.ObjectMeta{Name: "n1", Labels: map[string]string{"rack": "1"}}}
	if _, err := s.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	mustAssign(t, a, "n1", "h1")
	// Relabel the node: the cached fast path must notice.
	obj, err := s.Get(ctx, api.KindNode, "", "n1")
	if err != nil {
		t.Fatal(err)
	}
	n := obj.(*api.Node)
	n.Metadata.Labels = map[string]string{"rack": "2"}
	if _, err := s.Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	if r, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "h2"}); !errors.Is(err, ErrNoPool) {
		t.Fatalf("assign after relabel = %+v, %v; want ErrNoPool", r, err)
	}
}

func TestDisabledPoolSeenByFastPath(t *testing.T) {
	a, s := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "a-pool", "10.244.0.0/24", 28)
	first := mustAssign(t, a, "n1", "h1") // warms the cache with a-pool's block
	obj, err := s.Get(ctx, api.KindIPPool, "", "a-pool")
	if err != nil {
		t.Fatal(err)
	}
	p := obj.(*api.IPPool)
	p.Spec.Disabled = true
	if _, err := s.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	mustCreatePool(t, a, "b-pool", "10.250.0.0/24", 28)
	r := mustAssign(t, a, "n1", "h2")
	if r.Pool != "b-pool" || r.Block == first.Block {
		t.Errorf("assign after disabling a-pool = %+v, want from b-pool", r)
	}
}

func TestRequestedPools(t *testing.T) {
	a, _ := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "a-pool", "10.244.0.0/24", 28)
	mustCreatePool(t, a, "b-pool", "10.250.0.0/24", 28)
	mustAssign(t, a, "n1", "warm") // a-pool first by name
	r, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "h1", Pools: []string{"b-pool"}})
	if err != nil || r.Pool != "b-pool" {
		t.Errorf("assign from b-pool = %+v, %v", r, err)
	}
	if _, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "h2", Pools: []string{"c-pool"}}); err == nil || !strings.Contains(err.Error(), "c-pool") {
		t.Errorf("assign from missing pool: %v", err)
	}
}

// One block that does not decode does not stop its node: assignments go
// to its other blocks (and new claims go around the bad block's range),
// the affinity of the bad block stays, and the allocator and Check report
// it.
func TestAssignSkipsUnreadableBlock(t *testing.T) {
	a, store := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "default-pool", "10.244.0.0/28", 30) // four /30 blocks
	first := mustAssign(t, a, "n1", "h0")
	for i := 1; i < 5; i++ { // fill the first block, claim a second
		mustAssign(t, a, "n1", fmt.Sprintf("h%d", i))
	}
	if _, err := store.PutKV(ctx, blockKey(first.Block), []byte(`{"cidr": 42`), 0); err != nil {
		t.Fatal(err)
	}
	// A fresh allocator (an agent restart) has no cache to hide behind.
	b := New(store)
	var got []Assignment
	for i := 5; i < 12; i++ { // the second block's rest, then two claims
		r, err := b.Assign(ctx, AssignRequest{Node: "n1", Handle: fmt.Sprintf("h%d", i)})
		if err != nil {
			t.Fatalf("assign %d with an unreadable block: %v", i, err)
		}
		if r.Block == first.Block {
			t.Fatalf("assigned %s from the unreadable block", r.Addr)
		}
		got = append(got, r)
	}
	bad, skipped := b.UnreadableBlocks()
	if _, ok := bad[first.Block]; !ok || skipped == 0 {
		t.Errorf("UnreadableBlocks() = %v, %d; want %s", bad, skipped, first.Block)
	}
	if _, err := store.GetKV(ctx, affinityKey("n1", first.Block)); err != nil {
		t.Errorf("the unreadable block's affinity: %v", err)
	}
	rep, err := b.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, inc := range rep.Inconsistencies {
		if inc.Kind == InvalidRecord && strings.Contains(inc.Key+inc.Detail, blockName(first.Block)) {
			found = true
		}
	}
	if !found {
		t.Errorf("Check does not report the unreadable block: %+v", rep.Inconsistencies)
	}
}

// EnsureBlock claims an empty block for a node without one, once; the
// node's first assign then takes its first address from that block with
// no claim; a node with a block, or without a usable pool, claims nothing.
func TestEnsureBlock(t *testing.T) {
	a, store := newTestAllocator(t)
	ctx := testCtx(t)
	if got, err := a.EnsureBlock(ctx, "n1"); err != nil || got.IsValid() {
		t.Fatalf("without pools: %v, %v; want nothing claimed", got, err)
	}
	mustCreatePool(t, a, "default-pool", "10.244.0.0/24", 28)
	first, err := a.EnsureBlock(ctx, "n1")
	if err != nil || !first.IsValid() {
		t.Fatalf("EnsureBlock = %v, %v", first, err)
	}
	if again, err := a.EnsureBlock(ctx, "n1"); err != nil || again.IsValid() {
		t.Errorf("second EnsureBlock claimed %v (%v)", again, err)
	}
	// A fresh allocator (another process) sees the claim too.
	b := New(store)
	if again, err := b.EnsureBlock(ctx, "n1"); err != nil || again.IsValid() {
		t.Errorf("EnsureBlock of another allocator claimed %v (%v)", again, err)
	}
	r := mustAssign(t, b, "n1", "h1")
	if r.Block != first || r.NewBlock {
		t.Errorf("first assign = %+v, want an address of %s without a claim", r, first)
	}
	blocks, err := a.Blocks(ctx)
	if err != nil || len(blocks) != 1 || blocks[0].Affinity != "n1" {
		t.Errorf("blocks = %+v, %v", blocks, err)
	}
	mustCheckClean(t, a)
}
