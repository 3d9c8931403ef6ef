package ipam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/tabbynet/tabby/datastore"
)

// Block summaries: what other nodes need from a block, in a record of its
// own. A block record (≈ 8 KB for a /26) is rewritten by every pod added
// or removed in it; every agent used to receive and decode each rewrite
// through its cluster view. The summary record (ipam/block-summaries/<block>)
// holds only the block's CIDR, pool, affinity and the addresses other
// nodes borrowed from it, and is written in the same transaction as the
// block, only when one of those changes. The view watches summaries and
// never receives blocks (see syncer), so a pod added in its own node's
// block costs other agents nothing.
//
// The key sorts before ipam/blocks/ ('-' < 's'), so the keys the view
// needs and those it skips (blocks, handles, LoadBalancer records,
// Kubernetes records) are two contiguous ranges.
const blockSummariesPrefix = "ipam/block-summaries/"

// BlockSummariesPrefix is where the block summary records live, relative to
// the datastore prefix.
const BlockSummariesPrefix = blockSummariesPrefix

func summaryKey(p netip.Prefix) string { return blockSummariesPrefix + blockName(p) }

// summaryRecord is the JSON stored at ipam/block-summaries/<block>.
type summaryRecord struct {
	CIDR     string           `json:"cidr"`
	Affinity string           `json:"affinity,omitempty"` // the affine node, as the block's "host:<node>"
	Pool     string           `json:"pool,omitempty"`
	Borrowed []borrowedRecord `json:"borrowed,omitempty"`
}

type borrowedRecord struct {
	Addr netip.Addr `json:"addr"`
	Node string     `json:"node"`
}

// summary is what the block's summary record must say.
func (b *block) summary() BlockSummary {
	s := BlockSummary{CIDR: b.cidr, Affinity: b.node, Pool: b.pool}
	for ord, a := range b.allocations {
		if a == nil {
			continue
		}
		if n := b.attrs[*a].Node; n != b.node {
			s.Borrowed = append(s.Borrowed, BorrowedAddr{Addr: addrAt(b.cidr, ord), Node: n, Block: b.cidr, BlockNode: b.node})
		}
	}
	return s
}

func encodeSummary(s BlockSummary) []byte {
	r := summaryRecord{CIDR: s.CIDR.String(), Pool: s.Pool}
	if s.Affinity != "" {
		r.Affinity = affinityPrefix + s.Affinity
	}
	for _, b := range s.Borrowed {
		r.Borrowed = append(r.Borrowed, borrowedRecord{Addr: b.Addr, Node: b.Node})
	}
	out, err := json.Marshal(r)
	if err != nil {
		panic(fmt.Sprintf("encoding block summary %s: %v", s.CIDR, err)) // strings and addresses only
	}
	return out
}

// DecodeSummaryRecord decodes the block summary record stored at key
// (under BlockSummariesPrefix). BorrowedAddr.DisableBGPExport is left
// false: it is a property of the pool, which the caller knows.
func DecodeSummaryRecord(key string, val []byte) (BlockSummary, error) {
	var r summaryRecord
	if err := json.Unmarshal(val, &r); err != nil {
		return BlockSummary{}, fmt.Errorf("decoding block summary: %w", err)
	}
	cidr, err := netip.ParsePrefix(r.CIDR)
	if err != nil || !validBlockPrefix(cidr) {
		return BlockSummary{}, fmt.Errorf("decoding block summary: cidr %q is not a masked prefix of at most %d addresses", r.CIDR, 1<<maxBlockHostBits)
	}
	if name, ok := strings.CutPrefix(key, blockSummariesPrefix); ok && name != blockName(cidr) {
		return BlockSummary{}, &keyMismatchError{key: key, cidr: cidr}
	}
	s := BlockSummary{CIDR: cidr, Pool: r.Pool}
	if r.Affinity != "" {
		node, ok := strings.CutPrefix(r.Affinity, affinityPrefix)
		if !ok || node == "" {
			return BlockSummary{}, fmt.Errorf("decoding block summary %s: affinity %q: want host:<node>", cidr, r.Affinity)
		}
		s.Affinity = node
	}
	for i, b := range r.Borrowed {
		switch {
		case !cidr.Contains(b.Addr) || b.Addr.Zone() != "":
			return BlockSummary{}, fmt.Errorf("decoding block summary %s: borrowed[%d].addr %s is outside the block", cidr, i, b.Addr)
		case b.Node == s.Affinity:
			return BlockSummary{}, fmt.Errorf("decoding block summary %s: borrowed[%d].node %q is the block's own node", cidr, i, b.Node)
		case i > 0 && !r.Borrowed[i-1].Addr.Less(b.Addr):
			return BlockSummary{}, fmt.Errorf("decoding block summary %s: borrowed[%d].addr %s: addresses must ascend", cidr, i, b.Addr)
		}
		s.Borrowed = append(s.Borrowed, BorrowedAddr{Addr: b.Addr, Node: b.Node, Block: cidr, BlockNode: s.Affinity})
	}
	return s, nil
}

