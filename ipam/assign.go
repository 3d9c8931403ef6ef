package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// Attributes describe who an address is for; they are stored with the
// allocation.
type Attributes struct {
	Node, Namespace, Pod, ContainerID string
	Time                              time.Time
}

// AssignRequest asks for one address for Handle on Node.
type AssignRequest struct {
	Node   string
	Handle string
	Attrs  Attributes
	// Pools restricts allocation to these pools, each given by name or by
	// CIDR; empty = every usable pool. One that does not exist is an error
	// (wrapping ErrNoPool).
	Pools []string
	// Addr asks for this specific address when valid.
	Addr netip.Addr
	// Family is 4 or 6: the address family wanted; 0 means that of Addr
	// when given, else 4. A handle holds at most one address per family:
	// a dual-stack pod assigns twice under one handle.
	Family int
	// Use is what the address is for: Workload (pods; the default when
	// empty) or Tunnel (a node's tunnel device). Only pools whose
	// allowedUses include it serve the request.
	Use api.IPPoolUse
	// With, when set, rides on the assignment's transaction: it is called
	// with the address about to be committed (again at every attempt) and
	// returns comparisons and writes (keys as datastore.Txn takes them)
	// that commit with the address or not at all — a pod's endpoint, so
	// that an ADD pays one durable write, not two. A transaction that
	// fails its comparisons may have failed on these: the assignment is
	// then retried without them, and Assignment.WithRev is 0 (the caller
	// writes them itself). A repeat (Existing) never writes them.
	With func(addr netip.Addr) ([]datastore.Cmp, []datastore.Op, error)

	// fullClaim: a block claim reads the block records, not the
	// summaries (set after a failed attempt; see claimState).
	fullClaim bool
}

// use resolves req.Use.
func (req AssignRequest) use() api.IPPoolUse {
	if req.Use == "" {
		return api.UseWorkload
	}
	return req.Use
}

// family resolves req.Family.
func (req AssignRequest) family() int {
	switch {
	case req.Family != 0:
		return req.Family
	case req.Addr.IsValid():
		return familyOf(req.Addr)
	}
	return 4
}

// Assignment is an allocated address.
type Assignment struct {
	Addr  netip.Addr
	Block netip.Prefix
	Pool  string
	// Borrowed: the block is not affine to the requesting node, so the
	// address is advertised as a /32.
	Borrowed bool
	// Existing: the handle held the address before this call (a repeated
	// request); nothing was allocated.
	Existing bool
	// NewBlock: the address is the first of a block claimed for the node by
	// this call (its route is not advertised yet).
	NewBlock bool
	// WithRev is the revision of the transaction that committed the
	// request's With writes along with the address; 0 when they were not
	// written.
	WithRev int64
}

// errRetryAlone is errRetry of a transaction that carried the request's
// With writes: the next attempt goes without them.
var errRetryAlone = fmt.Errorf("%w (with the request's own writes)", errRetry)

