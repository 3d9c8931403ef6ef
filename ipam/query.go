package ipam

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// AddressesByHandle returns the addresses the handle holds, sorted; none
// (and no error) for an unknown handle.
func (a *Allocator) AddressesByHandle(ctx context.Context, handleID string) ([]netip.Addr, error) {
	h, err := a.getHandle(ctx, handleID)
	if err != nil || h == nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(h.Addrs))
	for _, ha := range h.Addrs {
		out = append(out, ha.Addr)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// BlockInfo is a block as BGP sees it.
type BlockInfo struct {
	CIDR netip.Prefix
	Pool string
	// Affinity is the affine node, "" for none.
	Affinity string
	// Confirmed: the node's affinity record exists and is confirmed.
	Confirmed        bool
	DisableBGPExport bool
}

// Blocks returns every block, sorted by CIDR.
func (a *Allocator) Blocks(ctx context.Context) ([]BlockInfo, error) {
	pools, blocks, err := a.poolsAndBlocks(ctx)
	if err != nil {
		return nil, err
	}
	return a.blockInfos(ctx, pools, blocks)
}

// BGPState returns what Blocks and Borrowed return, from one read of the
// pools and blocks: what a node's BGP pass needs.
func (a *Allocator) BGPState(ctx context.Context) ([]BlockInfo, []BorrowedAddr, error) {
	pools, blocks, err := a.poolsAndBlocks(ctx)
	if err != nil {
		return nil, nil, err
	}
	infos, err := a.blockInfos(ctx, pools, blocks)
	if err != nil {
		return nil, nil, err
	}
	return infos, borrowedAddrs(pools, blocks), nil
}

func (a *Allocator) blockInfos(ctx context.Context, pools []poolInfo, blocks []*block) ([]BlockInfo, error) {
	affs, err := a.listAffinities(ctx, affinitiesPrefix)
	if err != nil {
		return nil, err
	}
	confirmed := map[string]bool{}
	for _, af := range affs {
		confirmed[affinityKey(af.node, af.block)] = af.state == affinityConfirmed
	}
	out := make([]BlockInfo, 0, len(blocks))
	for _, b := range blocks {
		bi := BlockInfo{CIDR: b.cidr, Pool: b.pool, Affinity: b.node}
		if b.node != "" {
			bi.Confirmed = confirmed[affinityKey(b.node, b.cidr)]
		}
		if p, ok := poolFor(pools, b.cidr); ok {
			bi.Pool = p.name
			bi.DisableBGPExport = p.pool.Spec.DisableBGPExport
		}
		out = append(out, bi)
	}
	slices.SortFunc(out, func(x, y BlockInfo) int { return comparePrefix(x.CIDR, y.CIDR) })
	return out, nil
}

// BorrowedAddr is an address allocated for a node from a block that is not
// affine to it.
type BorrowedAddr struct {
	Addr netip.Addr
	// Node is the node using the address.
	Node  string
	Block netip.Prefix
	// BlockNode is the block's affine node, "" for none.
	BlockNode        string
	DisableBGPExport bool
}

// Borrowed returns every borrowed address, sorted by address.
func (a *Allocator) Borrowed(ctx context.Context) ([]BorrowedAddr, error) {
	pools, blocks, err := a.poolsAndBlocks(ctx)
	if err != nil {
		return nil, err
	}
	return borrowedAddrs(pools, blocks), nil
}

func borrowedAddrs(pools []poolInfo, blocks []*block) []BorrowedAddr {
	var out []BorrowedAddr
	for _, b := range blocks {
		p, hasPool := poolFor(pools, b.cidr)
		b.allocated(func(addr netip.Addr, attr attrRecord) {
			if attr.Node == b.node {
				return
			}
			out = append(out, BorrowedAddr{Addr: addr, Node: attr.Node, Block: b.cidr, BlockNode: b.node,
				DisableBGPExport: hasPool && p.pool.Spec.DisableBGPExport})
		})
	}
	slices.SortFunc(out, func(x, y BorrowedAddr) int { return x.Addr.Compare(y.Addr) })
	return out
}

// poolsAndBlocks reads the pools and the blocks that decode.
func (a *Allocator) poolsAndBlocks(ctx context.Context) ([]poolInfo, []*block, error) {
	pools, err := a.listPools(ctx)
	if err != nil {
		return nil, nil, err
	}
	blocks, _, err := a.listBlocks(ctx)
	if err != nil {
		return nil, nil, err
	}
	return pools, blocks, nil
}

// Allocation is one allocated address and what its block records about it.
type Allocation struct {
	Addr  netip.Addr
	Block netip.Prefix
	// BlockNode is the block's affine node, "" for none.
	BlockNode string
	Handle    string
	// Node is the node using the address.
	Node        string
	Namespace   string
	Pod         string
	ContainerID string
	// Time is when the address was allocated.
	Time time.Time
}

// IsBorrowed reports an address used by a node other than its block's.
func (al Allocation) IsBorrowed() bool { return al.Node != al.BlockNode }

// Allocations returns every allocated address, sorted by address. Blocks
// that do not decode are skipped: Check reports them.
func (a *Allocator) Allocations(ctx context.Context) ([]Allocation, error) {
	blocks, _, err := a.listBlocks(ctx)
	if err != nil {
		return nil, err
	}
	var out []Allocation
	for _, b := range blocks {
		out = b.appendAllocations(out)
	}
	slices.SortFunc(out, func(x, y Allocation) int { return x.Addr.Compare(y.Addr) })
	return out, nil
}

// Lookup returns the allocation of addr; false when no block holds it
// allocated.
func (a *Allocator) Lookup(ctx context.Context, addr netip.Addr) (Allocation, bool, error) {
	if addr.Zone() != "" || addr.Is4In6() {
		return Allocation{}, false, nil
	}
	b, err := a.findBlock(ctx, addr)
	if err != nil || b == nil {
		return Allocation{}, false, err
	}
	ord, _ := ordinal(b.cidr, addr)
	attr, held := b.attrAt(ord)
	if !held {
		return Allocation{}, false, nil
	}
	return b.allocation(addr, attr), true, nil
}

// Check cross-checks blocks, affinities, handles and workload endpoints and
// reports leaks, orphan handles and inconsistencies. It only reads. The
// IPAM records are read in one consistent list; endpoints right after, so
// that an endpoint written meanwhile is seen rather than reported missing.
func (a *Allocator) Check(ctx context.Context) (Report, error) {
	s, err := a.loadSnapshot(ctx, true)
	if err != nil {
		return Report{}, err
	}
	return checkSnapshot(s, a.now(), a.leakGrace), nil
}

// Usage returns per-pool and per-block address usage, pools sorted by name.
func (a *Allocator) Usage(ctx context.Context) ([]PoolUsage, error) {
	s, err := a.loadSnapshot(ctx, false)
	if err != nil {
		return nil, err
	}
	return usage(s), nil
}

func (a *Allocator) loadSnapshot(ctx context.Context, withEndpoints bool) (*snapshot, error) {
	kvs, rev, err := a.store.ListKV(ctx, "ipam/")
	if err != nil {
		return nil, fmt.Errorf("listing ipam records: %w", err)
	}
	s := &snapshot{rev: rev, bad: map[string]error{}, summaries: map[netip.Prefix]BlockSummary{}}
	var blockKVs []datastore.KV
	for _, kv := range kvs {
		switch {
		case strings.HasPrefix(kv.Key, blocksPrefix):
			blockKVs = append(blockKVs, kv)
		case strings.HasPrefix(kv.Key, blockSummariesPrefix):
			sum, err := DecodeSummaryRecord(kv.Key, kv.Value)
			if err != nil {
				s.bad[kv.Key] = err
				continue
			}
			s.summaries[sum.CIDR] = sum
		case strings.HasPrefix(kv.Key, affinitiesPrefix):
			af, err := decodeAffinity(kv.Key, kv.Value, kv.ModRevision)
			if err != nil {
				s.bad[kv.Key] = err
				continue
			}
			s.affinities = append(s.affinities, af)
		case strings.HasPrefix(kv.Key, lbAddrsPrefix):
			x, err := decodeLBAddr(kv)
			if err != nil {
				s.bad[kv.Key] = err
				continue
			}
			s.lb = append(s.lb, x)
		case strings.HasPrefix(kv.Key, lbServicesPrefix):
			var r lbServiceRecord
			if err := json.Unmarshal(kv.Value, &r); err != nil {
				s.bad[kv.Key] = fmt.Errorf("decoding %s: %w", kv.Key, err)
				continue
			}
			s.lbServices = append(s.lbServices, r)
		case strings.HasPrefix(kv.Key, handlesPrefix):
			h, err := decodeHandle(kv.Value, kv.ModRevision)
			if err == nil && handleKey(h.Handle) != kv.Key {
				err = fmt.Errorf("handle key %s holds handle %q", kv.Key, h.Handle)
			}
			if err != nil {
				s.bad[kv.Key] = err
				continue
			}
			s.handles = append(s.handles, h)
		}
	}
	var bad map[string]error
	s.blocks, bad = decodeBlocks(blockKVs)
	for k, v := range bad {
		s.bad[k] = v
	}
	if s.pools, err = a.listPools(ctx); err != nil {
		return nil, err
	}
	if withEndpoints {
		if s.endpoints, err = a.listEndpoints(ctx, s.bad); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (a *Allocator) listEndpoints(ctx context.Context, bad map[string]error) ([]endpointInfo, error) {
	prefix, err := resourcePrefix(api.KindWorkloadEndpoint)
	if err != nil {
		return nil, err
	}
	kvs, _, err := a.store.ListKV(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("listing workload endpoints: %w", err)
	}
	var out []endpointInfo
	for _, kv := range kvs {
		we, err := datastore.DecodeResourceAs[*api.WorkloadEndpoint](kv)
		if err != nil {
			bad[kv.Key] = err
			continue
		}
		ep := endpointInfo{key: we.Metadata.Namespace + "/" + we.Metadata.Name, node: we.Spec.Node, handle: we.Spec.IPAMHandle,
			noIPAM: we.Metadata.Annotations[api.AnnotationNoIPAM] == "true"}
		if ep.addrs, err = we.Addrs(); err != nil {
			bad[kv.Key] = err
		}
		out = append(out, ep)
	}
	return out, nil
}