// ParseSummaryKey returns the CIDR a summary key (under
// BlockSummariesPrefix) names, whatever its record holds.
func ParseSummaryKey(key string) (netip.Prefix, error) {
	name, ok := strings.CutPrefix(key, blockSummariesPrefix)
	if !ok {
		return netip.Prefix{}, fmt.Errorf("block summary key %q: wrong prefix", key)
	}
	return parseBlockName(name)
}

// summaryOps returns the write that keeps a block's summary record in step
// with a write of the block from old to nb (nil: absent, or nb.rev -1:
// deleted). It belongs in the block's transaction, whose comparison on the
// block's revision makes old the stored block: the summary is rewritten
// only when what it says changes, so a pod added in its node's block
// writes nothing here.
func summaryOps(old, nb *block) []datastore.Op {
	switch {
	case nb == nil || nb.rev < 0:
		if old == nil {
			return nil
		}
		return []datastore.Op{{Key: summaryKey(old.cidr), Delete: true}}
	case old != nil && old.summary().Equal(nb.summary()):
		return nil
	}
	return []datastore.Op{{Key: summaryKey(nb.cidr), Value: encodeSummary(nb.summary())}}
}

// SyncSummaries writes the summary records that are missing or disagree
// with their block, and deletes those whose block is gone: blocks written
// before summaries existed (an upgrade), or by an agent of an older
// release during a rolling upgrade. Each write compares the block's and
// the summary's revisions with what was read, so it never undoes a newer
// write; one that loses such a race is left to the writer that won it (or
// to the next call). Undecodable blocks are left alone (the view keeps
// their summary as it was). It returns how many records it wrote or
// deleted. The agent calls it at start.
//
// It reads the value of a block only when the block may have been written
// without its summary: its summary is missing or does not decode, or the
// block changed after the revision the last complete call recorded
// (summariesCheckedKey); the others it knows by key and revision (a
// keys-only list). A call whose reads and writes all succeeded (a lost
// race is left to its winner, an undecodable block alone, as ever)
// records the revision of its list of blocks, when a block was written
// since the record it read: a start with nothing new writes nothing.
// Without a record, or with one that cannot be this store's (another etcd
// cluster's, or see summariesChecked), it reads every block.
func (a *Allocator) SyncSummaries(ctx context.Context) (int, error) {
	checked, err := a.summariesChecked(ctx)
	if err != nil {
		return 0, fmt.Errorf("ipam: syncing block summaries: %w", err)
	}
	brevs, rev, err := a.store.ListRevisions(ctx, blocksPrefix)
	if err != nil {
		return 0, fmt.Errorf("ipam: syncing block summaries: listing blocks: %w", err)
	}
	cluster := a.store.ClusterID()
	if cluster == 0 || checked.Cluster != cluster {
		// Written in another etcd cluster's history (a datastore copied
		// key by key), or before records named theirs: its revision says
		// nothing about this cluster's writes.
		checked.Revision = 0
	}
	skvs, _, err := a.store.ListKV(ctx, blockSummariesPrefix)
	if err != nil {
		return 0, fmt.Errorf("ipam: syncing block summaries: listing summaries: %w", err)
	}
	stored := map[string]datastore.KV{}
	for _, kv := range skvs {
		stored[kv.Key] = kv
	}
	bkvs, err := a.blocksToCheck(ctx, brevs, stored, checked.Revision)
	if err != nil {
		return 0, fmt.Errorf("ipam: syncing block summaries: %w", err)
	}
	// The summaries of blocks that do not exist.
	orphans := maps.Clone(stored)
	for _, kv := range brevs {
		delete(orphans, blockSummariesPrefix+strings.TrimPrefix(kv.Key, blocksPrefix))
	}
	blocks, bad := decodeBlocks(bkvs)
	n := 0
	var errs []error
	for _, b := range blocks {
		key := summaryKey(b.cidr)
		cur, had := stored[key]
		want := b.summary()
		if had {
			if s, err := DecodeSummaryRecord(key, cur.Value); err == nil && s.Equal(want) {
				continue
			}
		}
		ok, err := a.syncSummary(ctx, []datastore.Cmp{{Key: blockKey(b.cidr), ModRevision: b.rev}, {Key: key, ModRevision: cur.ModRevision}},
			datastore.Op{Key: key, Value: encodeSummary(want)})
		n, errs = count(n, ok), append(errs, err)
	}
	for key, cur := range orphans {
		cidr, err := ParseSummaryKey(key)
		if err != nil || bad[blockKey(cidr)] != nil {
			continue
		}
		// The block is gone: it must still be absent (not created since).
		ok, err := a.syncSummary(ctx, []datastore.Cmp{{Key: blockKey(cidr), ModRevision: 0}, {Key: key, ModRevision: cur.ModRevision}},
			datastore.Op{Key: key, Delete: true})
		n, errs = count(n, ok), append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return n, err
	}
	if latest := maxModRevision(brevs); latest <= checked.Revision {
		// No block was written since the record: it says all there is.
		return n, nil
	}
	return n, a.recordSummariesChecked(ctx, checked, checkedRecord{Revision: rev, Cluster: cluster})
}