// Assign allocates an address for req.Handle. It is idempotent per handle:
// when the handle already holds an address, that address is returned.
// Order of preference: the node's affine blocks, a newly claimed block,
// an address borrowed from another block (unless strictAffinity); else an
// error wrapping ErrExhausted.
func (a *Allocator) Assign(ctx context.Context, req AssignRequest) (Assignment, error) {
	switch {
	case req.Node == "":
		return Assignment{}, errors.New("ipam: assign: node is required")
	case req.Handle == "":
		return Assignment{}, errors.New("ipam: assign: handle is required")
	case req.Family != 0 && req.Family != 4 && req.Family != 6:
		return Assignment{}, fmt.Errorf("ipam: assign: family %d: want 4 or 6", req.Family)
	case req.Addr.IsValid() && (req.Addr.Zone() != "" || req.Addr.Is4In6()):
		return Assignment{}, fmt.Errorf("ipam: assign: %s is not a plain IPv4 or IPv6 address", req.Addr)
	case req.Addr.IsValid() && familyOf(req.Addr) != req.family():
		return Assignment{}, fmt.Errorf("ipam: assign: %s is not an IPv%d address", req.Addr, req.family())
	}
	attr := attrRecord{
		Handle:      req.Handle,
		Node:        req.Attrs.Node,
		Namespace:   req.Attrs.Namespace,
		Pod:         req.Attrs.Pod,
		ContainerID: req.Attrs.ContainerID,
		Time:        req.Attrs.Time,
	}
	if attr.Node == "" {
		attr.Node = req.Node
	}
	if attr.Time.IsZero() {
		attr.Time = a.now()
	}
	attr.Time = attr.Time.UTC().Truncate(time.Millisecond)

	lock := a.nodeLock(req.Node)
	lock.Lock()
	defer lock.Unlock()

	if !req.Addr.IsValid() {
		res, ok, err := a.assignCached(ctx, req, attr)
		if ok {
			return res, err
		}
		if errors.Is(err, errRetryAlone) {
			req.With = nil
		}
	}
	var res Assignment
	err := a.retry(ctx, fmt.Sprintf("ipam: assigning address for %s on %s", req.Handle, req.Node), func() error {
		var err error
		res, err = a.assignOnce(ctx, req, attr)
		if errors.Is(err, errRetryAlone) {
			req.With = nil
		}
		if errors.Is(err, errRetry) {
			req.fullClaim = true // see claimState
		}
		return err
	})
	return res, err
}

// assignCached is the fast path: one transaction against the cached affine
// blocks. ok is false when the slow path must run (no cache, no room, or
// the cache was stale).
func (a *Allocator) assignCached(ctx context.Context, req AssignRequest, attr attrRecord) (Assignment, bool, error) {
	c := a.cached(req.Node)
	if c == nil {
		return Assignment{}, false, nil
	}
	usable, err := usablePools(c.pools, req.family(), req.Node, c.node.labels, req.Pools, req.use())
	if err != nil {
		return Assignment{}, false, nil
	}
	// The handle must not exist, or be the record this process just wrote
	// for the other family (compared by revision in the transaction).
	var hrev int64
	var keep []handleAddr
	if h := a.lastWritten(req.Node, req.Handle); h != nil {
		if slices.ContainsFunc(h.Addrs, func(x handleAddr) bool { return familyOf(x.Addr) == req.family() }) {
			return Assignment{}, false, nil // a repeat: the slow path answers it
		}
		hrev, keep = h.rev, h.Addrs
	}
	for _, b := range c.blocks {
		p, ok := poolFor(usable, b.cidr)
		if !ok || b.free() == 0 {
			continue
		}
		nb := b.clone()
		addr, _ := nb.allocate(attr)
		res, err := a.commit(ctx, commit{b: nb, old: b, pool: p, node: c.node, req: req, addr: addr, handleRev: hrev, keep: keep})
		if errors.Is(err, errRetry) {
			return Assignment{}, false, err
		}
		return res, true, err
	}
	return Assignment{}, false, nil
}

// assignState is what one slow-path attempt reads.
type assignState struct {
	handle     *handle
	pools      []poolInfo
	node       nodeInfo
	cfg        *api.IPAMConfig
	affinities []affinity
	affine     map[netip.Prefix]*block // blocks named by the node's affinities
	// unreadable are affine blocks that do not decode: neither used nor
	// repaired (their affinity stays), and never claimed again.
	unreadable map[netip.Prefix]bool
}

func (a *Allocator) loadAssignState(ctx context.Context, req AssignRequest) (*assignState, error) {
	st := &assignState{affine: map[netip.Prefix]*block{}, unreadable: map[netip.Prefix]bool{}}
	var err error
	if req.Handle != "" { // EnsureBlock has none
		if st.handle, err = a.getHandle(ctx, req.Handle); err != nil {
			return nil, err
		}
	}
	if st.holds(req) {
		return st, nil
	}
	if st.pools, err = a.listPools(ctx); err != nil {
		return nil, err
	}
	if st.node, err = a.getNode(ctx, req.Node); err != nil {
		return nil, err
	}
	if st.cfg, err = a.getConfig(ctx); err != nil {
		return nil, err
	}
	if st.affinities, err = a.listAffinities(ctx, affinityNodePrefix(req.Node)); err != nil {
		return nil, err
	}
	for _, af := range st.affinities {
		b, err := a.getBlock(ctx, af.block)
		if errors.Is(err, datastore.ErrNotFound) {
			continue
		}
		if errors.Is(err, ErrUnreadableBlock) {
			// One bad block must not stop the node: allocate from the
			// others.
			a.skipUnreadable(af.block, err)
			st.unreadable[af.block] = true
			continue
		}
		if err != nil {
			return nil, err
		}
		a.readable(af.block)
		st.affine[af.block] = b
	}
	return st, nil
}

