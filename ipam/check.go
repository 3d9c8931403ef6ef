package ipam

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Report is the result of Check: the cross-check of blocks, affinities,
// handles and workload endpoints. An empty report (OK) means they agree.
type Report struct {
	// Revision is the etcd revision the IPAM records were read at.
	Revision int64
	// Counts of what was examined.
	Blocks, Affinities, Handles, Endpoints, Allocated int
	// Leaks are allocated addresses that no workload endpoint uses and that
	// are older than the grace period.
	Leaks []Leak
	// OrphanHandles are handle records that disagree with the blocks: a
	// record listing an address its block does not hold for it, a record
	// without addresses, or an allocation whose handle has no record of it.
	OrphanHandles []OrphanHandle
	// Inconsistencies are everything else that is wrong.
	Inconsistencies []Inconsistency
}

// OK reports whether nothing is wrong.
func (r *Report) OK() bool {
	return len(r.Leaks) == 0 && len(r.OrphanHandles) == 0 && len(r.Inconsistencies) == 0
}

// Leak is an allocation without a workload endpoint.
type Leak struct {
	Addr                              netip.Addr
	Block                             netip.Prefix
	Handle                            string
	Node, Namespace, Pod, ContainerID string
	Allocated                         time.Time
}

// OrphanHandle is a handle record that disagrees with the blocks.
type OrphanHandle struct {
	Handle string
	Addr   netip.Addr // zero when the problem is the record as a whole
	Reason string
}

// Kinds of Inconsistency.
const (
	InvalidRecord           = "invalid-record"             // a record that does not decode or is internally inconsistent
	BlockOutsidePools       = "block-outside-pools"        // no pool holds the block
	BlockPoolMismatch       = "block-pool-mismatch"        // the block names another pool than the one holding it
	BlocksOverlap           = "blocks-overlap"             // two blocks share addresses
	DuplicateAddress        = "duplicate-address"          // one address allocated in two blocks
	AffinityMissing         = "affinity-missing"           // a block affine to a node without the node's affinity record
	AffinityNotConfirmed    = "affinity-not-confirmed"     // the record is pending or pending deletion
	AffinityStale           = "affinity-stale"             // a record whose block is gone or affine to another node
	EndpointUnallocated     = "endpoint-unallocated"       // an endpoint address that is not allocated
	EndpointHandleMismatch  = "endpoint-handle-mismatch"   // the endpoint's ipamHandle is not the allocation's handle
	BlockInLoadBalancerPool = "block-in-loadbalancer-pool" // a pod block inside a LoadBalancer pool
	LBAddressOutsidePools   = "lb-address-outside-pools"   // a LoadBalancer address in no LoadBalancer pool
	LBRecordMismatch        = "lb-record-mismatch"         // address and Service records of LoadBalancer IPAM disagree
	SummaryMismatch         = "summary-mismatch"           // a block's summary record is missing or says otherwise, or its block is gone
)

// Inconsistency is one problem found by Check.
type Inconsistency struct {
	Kind   string
	Key    string // the block, affinity, handle or endpoint concerned
	Detail string
}

// endpointInfo is a workload endpoint as Check needs it.
type endpointInfo struct {
	key    string // namespace/name
	node   string
	handle string
	addrs  []netip.Addr
	// noIPAM: the address was given without IPAM (api.AnnotationNoIPAM).
	noIPAM bool
}

// snapshot is everything Check and Usage look at.
type snapshot struct {
	rev        int64
	pools      []poolInfo
	blocks     []*block
	affinities []affinity
	handles    []*handle
	endpoints  []endpointInfo
	lb         []LBAllocation // sorted by key, so by address text
	lbServices []lbServiceRecord
	summaries  map[netip.Prefix]BlockSummary // the block summary records, by CIDR
	// bad holds records that did not decode, by key.
	bad map[string]error
}

// checkSnapshot cross-checks a snapshot. Allocations younger than grace
// (relative to now) are not leaks: their endpoint may not be written yet.
func checkSnapshot(s *snapshot, now time.Time, grace time.Duration) Report {
	c := &checker{s: s, r: Report{Revision: s.rev, Blocks: len(s.blocks), Affinities: len(s.affinities), Handles: len(s.handles), Endpoints: len(s.endpoints)},
		held: map[netip.Addr]holder{}, byCIDR: map[netip.Prefix]*block{}}
	for _, key := range slices.Sorted(maps.Keys(s.bad)) {
		c.add(InvalidRecord, key, "%v", s.bad[key])
	}
	checkSummaries(s, c.add)
	c.blocks()
	c.affinities()
	listed := c.handles()
	used := c.endpoints()
	c.leaks(listed, used, now, grace)
	checkLB(s, c.add)
	r := c.r
	slices.SortFunc(r.OrphanHandles, func(x, y OrphanHandle) int {
		return cmp.Or(strings.Compare(x.Handle, y.Handle), x.Addr.Compare(y.Addr), strings.Compare(x.Reason, y.Reason))
	})
	slices.SortStableFunc(r.Inconsistencies, func(x, y Inconsistency) int {
		return cmp.Or(strings.Compare(x.Kind, y.Kind), strings.Compare(x.Key, y.Key))
	})
	return r
}