func maxModRevision(kvs []datastore.KV) int64 {
	var m int64
	for _, kv := range kvs {
		m = max(m, kv.ModRevision)
	}
	return m
}

// blocksToCheck returns the block records SyncSummaries must read, with
// their values: those whose summary is missing or does not decode, and
// those written after revision since (all of them when since is 0, in
// one list). Few are read one by one; many in one list of every block.
func (a *Allocator) blocksToCheck(ctx context.Context, brevs []datastore.KV, stored map[string]datastore.KV, since int64) ([]datastore.KV, error) {
	var keys []string
	for _, kv := range brevs {
		skey := blockSummariesPrefix + strings.TrimPrefix(kv.Key, blocksPrefix)
		cur, had := stored[skey]
		switch {
		case since == 0, kv.ModRevision > since, !had:
			keys = append(keys, kv.Key)
		default:
			if _, err := DecodeSummaryRecord(skey, cur.Value); err != nil {
				keys = append(keys, kv.Key)
			}
		}
	}
	if since == 0 || len(keys) > maxBlockGets {
		kvs, _, err := a.store.ListKV(ctx, blocksPrefix)
		if err != nil {
			return nil, fmt.Errorf("listing blocks: %w", err)
		}
		return kvs, nil
	}
	var out []datastore.KV
	for _, key := range keys {
		kv, err := a.store.GetKV(ctx, key)
		switch {
		case errors.Is(err, datastore.ErrNotFound):
			// Deleted since the list: its summary goes with it, or is an
			// orphan the next call deletes.
		case err != nil:
			return nil, fmt.Errorf("reading block %s: %w", key, err)
		default:
			out = append(out, kv)
		}
	}
	return out, nil
}

// maxBlockGets is how many blocks SyncSummaries reads one by one; past it,
// one list of every block costs fewer round trips.
const maxBlockGets = 64

// summariesCheckedKey records the revision up to which every block's
// summary was found or made current, by the last SyncSummaries whose
// writes all succeeded: a block not written since has the summary it had then,
// since every writer of this release writes a block's summary in the
// block's transaction. It lies in a range the agents' views do not watch
// (syncer's WatchSpec skips ipam/blocks/ up to resources/), so writing it
// costs them nothing, and outside the prefixes of blocks, handles and
// LoadBalancer records (Check's list of ipam/ passes over it).
const summariesCheckedKey = "ipam/summaries-checked"