// assignOnce is one attempt of the slow path; errRetry means "re-read and
// try again".
func (a *Allocator) assignOnce(ctx context.Context, req AssignRequest, attr attrRecord) (Assignment, error) {
	st, err := a.loadAssignState(ctx, req)
	if err != nil {
		return Assignment{}, err
	}
	if st.holds(req) {
		return a.existing(ctx, req, st.handle)
	}
	if req.Addr.IsValid() {
		return a.assignSpecific(ctx, req, attr, st)
	}
	usable, err := usablePools(st.pools, req.family(), req.Node, st.node.labels, req.Pools, req.use())
	if err != nil {
		return Assignment{}, err
	}
	if repaired, err := a.repairAffinities(ctx, req.Node, st); err != nil {
		return Assignment{}, err
	} else if repaired {
		return Assignment{}, errRetry
	}

	// 1. The node's confirmed affine blocks, in CIDR order.
	var affine []*block
	for _, af := range st.affinities {
		if b := st.affine[af.block]; b != nil && af.state == affinityConfirmed && b.node == req.Node {
			affine = append(affine, b)
		}
	}
	slices.SortFunc(affine, func(x, y *block) int { return comparePrefix(x.cidr, y.cidr) })
	a.setCache(req.Node, &nodeCache{pools: st.pools, node: st.node, blocks: affine})
	handleRev := st.handleRev()
	for _, b := range affine {
		p, ok := poolFor(usable, b.cidr)
		if !ok || b.free() == 0 {
			continue
		}
		nb := b.clone()
		addr, _ := nb.allocate(attr)
		return a.commit(ctx, commit{b: nb, old: b, pool: p, node: st.node, req: req, addr: addr, handleRev: handleRev, keep: st.otherAddrs()})
	}

	// 2. Claim a free block.
	cl, err := a.claimState(ctx, req.Node, st, req.fullClaim)
	if err != nil {
		return Assignment{}, err
	}
	if cl.mayClaim {
		for _, p := range usable {
			cidr, ok := freeBlock(p, req.Node, cl.taken, cl.odd)
			if !ok {
				continue
			}
			nb := newBlock(cidr, req.Node, p.name)
			addr, _ := nb.allocate(attr)
			return a.commit(ctx, commit{b: nb, created: true, pool: p, node: st.node, req: req, addr: addr, handleRev: handleRev, keep: st.otherAddrs()})
		}
	}

	// 3. Borrow from any other block of a usable pool. Every block is
	// needed from here on.
	if !st.cfg.Spec.StrictAffinity {
		all := cl.all
		if cl.fromSummaries {
			if all, _, err = a.listBlocks(ctx); err != nil {
				return Assignment{}, err
			}
		}
		var cands []*block
		for _, b := range all {
			if _, ok := poolFor(usable, b.cidr); ok && b.node != req.Node && b.free() > 0 {
				cands = append(cands, b)
			}
		}
		if len(cands) > 0 {
			b := cands[int(nodeHash(req.Node)%uint64(len(cands)))]
			p, _ := poolFor(usable, b.cidr)
			nb := b.clone()
			addr, _ := nb.allocate(attr)
			return a.commit(ctx, commit{b: nb, old: b, pool: p, node: st.node, req: req, addr: addr, handleRev: handleRev, keep: st.otherAddrs()})
		}
	}
	return Assignment{}, &ExhaustedError{Node: req.Node, Pools: poolNames(usable)}
}

