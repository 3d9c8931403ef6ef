package ipam

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestAllocationsAndLookup(t *testing.T) {
	a, _ := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "tiny", "10.244.0.0/28", 30)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	assign := func(node, h string) Assignment {
		t.Helper()
		r, err := a.Assign(ctx, AssignRequest{Node: node, Handle: h,
			Attrs: Attributes{Namespace: "ns", Pod: h, ContainerID: "c-" + h, Time: at}})
		if err != nil {
			t.Fatalf("assign %s on %s: %v", h, node, err)
		}
		return r
	}
	own := assign("n1", "p1")
	for _, h := range []string{"p2", "p3", "p4"} {
		assign("n1", h)
	}
	theirs := assign("n2", "q1")
	// strictAffinity is off and n1's block is full: n1 may claim a new block
	// or borrow; either way Allocations must describe what the block says.
	extra := assign("n1", "p5")

	all, err := a.Allocations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 6 {
		t.Fatalf("Allocations() = %d entries, want 6: %+v", len(all), all)
	}
	for i := 1; i < len(all); i++ {
		if all[i-1].Addr.Compare(all[i].Addr) >= 0 {
			t.Errorf("Allocations() not sorted at %d: %s then %s", i, all[i-1].Addr, all[i].Addr)
		}
	}

	wantOwn := Allocation{Addr: own.Addr, Block: own.Block, BlockNode: "n1", Handle: "p1", Node: "n1",
		Namespace: "ns", Pod: "p1", ContainerID: "c-p1", Time: at}
	wantTheirs := Allocation{Addr: theirs.Addr, Block: theirs.Block, BlockNode: "n2", Handle: "q1", Node: "n2",
		Namespace: "ns", Pod: "q1", ContainerID: "c-q1", Time: at}
	for _, want := range []Allocation{wantOwn, wantTheirs} {
		got, ok, err := a.Lookup(ctx, want.Addr)
		if err != nil || !ok {
			t.Fatalf("Lookup(%s) = %v, %v", want.Addr, ok, err)
		}
		if diff := cmp.Diff(want, got, netipOpts); diff != "" {
			t.Errorf("Lookup(%s) (-want +got):\n%s", want.Addr, diff)
		}
		if got.IsBorrowed() {
			t.Errorf("Lookup(%s).IsBorrowed() = true for an address of the node's own block", want.Addr)
		}
	}
	got, ok, err := a.Lookup(ctx, extra.Addr)
	if err != nil || !ok {
		t.Fatalf("Lookup(%s) = %v, %v", extra.Addr, ok, err)
	}
	if got.IsBorrowed() != extra.Borrowed || got.Block != extra.Block || got.Handle != "p5" {
		t.Errorf("Lookup(%s) = %+v, want block %s, borrowed %v", extra.Addr, got, extra.Block, extra.Borrowed)
	}

	if err := a.ReleaseAddr(ctx, own.Addr); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []netip.Addr{own.Addr, netip.MustParseAddr("10.244.9.9"), netip.MustParseAddr("fd00::1")} {
		if got, ok, err := a.Lookup(ctx, addr); err != nil || ok {
			t.Errorf("Lookup(%s) = %+v, %v, %v; want not allocated", addr, got, ok, err)
		}
	}
}

// BGPState is Blocks and Borrowed from one read.
func TestBGPStateMatchesBlocksAndBorrowed(t *testing.T) {
	a, _ := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "tiny", "10.244.7.0/30", 30)
	if _, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "h1"}); err != nil {
		t.Fatal(err)
	}
	asg, err := a.Assign(ctx, AssignRequest{Node: "n2", Handle: "h2"})
	if err != nil || !asg.Borrowed {
		t.Fatalf("want a borrowed address for n2: %+v %v", asg, err)
	}
	blocks, borrowed, err := a.BGPState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantBlocks, err := a.Blocks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantBorrowed, err := a.Borrowed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantBlocks, blocks, cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
		t.Errorf("blocks (-Blocks +BGPState):\n%s", diff)
	}
	if diff := cmp.Diff(wantBorrowed, borrowed, cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})); diff != "" {
		t.Errorf("borrowed (-Borrowed +BGPState):\n%s", diff)
	}
	if len(borrowed) != 1 || borrowed[0].Node != "n2" {
		t.Errorf("borrowed %+v, want n2's address", borrowed)
	}
}
