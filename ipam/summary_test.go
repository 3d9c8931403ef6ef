package ipam

import (
	"context"
	"encoding/json"
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

// blockReads is a store that records the reads of block values, and
// counts its writes.
type blockReads struct {
	*datastore.Store
	gets  []string
	lists int
	txns  int
}

func (r *blockReads) Txn(ctx context.Context, cmps []datastore.Cmp, ops []datastore.Op) (int64, error) {
	r.txns++
	return r.Store.Txn(ctx, cmps, ops)
}

func (r *blockReads) GetKV(ctx context.Context, key string) (datastore.KV, error) {
	if strings.HasPrefix(key, blocksPrefix) {
		r.gets = append(r.gets, key)
	}
	return r.Store.GetKV(ctx, key)
}

func (r *blockReads) ListKV(ctx context.Context, prefix string) ([]datastore.KV, int64, error) {
	if strings.HasPrefix(blocksPrefix, prefix) {
		r.lists++
	}
	return r.Store.ListKV(ctx, prefix)
}

// syncWith runs SyncSummaries as a starting agent would (an allocator of
// its own) and returns what it read of blocks.
func syncWith(t *testing.T, s *datastore.Store) (int, *blockReads) {
	t.Helper()
	r := &blockReads{Store: s}
	n, err := newAllocator(r).SyncSummaries(testCtx(t))
	if err != nil {
		t.Fatalf("SyncSummaries: %v", err)
	}
	return n, r
}

// oldReleaseWrites changes blocks as an agent of a release before
// summaries would: a borrow in n2's block (its summary now stale), n3's
// block without a summary (as a new block of that release), n4's block
// deleted (its summary an orphan). It returns the blocks whose values a
// check must read.
func oldReleaseWrites(t *testing.T, s *datastore.Store) []string {
	t.Helper()
	ctx := testCtx(t)
	lender, missing, gone := netip.MustParsePrefix("10.244.0.4/30"), netip.MustParsePrefix("10.244.0.8/30"), netip.MustParsePrefix("10.244.0.12/30")
	kv, err := s.GetKV(ctx, blockKey(lender))
	if err != nil {
		t.Fatal(err)
	}
	b, err := decodeBlock(kv.Value, kv.ModRevision)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := b.allocate(attrRecord{Handle: "old-borrow", Node: "n1"}); !ok {
		t.Fatal("no room in n2's block")
	}
	if _, err := s.PutKV(ctx, blockKey(lender), b.encode(), 0); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteKV(ctx, summaryKey(missing), 0); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteKV(ctx, blockKey(gone), 0); err != nil {
		t.Fatal(err)
	}
	return []string{blockKey(lender), blockKey(missing)}
}

// TestSyncSummariesReadsChangedBlocksOnly: once a call found every summary
// current, the next start reads no block value; after blocks were written
// without their summaries (an older release), it reads those blocks only,
// one by one, and repairs each summary.
func TestSyncSummariesReadsChangedBlocksOnly(t *testing.T) {
	a, s := newTestAllocator(t)
	setupTiny(t, a)
	mustAssign(t, a, "n1", "borrower")
	if n, r := syncWith(t, s); n != 0 || r.lists != 1 {
		t.Fatalf("first check: %d written, %d lists of blocks; want 0 written and every block read (no record yet)", n, r.lists)
	}
	n, r := syncWith(t, s)
	if n != 0 || r.lists != 0 || len(r.gets) != 0 || r.txns != 0 {
		t.Errorf("start with current summaries: %d written, read %d lists and %v of blocks, %d writes; want nothing", n, r.lists, r.gets, r.txns)
	}

	want := oldReleaseWrites(t, s)
	n, r = syncWith(t, s)
	if n != 3 {
		t.Errorf("after an older release's writes: %d records fixed, want 3 (stale, missing, orphan)", n)
	}
	if r.lists != 0 || !cmp.Equal(r.gets, want) {
		t.Errorf("after an older release's writes: read %d lists of blocks and %v, want only %v", r.lists, r.gets, want)
	}
	for _, cidr := range []string{"10.244.0.0/30", "10.244.0.4/30", "10.244.0.8/30"} {
		p := netip.MustParsePrefix(cidr)
		kv, err := s.GetKV(testCtx(t), blockKey(p))
		if err != nil {
			t.Fatal(err)
		}
		b, err := decodeBlock(kv.Value, kv.ModRevision)
		if err != nil {
			t.Fatal(err)
		}
		if sum, _, ok := storedSummary(t, s, p); !ok || !sum.Equal(b.summary()) {
			t.Errorf("summary of %s after the check: %+v (present %v), want %+v", p, sum, ok, b.summary())
		}
	}
	if _, _, ok := storedSummary(t, s, netip.MustParsePrefix("10.244.0.12/30")); ok {
		t.Error("the deleted block's summary is still there")
	}
	if n, r := syncWith(t, s); n != 0 || r.lists != 0 || len(r.gets) != 0 || r.txns != 0 {
		t.Errorf("the start after: %d written, read %d lists and %v of blocks, %d writes; want nothing", n, r.lists, r.gets, r.txns)
	}
}

// TestSyncSummariesUnreadableRecord: a summary that does not decode has
// its block read and is rewritten, whatever the record says; and a record
// naming a revision not below its own (another store's history) makes the
// check read every block, as does one of another etcd cluster.
func TestSyncSummariesUnreadableRecord(t *testing.T) {
	a, s := newTestAllocator(t)
	ctx := testCtx(t)
	setupTiny(t, a)
	syncWith(t, s)
	blk := netip.MustParsePrefix("10.244.0.4/30")
	if _, err := s.PutKV(ctx, summaryKey(blk), []byte("{"), 0); err != nil {
		t.Fatal(err)
	}
	if n, r := syncWith(t, s); n != 1 || !cmp.Equal(r.gets, []string{blockKey(blk)}) || r.lists != 0 {
		t.Errorf("with an undecodable summary: %d written, read %v and %d lists; want it rewritten from its block alone", n, r.gets, r.lists)
	}
	if _, err := s.PutKV(ctx, summariesCheckedKey, []byte(`{"revision":1000000}`), 0); err != nil {
		t.Fatal(err)
	}
	if _, r := syncWith(t, s); r.lists != 1 {
		t.Errorf("with a record from another history: %d lists of blocks, want every block read", r.lists)
	}
	if _, r := syncWith(t, s); r.lists != 0 || len(r.gets) != 0 {
		t.Errorf("after it: read %d lists and %v of blocks, want the record current again", r.lists, r.gets)
	}

	// The record names its etcd cluster: one whose revision would pass but
	// whose cluster is another (a datastore copied key by key into a new
	// cluster) is not trusted either.
	kv, err := s.GetKV(ctx, summariesCheckedKey)
	if err != nil {
		t.Fatal(err)
	}
	var rec checkedRecord
	if err := json.Unmarshal(kv.Value, &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Cluster == 0 || rec.Cluster != s.ClusterID() {
		t.Fatalf("record %s names cluster %d, want this store's %d", kv.Value, rec.Cluster, s.ClusterID())
	}
	other, err := json.Marshal(checkedRecord{Revision: rec.Revision, Cluster: rec.Cluster + 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutKV(ctx, summariesCheckedKey, other, 0); err != nil {
		t.Fatal(err)
	}
	if _, r := syncWith(t, s); r.lists != 1 {
		t.Errorf("with a record of another etcd cluster: %d lists of blocks, want every block read", r.lists)
	}
	if _, r := syncWith(t, s); r.lists != 0 || len(r.gets) != 0 {
		t.Errorf("after it: read %d lists and %v of blocks, want the record this cluster's again", r.lists, r.gets)
	}
}