// claims is what claiming a new block needs to know.
type claims struct {
	// all are the blocks; with fromSummaries, only their CIDR, node and
	// pool (from the summaries), no allocations.
	all           []*block
	fromSummaries bool
	taken         map[netip.Prefix]bool // existing blocks
	odd           []netip.Prefix        // ranges taken by blocks of another size or unreadable
	mayClaim      bool                  // autoAllocateBlocks and under maxBlocksPerHost
}

// claimState reads which ranges a claim by node finds taken and which
// blocks are the node's. Unless full, from the block summaries (≈ 100 B a
// block; the block records are ≈ 8 KB: at 1,000 nodes each claim listed
// 8 MB from etcd, and took 0.6-2.5 s under load). A block without a
// summary (a release before summaries, until an agent's SyncSummaries
// writes it) is seen by the claim's create-if-absent, whose conflict
// makes the next attempt full; so does a block of the node without
// affinity record, which the full read adopts (errRetry: start over).
func (a *Allocator) claimState(ctx context.Context, node string, st *assignState, full bool) (claims, error) {
	if !full {
		cl, ok, err := a.claimsFromSummaries(ctx, node, st)
		if err != nil || ok {
			return cl, err
		}
	}
	all, bad, err := a.listBlocks(ctx)
	if err != nil {
		return claims{}, err
	}
	mine := len(st.unreadable)
	for _, b := range all {
		if b.node != node {
			continue
		}
		mine++
		if !slices.ContainsFunc(st.affinities, func(af affinity) bool { return af.block == b.cidr }) {
			// Ours by the block, but no affinity record (a lost write of an
			// older writer): adopt it and start over.
			if err := a.adopt(ctx, node, b); err != nil {
				return claims{}, err
			}
			return claims{}, errRetry
		}
	}
	maxBlocks := st.cfg.Spec.MaxBlocksPerHost
	cl := claims{all: all, taken: make(map[netip.Prefix]bool, len(all)), mayClaim: st.cfg.AutoAllocate() && (maxBlocks == 0 || mine < maxBlocks)}
	for key := range bad {
		// An unreadable block still occupies its range.
		if cidr, err := parseBlockName(strings.TrimPrefix(key, blocksPrefix)); err == nil {
			cl.odd = append(cl.odd, cidr)
		}
	}
	for _, b := range all {
		cl.taken[b.cidr] = true
		if p, ok := poolFor(st.pools, b.cidr); !ok || p.blockBits != b.cidr.Bits() {
			cl.odd = append(cl.odd, b.cidr)
		}
	}
	return cl, nil
}

// claimsFromSummaries is claimState from the block summaries; ok is false
// when the full read must decide (a block of the node without affinity
// record).
func (a *Allocator) claimsFromSummaries(ctx context.Context, node string, st *assignState) (claims, bool, error) {
	// The block keys first: a block created after this read has its
	// summary (one transaction) in the next one; a block key without a
	// summary leaves the decision to the full read.
	keys, err := a.store.ListKeys(ctx, blocksPrefix)
	if err != nil {
		return claims{}, false, fmt.Errorf("listing blocks: %w", err)
	}
	kvs, _, err := a.store.ListKV(ctx, blockSummariesPrefix)
	if err != nil {
		return claims{}, false, fmt.Errorf("listing block summaries: %w", err)
	}
	summarised := make(map[string]bool, len(kvs))
	for _, kv := range kvs {
		summarised[strings.TrimPrefix(kv.Key, blockSummariesPrefix)] = true
	}
	for _, k := range keys {
		if !summarised[strings.TrimPrefix(k, blocksPrefix)] {
			return claims{}, false, nil
		}
	}
	cl := claims{fromSummaries: true, taken: make(map[netip.Prefix]bool, len(kvs))}
	mine := len(st.unreadable)
	for _, kv := range kvs {
		s, err := DecodeSummaryRecord(kv.Key, kv.Value)
		if err != nil {
			// An unreadable summary still occupies its block's range.
			if cidr, kerr := ParseSummaryKey(kv.Key); kerr == nil {
				cl.odd = append(cl.odd, cidr)
			}
			continue
		}
		if s.Affinity == node {
			if !slices.ContainsFunc(st.affinities, func(af affinity) bool { return af.block == s.CIDR }) {
				return claims{}, false, nil
			}
			mine++
		}
		cl.all = append(cl.all, &block{cidr: s.CIDR, node: s.Affinity, pool: s.Pool})
		cl.taken[s.CIDR] = true
		if p, ok := poolFor(st.pools, s.CIDR); !ok || p.blockBits != s.CIDR.Bits() {
			cl.odd = append(cl.odd, s.CIDR)
		}
	}
	maxBlocks := st.cfg.Spec.MaxBlocksPerHost
	cl.mayClaim = st.cfg.AutoAllocate() && (maxBlocks == 0 || mine < maxBlocks)
	return cl, true, nil
}