// checkedRecord is the JSON stored at summariesCheckedKey.
type checkedRecord struct {
	// Revision is the store revision of the list of blocks of the call
	// that wrote the record.
	Revision int64 `json:"revision"`
	// Cluster is the ID of the etcd cluster whose revision it is; a
	// record of another cluster is not trusted (SyncSummaries).
	Cluster uint64 `json:"cluster,omitempty"`
	// modRev is the record's own revision (0: absent), which its next
	// write compares.
	modRev int64
}

// summariesChecked reads the record. An absent or undecodable one says
// nothing (Revision 0): every block is read. So does one whose revision is
// not below its own: it was written after the list it names, in this
// store, so a record that is not is from another store's history (a
// datastore copied into a new etcd restarts revisions), where revisions
// say nothing about this one's writes.
func (a *Allocator) summariesChecked(ctx context.Context) (checkedRecord, error) {
	kv, err := a.store.GetKV(ctx, summariesCheckedKey)
	switch {
	case errors.Is(err, datastore.ErrNotFound):
		return checkedRecord{}, nil
	case err != nil:
		return checkedRecord{}, fmt.Errorf("reading %s: %w", summariesCheckedKey, err)
	}
	var r checkedRecord
	if err := json.Unmarshal(kv.Value, &r); err != nil || r.Revision < 0 || r.Revision >= kv.ModRevision {
		r.Revision = 0
	}
	r.modRev = kv.ModRevision
	return r, nil
}

// recordSummariesChecked writes next, unless the record already says as
// much or was rewritten since it was read (by another agent's call, whose
// record is as good).
func (a *Allocator) recordSummariesChecked(ctx context.Context, prev, next checkedRecord) error {
	if next.Revision <= prev.Revision {
		return nil
	}
	val, err := json.Marshal(next)
	if err != nil {
		return fmt.Errorf("ipam: encoding %s: %w", summariesCheckedKey, err)
	}
	_, err = a.store.Txn(ctx, []datastore.Cmp{{Key: summariesCheckedKey, ModRevision: prev.modRev}},
		[]datastore.Op{{Key: summariesCheckedKey, Value: val}})
	if err != nil && !errors.Is(err, datastore.ErrConflict) {
		return fmt.Errorf("ipam: recording checked block summaries: %w", err)
	}
	return nil
}

func count(n int, ok bool) int {
	if ok {
		return n + 1
	}
	return n
}

// syncSummary writes one summary fix; a lost race is no error.
func (a *Allocator) syncSummary(ctx context.Context, cmps []datastore.Cmp, op datastore.Op) (bool, error) {
	_, err := a.store.Txn(ctx, cmps, []datastore.Op{op})
	switch {
	case errors.Is(err, datastore.ErrConflict):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("ipam: writing block summary %s: %w", op.Key, err)
	}
	return true, nil
}

// checkSummaries reports the summary records that disagree with their
// block (SyncSummaries repairs them). Unreadable records are already
// reported as such.
func checkSummaries(s *snapshot, add func(kind, key, format string, args ...any)) {
	if s.summaries == nil {
		return // not read
	}
	seen := map[netip.Prefix]bool{}
	for _, b := range s.blocks {
		seen[b.cidr] = true
		got, ok := s.summaries[b.cidr]
		switch want := b.summary(); {
		case !ok && s.bad[summaryKey(b.cidr)] == nil:
			add(SummaryMismatch, summaryKey(b.cidr), "block %s has no summary record", b.cidr)
		case ok && !got.Equal(want):
			add(SummaryMismatch, summaryKey(b.cidr), "summary of block %s says affinity %q, pool %q, %d borrowed; the block %q, %q, %d",
				b.cidr, got.Affinity, got.Pool, len(got.Borrowed), want.Affinity, want.Pool, len(want.Borrowed))
		}
	}
	for _, cidr := range slices.SortedFunc(maps.Keys(s.summaries), comparePrefix) {
		if !seen[cidr] && s.bad[blockKey(cidr)] == nil {
			add(SummaryMismatch, summaryKey(cidr), "summary of block %s, which does not exist", cidr)
		}
	}
}
