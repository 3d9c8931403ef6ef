package ipam

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/tabbynet/tabby/datastore"
)

// ReleaseHandle frees every address the handle holds and deletes the handle.
// A missing handle is success.
func (a *Allocator) ReleaseHandle(ctx context.Context, handleID string) error {
	if handleID == "" {
		return errors.New("ipam: release: handle is required")
	}
	h, err := a.getHandle(ctx, handleID)
	if err != nil || h == nil {
		return err
	}
	lock := a.nodeLock(h.Node)
	lock.Lock()
	defer lock.Unlock()
	first := true
	return a.retry(ctx, fmt.Sprintf("ipam: releasing handle %s", handleID), func() error {
		// The first attempt trusts the read above: the transaction compares
		// its revision anyway.
		if !first {
			if h, err = a.getHandle(ctx, handleID); err != nil || h == nil {
				return err
			}
		}
		first = false
		targets := make([]target, len(h.Addrs))
		for i, ha := range h.Addrs {
			targets[i] = target(ha)
		}
		return a.free(ctx, targets, h, nil, "release")
	})
}

// ReleaseAddr frees one address, whoever holds it, and removes it from its
// handle. A free address is success.
func (a *Allocator) ReleaseAddr(ctx context.Context, addr netip.Addr) error {
	b, err := a.findBlock(ctx, addr)
	if err != nil || b == nil {
		return err
	}
	ord, _ := ordinal(b.cidr, addr)
	attr, held := b.attrAt(ord)
	if !held {
		return nil
	}
	lock := a.nodeLock(attr.Node)
	lock.Lock()
	defer lock.Unlock()
	pre := b
	return a.retry(ctx, fmt.Sprintf("ipam: releasing %s", addr), func() error {
		err := a.free(ctx, []target{{Addr: addr, Block: b.cidr}}, nil, pre, "release")
		pre = nil
		return err
	})
}

// findBlock returns the block holding addr, nil when there is none.
// ReleaseAddrHeldBy frees addr only while handle holds it, checked in the
// same transaction as the release: an address that another handle got in
// the meantime is not taken from it (a *HeldByError); a free address is
// success.
func (a *Allocator) ReleaseAddrHeldBy(ctx context.Context, addr netip.Addr, handle string) error {
	if handle == "" {
		return errors.New("ipam: release: handle is required")
	}
	b, err := a.findBlock(ctx, addr)
	if err != nil || b == nil {
		return err
	}
	ord, _ := ordinal(b.cidr, addr)
	attr, held := b.attrAt(ord)
	if !held {
		return nil
	}
	cidr := b.cidr
	lock := a.nodeLock(attr.Node)
	lock.Lock()
	defer lock.Unlock()
	return a.retry(ctx, fmt.Sprintf("ipam: releasing %s of %s", addr, handle), func() error {
		if b == nil {
			var err error
			if b, err = a.getBlock(ctx, cidr); errors.Is(err, datastore.ErrNotFound) {
				return nil
			} else if err != nil {
				return err
			}
		}
		cur := b
		b = nil // a retry reads the block again
		at, held := cur.attrAt(ord)
		switch {
		case !held:
			return nil
		case at.Handle != handle:
			return &HeldByError{Addr: addr, Handle: at.Handle, Node: at.Node, Want: handle}
		}
		// cur's revision is compared in the transaction: the check above
		// holds at the release.
		return a.free(ctx, []target{{Addr: addr, Block: cur.cidr}}, nil, cur, "release")
	})
}

// HeldByError: ReleaseAddrHeldBy found the address held by another handle.
type HeldByError struct {
	Addr         netip.Addr
	Handle, Node string
	Want         string
}

func (e *HeldByError) Error() string {
	return fmt.Sprintf("ipam: %s is held by handle %q (node %s), not %q: not released", e.Addr, e.Handle, e.Node, e.Want)
}

func (a *Allocator) findBlock(ctx context.Context, addr netip.Addr) (*block, error) {
	if addr.Zone() != "" || addr.Is4In6() {
		return nil, fmt.Errorf("ipam: %s is not a plain IPv4 or IPv6 address", addr)
	}
	pools, err := a.listPools(ctx)
	if err != nil {
		return nil, err
	}
	if p, ok := poolFor(pools, hostPrefix(addr)); ok {
		b, err := a.getBlock(ctx, blockFor(addr, p.blockBits))
		if err == nil {
			return b, nil
		}
		if !errors.Is(err, datastore.ErrNotFound) {
			return nil, err
		}
	}
	// No pool (deleted?) or a block of another size: search them all.
	all, _, err := a.listBlocks(ctx)
	if err != nil {
		return nil, err
	}
	for _, b := range all {
		if b.cidr.Contains(addr) {
			return b, nil
		}
	}
	return nil, nil
}

// target is one address to free.
type target handleAddr