// holds reports whether the handle already holds an address of the
// request's family: the request is then a repeat.
func (st *assignState) holds(req AssignRequest) bool {
	if st.handle == nil {
		return false
	}
	return slices.ContainsFunc(st.handle.Addrs, func(x handleAddr) bool { return familyOf(x.Addr) == req.family() })
}

// otherAddrs are the handle's addresses that a new assignment keeps: those
// of the other family (a dual-stack pod's first address).
func (st *assignState) otherAddrs() []handleAddr {
	if st.handle == nil {
		return nil
	}
	return slices.Clone(st.handle.Addrs)
}

// handleRev is the revision the handle record must still have: 0 (absent)
// unless a record was left behind or holds the other family's address.
func (st *assignState) handleRev() int64 {
	if st.handle == nil {
		return 0
	}
	return st.handle.rev
}

// assignSpecific allocates req.Addr.
func (a *Allocator) assignSpecific(ctx context.Context, req AssignRequest, attr attrRecord, st *assignState) (Assignment, error) {
	p, ok := poolFor(st.pools, hostPrefix(req.Addr))
	if !ok {
		return Assignment{}, fmt.Errorf("ipam: address %s is not in any ip pool: %w", req.Addr, ErrNotInPool)
	}
	if why := unusableReason(p, st.node.labels, req.Pools, req.use()); why != "" {
		return Assignment{}, fmt.Errorf("ipam: address %s is in pool %s, which %s: %w", req.Addr, p.name, why, ErrNotInPool)
	}
	cidr := blockFor(req.Addr, p.blockBits)
	b, err := a.getBlock(ctx, cidr)
	switch {
	case err == nil:
		nb := b.clone()
		if err := nb.allocateAddr(req.Addr, attr); err != nil {
			return Assignment{}, fmt.Errorf("ipam: %w", err)
		}
		return a.commit(ctx, commit{b: nb, old: b, pool: p, node: st.node, req: req, addr: req.Addr, handleRev: st.handleRev(), keep: st.otherAddrs()})
	case !errors.Is(err, datastore.ErrNotFound):
		return Assignment{}, err
	}
	// The block does not exist yet: claim it for the node when allowed,
	// else create it without affinity (the address is then borrowed).
	owner := req.Node
	maxBlocks := st.cfg.Spec.MaxBlocksPerHost
	if !st.cfg.AutoAllocate() || (maxBlocks > 0 && len(st.affinities) >= maxBlocks) {
		if st.cfg.Spec.StrictAffinity {
			return Assignment{}, fmt.Errorf("ipam: address %s: node %s may not claim block %s (autoAllocateBlocks %v, maxBlocksPerHost %d) and strictAffinity forbids borrowing: %w",
				req.Addr, req.Node, cidr, st.cfg.AutoAllocate(), maxBlocks, ErrExhausted)
		}
		owner = ""
	}
	nb := newBlock(cidr, owner, p.name)
	if err := nb.allocateAddr(req.Addr, attr); err != nil {
		return Assignment{}, fmt.Errorf("ipam: %w", err)
	}
	return a.commit(ctx, commit{b: nb, created: true, pool: p, node: st.node, req: req, addr: req.Addr, handleRev: st.handleRev(), keep: st.otherAddrs()})
}

