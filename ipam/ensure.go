package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// EnsureBlock claims an empty block for node when it has no confirmed
// affine block of a pool it may use, so that the block's route is
// advertised before the node's first pod needs it (a pod's first packets
// to other nodes are otherwise lost while the route propagates). It
// returns the block it claimed, or the zero prefix when the node has a
// block already or may not claim one (no usable pool, autoAllocateBlocks
// off, maxBlocksPerHost reached, pools full). Idempotent.
func (a *Allocator) EnsureBlock(ctx context.Context, node string) (netip.Prefix, error) {
	return a.ensureBlock(ctx, node, 4, false)
}

// EnsureFreeBlock claims a block for node when none of its confirmed
// affine blocks of a usable pool of the family (4 or 6) has a free
// address: the next pod then lands in a block whose route is already
// advertised instead of opening one and waiting for the route to reach
// the other nodes. With the node's blocks cached and one of them not full
// it costs no etcd request. It returns the block claimed, or the zero
// prefix.
func (a *Allocator) EnsureFreeBlock(ctx context.Context, node string, family int) (netip.Prefix, error) {
	if c := a.cached(node); c != nil {
		if usable, err := usablePools(c.pools, family, node, c.node.labels, nil, api.UseWorkload); err == nil {
			for _, b := range c.blocks {
				if _, ok := poolFor(usable, b.cidr); ok && b.free() > 0 {
					return netip.Prefix{}, nil
				}
			}
		}
	}
	return a.ensureBlock(ctx, node, family, true)
}

// ensureBlock claims a block of family for node unless it has a confirmed
// affine block of a usable pool (with a free address, when needFree).
func (a *Allocator) ensureBlock(ctx context.Context, node string, family int, needFree bool) (netip.Prefix, error) {
	lock := a.nodeLock(node)
	lock.Lock()
	defer lock.Unlock()
	var claimed netip.Prefix
	full := false // see claimState
	err := a.retry(ctx, "ipam: claiming a first block for "+node, func() (err error) {
		defer func() { full = full || errors.Is(err, errRetry) }()
		claimed = netip.Prefix{}
		st, err := a.loadAssignState(ctx, AssignRequest{Node: node})
		if err != nil {
			return err
		}
		usable, err := usablePools(st.pools, family, node, st.node.labels, nil, api.UseWorkload)
		if err != nil {
			return nil // nothing to claim from (yet): the first ADD will say why
		}
		if repaired, err := a.repairAffinities(ctx, node, st); err != nil {
			return err
		} else if repaired {
			return errRetry
		}
		for _, af := range st.affinities {
			if b := st.affine[af.block]; b != nil && af.state == affinityConfirmed && b.node == node {
				if _, ok := poolFor(usable, b.cidr); ok && (!needFree || b.free() > 0) {
					return nil
				}
			}
		}
		cl, err := a.claimState(ctx, node, st, full)
		if err != nil || !cl.mayClaim {
			return err
		}
		for _, p := range usable {
			cidr, ok := freeBlock(p, node, cl.taken, cl.odd)
			if !ok {
				continue
			}
			nb := newBlock(cidr, node, p.name)
			bkey, akey := blockKey(cidr), affinityKey(node, cidr)
			cmps := []datastore.Cmp{{Key: bkey, ModRevision: 0}, {Key: akey, ModRevision: 0}, {Key: p.key, ModRevision: p.rev}}
			if p.pool.Spec.NodeSelector != nil {
				cmps = append(cmps, datastore.Cmp{Key: st.node.key, ModRevision: st.node.rev})
			}
			ops := append([]datastore.Op{{Key: bkey, Value: nb.encode()}, {Key: akey, Value: encodeAffinity(affinityConfirmed)}}, summaryOps(nil, nb)...)
			rev, err := a.txn(ctx, cmps, ops)
			if err != nil {
				return err
			}
			nb.rev = rev
			a.cacheBlock(node, cidr, nb, true)
			claimed = cidr
			if err := a.written("claim"); err != nil {
				return fmt.Errorf("after claiming %s: %w", cidr, err)
			}
			return nil
		}
		return nil
	})
	return claimed, err
}