// checker carries one check's report and what its steps share: the
// allocations found in blocks, and the blocks by CIDR.
type checker struct {
	s      *snapshot
	r      Report
	held   map[netip.Addr]holder
	byCIDR map[netip.Prefix]*block
}

// holder is an allocation: the block it is in and its attributes.
type holder struct {
	block *block
	attr  attrRecord
}

func (c *checker) add(kind, key, format string, args ...any) {
	c.r.Inconsistencies = append(c.r.Inconsistencies, Inconsistency{Kind: kind, Key: key, Detail: fmt.Sprintf(format, args...)})
}

func (c *checker) orphan(h OrphanHandle) { c.r.OrphanHandles = append(c.r.OrphanHandles, h) }

// blocks checks every block against the others (overlap), the pools and
// its affinity record, and collects its allocations.
func (c *checker) blocks() {
	affs := map[string]affinity{}
	for _, af := range c.s.affinities {
		affs[affinityKey(af.node, af.block)] = af
	}
	blocks := slices.Clone(c.s.blocks)
	slices.SortFunc(blocks, func(x, y *block) int { return comparePrefix(x.cidr, y.cidr) })
	for i, b := range blocks {
		name := blockName(b.cidr)
		c.byCIDR[b.cidr] = b
		for _, o := range blocks[i+1:] {
			if !b.cidr.Contains(o.cidr.Addr()) {
				break
			}
			c.add(BlocksOverlap, name, "block %s overlaps block %s", b.cidr, o.cidr)
		}
		if p, ok := poolFor(c.s.pools, b.cidr); !ok {
			c.add(BlockOutsidePools, name, "no ip pool holds block %s (pool field %q)", b.cidr, b.pool)
		} else if b.pool != p.name {
			c.add(BlockPoolMismatch, name, "block %s names pool %q but lies in pool %s", b.cidr, b.pool, p.name)
		}
		if b.node != "" {
			af, ok := affs[affinityKey(b.node, b.cidr)]
			switch {
			case !ok:
				c.add(AffinityMissing, name, "block %s is affine to %s but the node has no affinity record for it", b.cidr, b.node)
			case af.state != affinityConfirmed:
				c.add(AffinityNotConfirmed, name, "affinity of %s to block %s is %s", b.node, b.cidr, af.state)
			}
		}
		b.allocated(func(addr netip.Addr, attr attrRecord) {
			c.r.Allocated++
			if prev, dup := c.held[addr]; dup {
				c.add(DuplicateAddress, name, "%s is allocated in block %s (handle %s) and in block %s (handle %s)",
					addr, prev.block.cidr, prev.attr.Handle, b.cidr, attr.Handle)
				return
			}
			c.held[addr] = holder{block: b, attr: attr}
		})
	}
}

// affinities reports affinity records whose block is gone or affine to
// another node.
func (c *checker) affinities() {
	for _, af := range c.s.affinities {
		key := affinityKey(af.node, af.block)
		b := c.byCIDR[af.block]
		switch {
		case b == nil:
			c.add(AffinityStale, key, "affinity of %s (%s) names block %s, which does not exist", af.node, af.state, af.block)
		case b.node != af.node:
			c.add(AffinityStale, key, "affinity of %s (%s) names block %s, which is affine to %q", af.node, af.state, af.block, b.node)
		}
	}
}

// handles checks handle records against allocations; it returns the
// handle that lists each address.
func (c *checker) handles() map[netip.Addr]string {
	listed := map[netip.Addr]string{}
	for _, h := range c.s.handles {
		if len(h.Addrs) == 0 {
			c.orphan(OrphanHandle{Handle: h.Handle, Reason: "handle record lists no addresses"})
		}
		for _, ha := range h.Addrs {
			listed[ha.Addr] = h.Handle
			hd, ok := c.held[ha.Addr]
			switch {
			case !ok:
				c.orphan(OrphanHandle{Handle: h.Handle, Addr: ha.Addr, Reason: "handle lists an address that is not allocated"})
			case hd.attr.Handle != h.Handle:
				c.orphan(OrphanHandle{Handle: h.Handle, Addr: ha.Addr, Reason: fmt.Sprintf("handle lists an address allocated to handle %q", hd.attr.Handle)})
			case hd.block.cidr != ha.Block:
				c.orphan(OrphanHandle{Handle: h.Handle, Addr: ha.Addr, Reason: fmt.Sprintf("handle names block %s, the address is in block %s", ha.Block, hd.block.cidr)})
			}
		}
	}
	return listed
}

// endpoints checks endpoints against allocations; it returns the addresses
// endpoints use.
func (c *checker) endpoints() map[netip.Addr]bool {
	used := map[netip.Addr]bool{}
	for _, ep := range c.s.endpoints {
		for _, addr := range ep.addrs {
			used[addr] = true
			hd, ok := c.held[addr]
			switch {
			case !ok && ep.noIPAM:
				// Given without IPAM (ipAddrsNoIpam): nothing to hold it.
			case !ok:
				c.add(EndpointUnallocated, ep.key, "endpoint %s on %s uses %s, which is not allocated", ep.key, ep.node, addr)
			case ep.handle != "" && ep.handle != hd.attr.Handle:
				c.add(EndpointHandleMismatch, ep.key, "endpoint %s has ipamHandle %q but %s is allocated to handle %q", ep.key, ep.handle, addr, hd.attr.Handle)
			}
		}
	}
	return used
}