// existing answers an Assign for a handle that already holds an address.
func (a *Allocator) existing(ctx context.Context, req AssignRequest, h *handle) (Assignment, error) {
	ha := h.Addrs[slices.IndexFunc(h.Addrs, func(x handleAddr) bool { return familyOf(x.Addr) == req.family() })]
	if req.Addr.IsValid() {
		i := slices.IndexFunc(h.Addrs, func(x handleAddr) bool { return x.Addr == req.Addr })
		if i < 0 {
			return Assignment{}, fmt.Errorf("ipam: handle %q already holds %s, not %s: %w", req.Handle, ha.Addr, req.Addr, ErrInUse)
		}
		ha = h.Addrs[i]
	}
	b, err := a.getBlock(ctx, ha.Block)
	if err != nil {
		return Assignment{}, fmt.Errorf("ipam: handle %q lists %s: %w", req.Handle, ha.Addr, err)
	}
	ord, _ := ordinal(b.cidr, ha.Addr)
	attr, held := b.attrAt(ord)
	if !held || attr.Handle != req.Handle {
		return Assignment{}, fmt.Errorf("ipam: handle %q lists %s but block %s does not hold it for the handle (run ipam check)", req.Handle, ha.Addr, b.cidr)
	}
	return Assignment{Addr: ha.Addr, Block: b.cidr, Pool: b.pool, Borrowed: b.node != attr.Node, Existing: true}, nil
}

// commit describes one allocation write.
type commit struct {
	b         *block // the modified copy
	old       *block // the block as read (nil when created)
	created   bool   // b is new: it must not exist yet
	pool      poolInfo
	node      nodeInfo
	req       AssignRequest
	addr      netip.Addr
	handleRev int64
	// keep are the handle's addresses of the other family.
	keep []handleAddr
}

// commit writes the block, the handle and, for a new affine block, its
// affinity in one transaction that also requires the pool (and, when the
// pool selects nodes, the Node) to be unchanged since they were read.
func (a *Allocator) commit(ctx context.Context, c commit) (Assignment, error) {
	bkey := blockKey(c.b.cidr)
	hkey := handleKey(c.req.Handle)
	brev := c.b.rev
	if c.created {
		brev = 0
	}
	cmps := []datastore.Cmp{{Key: bkey, ModRevision: brev}, {Key: hkey, ModRevision: c.handleRev}, {Key: c.pool.key, ModRevision: c.pool.rev}}
	if c.pool.pool.Spec.NodeSelector != nil {
		cmps = append(cmps, datastore.Cmp{Key: c.node.key, ModRevision: c.node.rev})
	}
	h := &handle{handleRecord: handleRecord{Handle: c.req.Handle, Node: c.req.Node, Addrs: append(slices.Clip(c.keep), handleAddr{Addr: c.addr, Block: c.b.cidr})}}
	ops := append([]datastore.Op{{Key: bkey, Value: c.b.encode()}, {Key: hkey, Value: h.encode()}}, summaryOps(c.old, c.b)...)
	if c.created && c.b.node != "" {
		akey := affinityKey(c.b.node, c.b.cidr)
		cmps = append(cmps, datastore.Cmp{Key: akey, ModRevision: 0})
		ops = append(ops, datastore.Op{Key: akey, Value: encodeAffinity(affinityConfirmed)})
	}
	var withRev bool
	var withCmps []datastore.Cmp
	if c.req.With != nil {
		wc, wo, err := c.req.With(c.addr)
		if err != nil {
			return Assignment{}, fmt.Errorf("ipam: assigning %s for %s: %w", c.addr, c.req.Handle, err)
		}
		withCmps = wc
		cmps, ops, withRev = append(cmps, wc...), append(ops, wo...), true
	}
	rev, err := a.txn(ctx, cmps, ops)
	if withRev && errors.Is(err, errRetry) {
		return Assignment{}, a.withConflict(ctx, withCmps)
	}
	if err != nil {
		return Assignment{}, err
	}
	c.b.rev = rev
	a.cacheBlock(c.req.Node, c.b.cidr, c.b, true)
	h.rev = rev
	a.rememberWritten(c.req.Node, h)
	if err := a.written("assign"); err != nil {
		return Assignment{}, err
	}
	res := Assignment{Addr: c.addr, Block: c.b.cidr, Pool: c.pool.name, Borrowed: c.b.node != c.req.Node,
		NewBlock: c.created && c.b.node == c.req.Node}
	if withRev {
		res.WithRev = rev
	}
	return res, nil
}

