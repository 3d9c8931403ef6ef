package ipam

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tabbynet/tabby/datastore"
)

// storedSummary reads a block's summary record: its decoded value and
// revision, or ok false when there is none.
func storedSummary(t *testing.T, s *datastore.Store, cidr netip.Prefix) (BlockSummary, int64, bool) {
	t.Helper()
	kv, err := s.GetKV(testCtx(t), summaryKey(cidr))
	if errors.Is(err, datastore.ErrNotFound) {
		return BlockSummary{}, 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	sum, err := DecodeSummaryRecord(kv.Key, kv.Value)
	if err != nil {
		t.Fatal(err)
	}
	return sum, kv.ModRevision, true
}

func blockRev(t *testing.T, s *datastore.Store, cidr netip.Prefix) int64 {
	t.Helper()
	kv, err := s.GetKV(testCtx(t), blockKey(cidr))
	if err != nil {
		t.Fatal(err)
	}
	return kv.ModRevision
}

// TestSummaryFollowsBlock: the summary is written in the block's
// transaction when the block is claimed, not rewritten by the affine
// node's own pods, rewritten when an address is borrowed or given back and
// when the block loses its affinity, and deleted with the block.
func TestSummaryFollowsBlock(t *testing.T) {
	a, s := newTestAllocator(t)
	ctx := testCtx(t)
	setupTiny(t, a) // 10.244.0.0/28 in /30s: n1 fills one, n2..n4 claim the rest
	blk := mustAssign(t, a, "n2", "first-n2").Block
	sum, claimRev, ok := storedSummary(t, s, blk)
	if !ok {
		t.Fatalf("no summary for %s", blk)
	}
	if diff := cmp.Diff(BlockSummary{CIDR: blk, Affinity: "n2", Pool: "tiny"}, sum); diff != "" {
		t.Errorf("summary after the claim (-want +got):\n%s", diff)
	}

	// n2's own second pod: the block changes, the summary does not.
	own := mustAssign(t, a, "n2", "second-n2")
	if own.Block != blk || own.Borrowed {
		t.Fatalf("n2's second pod %+v: want it in %s", own, blk)
	}
	if _, rev, _ := storedSummary(t, s, blk); rev != claimRev || blockRev(t, s, blk) == claimRev {
		t.Errorf("summary revision %d after an own pod, want %d unchanged (block moved to %d)", rev, claimRev, blockRev(t, s, blk))
	}

	// n1 borrows (every block is claimed): the lender's summary lists it,
	// written at the block's revision.
	b := mustAssign(t, a, "n1", "borrower")
	if !b.Borrowed {
		t.Fatalf("n1's fifth pod %+v: want borrowed", b)
	}
	lend, rev, _ := storedSummary(t, s, b.Block)
	if rev != blockRev(t, s, b.Block) {
		t.Errorf("summary of %s at revision %d, block at %d: want one transaction", b.Block, rev, blockRev(t, s, b.Block))
	}
	if len(lend.Borrowed) != 1 || lend.Borrowed[0].Addr != b.Addr || lend.Borrowed[0].Node != "n1" {
		t.Errorf("summary of %s lists borrowed %+v, want %s for n1", b.Block, lend.Borrowed, b.Addr)
	}

	// Given back: the summary drops it.
	if err := a.ReleaseHandle(ctx, "borrower"); err != nil {
		t.Fatal(err)
	}
	if lend, _, _ = storedSummary(t, s, b.Block); len(lend.Borrowed) != 0 {
		t.Errorf("summary of %s after the release lists %+v, want none", b.Block, lend.Borrowed)
	}

	// n2 leaves without freeing its addresses: its block keeps them, without
	// affinity, and the summary says so (its addresses are now borrowed).
	if err := a.ReleaseNode(ctx, "n2", false); err != nil {
		t.Fatal(err)
	}
	sum, _, _ = storedSummary(t, s, blk)
	if sum.Affinity != "" || len(sum.Borrowed) != 2 {
		t.Errorf("summary after n2's release: %+v, want no affinity and two borrowed addresses", sum)
	}
	// The last address freed deletes the unowned block and its summary.
	for _, h := range []string{"first-n2", "second-n2"} {
		if err := a.ReleaseHandle(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, ok := storedSummary(t, s, blk); ok {
		t.Errorf("summary of %s still there after its block was deleted", blk)
	}
	mustCheckClean(t, a)
}

// TestSyncSummaries: blocks without summaries (written before summaries
// existed), a stale summary and one whose block is gone are repaired, once.
func TestSyncSummaries(t *testing.T) {
	a, s := newTestAllocator(t)
	ctx := testCtx(t)
	setupTiny(t, a)
	b := mustAssign(t, a, "n1", "borrower")
	// An old release wrote these blocks: no summaries at all.
	for _, cidr := range []string{"10.244.0.0/30", "10.244.0.4/30"} {
		if err := s.DeleteKV(ctx, summaryKey(netip.MustParsePrefix(cidr)), 0); err != nil {
			t.Fatal(err)
		}
	}
	// A summary that missed a borrow (an old agent borrowed), and one of a
	// block deleted by an old agent.
	stale := b.Block
	if _, err := s.PutKV(ctx, summaryKey(stale), encodeSummary(BlockSummary{CIDR: stale, Affinity: "n4", Pool: "tiny"}), 0); err != nil {
		t.Fatal(err)
	}
	gone := netip.MustParsePrefix("10.244.1.0/30")
	if _, err := s.PutKV(ctx, summaryKey(gone), encodeSummary(BlockSummary{CIDR: gone, Affinity: "n9"}), 0); err != nil {
		t.Fatal(err)
	}
	r, err := a.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(r.Inconsistencies); got < 3 {
		t.Errorf("check before the sync: %d inconsistencies %+v, want missing, stale and orphan summaries", got, r.Inconsistencies)
	}
	n, err := a.SyncSummaries(ctx)
	if err != nil || n < 4 {
		t.Fatalf("SyncSummaries = %d, %v; want at least 4 records fixed", n, err)
	}
	mustCheckClean(t, a)
	if n, err := a.SyncSummaries(ctx); n != 0 || err != nil {
		t.Errorf("second SyncSummaries = %d, %v; want nothing to do", n, err)
	}
	sum, _, _ := storedSummary(t, s, stale)
	if len(sum.Borrowed) != 1 || sum.Borrowed[0].Addr != b.Addr {
		t.Errorf("repaired summary of %s: %+v, want %s borrowed", stale, sum, b.Addr)
	}
}

// TestDecodeSummaryRecord: what a summary record may not say.
func TestDecodeSummaryRecord(t *testing.T) {
	key := summaryKey(netip.MustParsePrefix("10.244.0.0/30"))
	for _, tc := range []struct{ name, val, want string }{
		{"not json", `{`, "decoding block summary"},
		{"bad cidr", `{"cidr":"10.244.0.1/30"}`, "is not a masked prefix"},
		{"other block", `{"cidr":"10.244.0.4/30"}`, "holds block"},
		{"affinity", `{"cidr":"10.244.0.0/30","affinity":"n1"}`, "want host:<node>"},
		{"outside", `{"cidr":"10.244.0.0/30","borrowed":[{"addr":"10.244.0.9","node":"n2"}]}`, "borrowed[0].addr 10.244.0.9 is outside the block"},
		{"own node", `{"cidr":"10.244.0.0/30","affinity":"host:n1","borrowed":[{"addr":"10.244.0.1","node":"n1"}]}`, "is the block's own node"},
		{"order", `{"cidr":"10.244.0.0/30","borrowed":[{"addr":"10.244.0.2","node":"n2"},{"addr":"10.244.0.1","node":"n2"}]}`, "must ascend"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeSummaryRecord(key, []byte(tc.val))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("DecodeSummaryRecord(%s) = %v, want an error with %q", tc.val, err, tc.want)
			}
		})
	}
}