// free frees the targets in one transaction, together with the handle
// records that list them. With owner set (ReleaseHandle), only addresses
// held by that handle are freed and the owner's record is deleted even if
// it lists addresses no block holds for it; otherwise each address is freed
// whoever holds it and its handle's record loses it. An empty block is
// deleted when no node has affinity to it (see blockWrite). pre, when set,
// is a block already read (its revision is compared like any other).
func (a *Allocator) free(ctx context.Context, targets []target, owner *handle, pre *block, step string) error {
	byBlock := map[netip.Prefix][]netip.Addr{}
	for _, t := range targets {
		byBlock[t.Block] = append(byBlock[t.Block], t.Addr)
	}
	var cmps []datastore.Cmp
	var ops []datastore.Op
	freed := map[string][]netip.Addr{} // handle → addresses freed
	var wrote []*block
	for _, cidr := range slices.SortedFunc(maps.Keys(byBlock), comparePrefix) {
		b := pre
		if b == nil || b.cidr != cidr {
			var err error
			b, err = a.getBlock(ctx, cidr)
			if errors.Is(err, datastore.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
		}
		nb := b.clone()
		for _, addr := range byBlock[cidr] {
			ord, _ := ordinal(nb.cidr, addr)
			attr, held := nb.attrAt(ord)
			if !held || (owner != nil && attr.Handle != owner.Handle) {
				continue
			}
			nb.release(addr)
			freed[attr.Handle] = append(freed[attr.Handle], addr)
		}
		if nb.inUse() == b.inUse() {
			continue
		}
		c, o := blockWrite(b, nb)
		cmps, ops = append(cmps, c...), append(ops, o...)
		wrote = append(wrote, nb)
	}
	if owner != nil {
		cmps = append(cmps, datastore.Cmp{Key: handleKey(owner.Handle), ModRevision: owner.rev})
		ops = append(ops, datastore.Op{Key: handleKey(owner.Handle), Delete: true})
		delete(freed, owner.Handle)
	}
	for _, id := range slices.Sorted(maps.Keys(freed)) {
		h, err := a.getHandle(ctx, id)
		if err != nil {
			return err
		}
		key := handleKey(id)
		if h == nil {
			cmps = append(cmps, datastore.Cmp{Key: key, ModRevision: 0})
			continue
		}
		cmps = append(cmps, datastore.Cmp{Key: key, ModRevision: h.rev})
		if nh := h.without(freed[id]); len(nh.Addrs) > 0 {
			ops = append(ops, datastore.Op{Key: key, Value: nh.encode()})
		} else {
			ops = append(ops, datastore.Op{Key: key, Delete: true})
		}
	}
	if len(ops) == 0 {
		return nil
	}
	rev, err := a.txn(ctx, cmps, ops)
	if err != nil {
		return err
	}
	for _, nb := range wrote {
		if nb.node == "" {
			continue
		}
		if nb.rev < 0 {
			a.cacheBlock(nb.node, nb.cidr, nil, false)
		} else {
			nb.rev = rev
			a.cacheBlock(nb.node, nb.cidr, nb, false)
		}
	}
	return a.written(step)
}

// blockWrite returns the condition and write that store a modified block.
// A block left empty is deleted when no node has affinity to it (its node
// was released, or it was created for a specific address without claim); an
// empty affine block stays, ready for the node's next pods, until
// ReleaseEmptyBlocks or ReleaseNode. A deleted block gets rev -1. The
// block's summary record follows (summaryOps; old is the block as read).
func blockWrite(old, nb *block) ([]datastore.Cmp, []datastore.Op) {
	key := blockKey(nb.cidr)
	cmps := []datastore.Cmp{{Key: key, ModRevision: nb.rev}}
	if nb.empty() && nb.node == "" {
		nb.rev = -1
		return cmps, append([]datastore.Op{{Key: key, Delete: true}}, summaryOps(old, nb)...)
	}
	return cmps, append([]datastore.Op{{Key: key, Value: nb.encode()}}, summaryOps(old, nb)...)
}

// ReleaseNode removes a node from IPAM: its affinity records are deleted,
// its empty blocks are deleted and its blocks that still hold addresses lose
// their affinity (their addresses then count as borrowed). With
// releaseAddrs, every address allocated for the node (in any block) is freed
// first. It is idempotent.
func (a *Allocator) ReleaseNode(ctx context.Context, node string, releaseAddrs bool) error {
	if node == "" {
		return errors.New("ipam: release node: node is required")
	}
	lock := a.nodeLock(node)
	lock.Lock()
	defer lock.Unlock()
	defer a.setCache(node, nil)
	return a.retry(ctx, fmt.Sprintf("ipam: releasing node %s", node), func() error {
		return a.releaseNodeOnce(ctx, node, releaseAddrs)
	})
}

func (a *Allocator) releaseNodeOnce(ctx context.Context, node string, releaseAddrs bool) error {
	all, _, err := a.listBlocks(ctx)
	if err != nil {
		return err
	}
	if releaseAddrs {
		for _, b := range all {
			var targets []target
			b.allocated(func(addr netip.Addr, attr attrRecord) {
				if attr.Node == node {
					targets = append(targets, target{Addr: addr, Block: b.cidr})
				}
			})
			if len(targets) == 0 {
				continue
			}
			if err := a.free(ctx, targets, nil, b, "release-node"); err != nil {
				return err
			}
		}
		if all, _, err = a.listBlocks(ctx); err != nil {
			return err
		}
	}
	affs, err := a.listAffinities(ctx, affinityNodePrefix(node))
	if err != nil {
		return err
	}
	recs := map[netip.Prefix]affinity{}
	for _, af := range affs {
		recs[af.block] = af
	}
	for _, b := range all {
		if b.node != node {
			continue
		}
		key := blockKey(b.cidr)
		cmps := []datastore.Cmp{{Key: key, ModRevision: b.rev}}
		var ops []datastore.Op
		if b.empty() {
			ops = append(ops, datastore.Op{Key: key, Delete: true}, datastore.Op{Key: summaryKey(b.cidr), Delete: true})
		} else {
			nb := b.clone()
			nb.node = ""
			ops = append(ops, datastore.Op{Key: key, Value: nb.encode()})
			ops = append(ops, summaryOps(b, nb)...)
		}
		akey := affinityKey(node, b.cidr)
		if af, ok := recs[b.cidr]; ok {
			cmps = append(cmps, datastore.Cmp{Key: akey, ModRevision: af.rev})
			ops = append(ops, datastore.Op{Key: akey, Delete: true})
			delete(recs, b.cidr)
		}
		if _, err := a.txn(ctx, cmps, ops); err != nil {
			return err
		}
		if err := a.written("release-node"); err != nil {
			return err
		}
	}
	// Records whose block is gone or belongs to someone else.
	for _, af := range recs {
		if _, err := a.txn(ctx, []datastore.Cmp{{Key: affinityKey(node, af.block), ModRevision: af.rev}},
			[]datastore.Op{{Key: affinityKey(node, af.block), Delete: true}}); err != nil {
			return err
		}
		if err := a.written("release-node"); err != nil {
			return err
		}
	}
	return nil
}

// ReleaseEmptyBlocks deletes the node's affine blocks that hold no address,
// with their affinity records, and returns how many it deleted.
func (a *Allocator) ReleaseEmptyBlocks(ctx context.Context, node string) (int, error) {
	lock := a.nodeLock(node)
	lock.Lock()
	defer lock.Unlock()
	n := 0
	err := a.retry(ctx, fmt.Sprintf("ipam: releasing empty blocks of %s", node), func() error {
		affs, err := a.listAffinities(ctx, affinityNodePrefix(node))
		if err != nil {
			return err
		}
		for _, af := range affs {
			b, err := a.getBlock(ctx, af.block)
			if errors.Is(err, datastore.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if b.node != node || !b.empty() {
				continue
			}
			akey := affinityKey(node, b.cidr)
			if _, err := a.txn(ctx,
				[]datastore.Cmp{{Key: blockKey(b.cidr), ModRevision: b.rev}, {Key: akey, ModRevision: af.rev}},
				[]datastore.Op{{Key: blockKey(b.cidr), Delete: true}, {Key: akey, Delete: true}, {Key: summaryKey(b.cidr), Delete: true}}); err != nil {
				return err
			}
			n++
			a.cacheBlock(node, b.cidr, nil, false)
			if err := a.written("release-empty-block"); err != nil {
				return err
			}
		}
		return nil
	})
	return n, err
}

// GCNodes releases (with their addresses) every node that IPAM knows of
// (through affinities, block affinity or allocation attributes) but that is
// not in live, unless one of its allocations is younger than grace: a node
// that is registering right now is not collected. It returns the nodes
// released, sorted.
func (a *Allocator) GCNodes(ctx context.Context, live []string, grace time.Duration) ([]string, error) {
	all, _, err := a.listBlocks(ctx)
	if err != nil {
		return nil, err
	}
	affs, err := a.listAffinities(ctx, affinitiesPrefix)
	if err != nil {
		return nil, err
	}
	known := map[string]bool{}
	recent := map[string]bool{}
	cutoff := a.now().Add(-grace)
	for _, af := range affs {
		known[af.node] = true
	}
	for _, b := range all {
		if b.node != "" {
			known[b.node] = true
		}
		b.allocated(func(_ netip.Addr, attr attrRecord) {
			if attr.Node == "" {
				return
			}
			known[attr.Node] = true
			if attr.Time.After(cutoff) {
				recent[attr.Node] = true
			}
		})
	}
	var released []string
	var errs []error
	for _, n := range slices.Sorted(maps.Keys(known)) {
		if slices.Contains(live, n) || recent[n] {
			continue
		}
		if err := a.ReleaseNode(ctx, n, true); err != nil {
			errs = append(errs, err)
			continue
		}
		released = append(released, n)
	}
	return released, errors.Join(errs...)
}