// withConflict tells, after a transaction carrying a request's With
// writes failed its comparisons, whether the With's own comparisons failed
// (errRetryAlone: the next attempt goes without them, and the caller
// writes them itself) or only IPAM's (errRetry: a block changed behind the
// cache, say; the next attempt still carries them, so that the ADD still
// pays one durable write). It asks etcd with a read-only transaction of
// the With's comparisons alone; when that fails too, it drops them.
func (a *Allocator) withConflict(ctx context.Context, withCmps []datastore.Cmp) error {
	if len(withCmps) == 0 {
		return errRetry
	}
	if _, err := a.store.Txn(ctx, withCmps, nil); err != nil {
		return errRetryAlone
	}
	return errRetry
}

// repairAffinities fixes the node's affinity records against their blocks:
// a record whose block is gone or belongs to another node is deleted, a
// pending record whose block is ours is confirmed. It reports whether it
// wrote anything (the caller then re-reads).
func (a *Allocator) repairAffinities(ctx context.Context, node string, st *assignState) (bool, error) {
	wrote := false
	for _, af := range st.affinities {
		if st.unreadable[af.block] {
			continue // nothing is known of it: leave it to a person
		}
		b := st.affine[af.block]
		key := affinityKey(node, af.block)
		var cmps []datastore.Cmp
		var op datastore.Op
		var ops []datastore.Op // besides op
		switch {
		case b == nil || b.node != node:
			cmps = []datastore.Cmp{{Key: key, ModRevision: af.rev}}
			op = datastore.Op{Key: key, Delete: true}
			if b != nil {
				cmps = append(cmps, datastore.Cmp{Key: blockKey(b.cidr), ModRevision: b.rev})
			} else {
				cmps = append(cmps, datastore.Cmp{Key: blockKey(af.block), ModRevision: 0})
			}
			a.log.Info("deleting stale block affinity", "node", node, "block", af.block, "state", af.state)
		case af.state == affinityPending:
			cmps = []datastore.Cmp{{Key: key, ModRevision: af.rev}, {Key: blockKey(b.cidr), ModRevision: b.rev}}
			op = datastore.Op{Key: key, Value: encodeAffinity(affinityConfirmed)}
			// A multi-step writer wrote no summary: write it (unconditionally:
			// this path is rare).
			ops = append(ops, datastore.Op{Key: summaryKey(b.cidr), Value: encodeSummary(b.summary())})
			a.log.Info("confirming pending block affinity", "node", node, "block", af.block)
		default:
			continue
		}
		if _, err := a.txn(ctx, cmps, append([]datastore.Op{op}, ops...)); err != nil {
			if errors.Is(err, errRetry) {
				return true, nil
			}
			return false, err
		}
		wrote = true
		if err := a.written("repair"); err != nil {
			return wrote, err
		}
	}
	return wrote, nil
}

// adopt writes the missing affinity record of a block affine to node.
func (a *Allocator) adopt(ctx context.Context, node string, b *block) error {
	key := affinityKey(node, b.cidr)
	a.log.Info("adopting block without affinity record", "node", node, "block", b.cidr)
	_, err := a.txn(ctx,
		[]datastore.Cmp{{Key: key, ModRevision: 0}, {Key: blockKey(b.cidr), ModRevision: b.rev}},
		[]datastore.Op{{Key: key, Value: encodeAffinity(affinityConfirmed)}, {Key: summaryKey(b.cidr), Value: encodeSummary(b.summary())}})
	if err != nil {
		if errors.Is(err, errRetry) {
			return nil
		}
		return err
	}
	return a.written("repair")
}