// leaks reports allocations no handle record lists, and those no endpoint
// uses once older than grace.
func (c *checker) leaks(listed map[netip.Addr]string, used map[netip.Addr]bool, now time.Time, grace time.Duration) {
	for _, addr := range slices.SortedFunc(maps.Keys(c.held), netip.Addr.Compare) {
		hd := c.held[addr]
		if listed[addr] != hd.attr.Handle {
			c.orphan(OrphanHandle{Handle: hd.attr.Handle, Addr: addr, Reason: "allocation's handle has no record of it"})
		}
		if used[addr] || now.Sub(hd.attr.Time) < grace || IsTunnelHandle(hd.attr.Handle) {
			continue // a tunnel address is the node's (node GC frees it)
		}
		c.r.Leaks = append(c.r.Leaks, Leak{
			Addr: addr, Block: hd.block.cidr, Handle: hd.attr.Handle,
			Node: hd.attr.Node, Namespace: hd.attr.Namespace, Pod: hd.attr.Pod, ContainerID: hd.attr.ContainerID,
			Allocated: hd.attr.Time,
		})
	}
}

// PoolUsage is the address usage of one pool. Blocks that no pool holds are
// reported under a PoolUsage with an empty Name.
type PoolUsage struct {
	Name      string
	CIDR      netip.Prefix
	BlockSize int
	Disabled  bool
	// Total addresses in the pool; InUse allocated; Free = Total - InUse;
	// Borrowed allocated for a node other than the block's. A pool of
	// 2^62 addresses or more (IPv6) counts as 2^62; SizeBits says how
	// large it is: 2^SizeBits addresses.
	Total, InUse, Free, Borrowed int
	SizeBits                     int
	Blocks                       []BlockUsage
	// LoadBalancer: the pool's addresses are for Services (allowedUses
	// [LoadBalancer]); it has no blocks, and Services lists who holds
	// which address, sorted by address.
	LoadBalancer bool
	Services     []LBAllocation
}

// BlockUsage is the usage of one block.
type BlockUsage struct {
	CIDR                         netip.Prefix
	Affinity                     string // node, "" = none
	Total, InUse, Free, Borrowed int
}

// usage computes per-pool and per-block usage from a snapshot, pools sorted
// by name and blocks by CIDR.
func usage(s *snapshot) []PoolUsage {
	out := make([]PoolUsage, 0, len(s.pools)+1)
	idx := map[string]int{}
	for _, p := range s.pools {
		idx[p.name] = len(out)
		total := maxBlocksScanned // an IPv6 pool of 2^62 addresses or more
		if hb := hostBits(p.prefix); hb < 62 {
			total = 1 << hb
		}
		out = append(out, PoolUsage{Name: p.name, CIDR: p.prefix, BlockSize: p.blockBits, Disabled: p.pool.Spec.Disabled, Total: total, Free: total, SizeBits: hostBits(p.prefix),
			LoadBalancer: p.pool.IsLoadBalancer()})
	}
	for _, x := range s.lb {
		if p, ok := poolFor(s.pools, hostPrefix(x.Addr)); ok {
			pu := &out[idx[p.name]]
			pu.Services = append(pu.Services, x)
			pu.InUse++
			pu.Free--
		}
	}
	orphan := PoolUsage{}
	for _, b := range s.blocks {
		bu := BlockUsage{CIDR: b.cidr, Affinity: b.node, Total: blockSizeOf(b.cidr), InUse: b.inUse(), Free: b.free()}
		b.allocated(func(_ netip.Addr, attr attrRecord) {
			if attr.Node != b.node {
				bu.Borrowed++
			}
		})
		pu := &orphan
		if p, ok := poolFor(s.pools, b.cidr); ok {
			pu = &out[idx[p.name]]
		} else {
			orphan.Total += bu.Total
			orphan.Free += bu.Total
		}
		pu.Blocks = append(pu.Blocks, bu)
		pu.InUse += bu.InUse
		pu.Borrowed += bu.Borrowed
		pu.Free -= bu.InUse
	}
	if len(orphan.Blocks) > 0 {
		out = append(out, orphan)
	}
	for i := range out {
		slices.SortFunc(out[i].Blocks, func(x, y BlockUsage) int { return comparePrefix(x.CIDR, y.CIDR) })
		slices.SortFunc(out[i].Services, func(x, y LBAllocation) int { return x.Addr.Compare(y.Addr) })
	}
	slices.SortStableFunc(out, func(x, y PoolUsage) int {
		if (x.Name == "") != (y.Name == "") {
			if x.Name == "" {
				return 1
			}
			return -1
		}
		return strings.Compare(x.Name, y.Name)
	})
	return out
}
