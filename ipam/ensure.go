package ipam

import (
	"context"
	"fmt"
	"net/netip"

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
	lock := a.nodeLock(node)
	lock.Lock()
	defer lock.Unlock()
	var claimed netip.Prefix
	err := a.retry(ctx, "ipam: claiming a first block for "+node, func() error {
		claimed = netip.Prefix{}
		st, err := a.loadAssignState(ctx, AssignRequest{Node: node})
		if err != nil {
			return err
		}
		usable, err := usablePools(st.pools, 4, node, st.node.labels, nil)
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
				if _, ok := poolFor(usable, b.cidr); ok {
					return nil
				}
			}
		}
		cl, err := a.claimState(ctx, node, st)
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
			rev, err := a.txn(ctx, cmps, []datastore.Op{{Key: bkey, Value: nb.encode()}, {Key: akey, Value: encodeAffinity(affinityConfirmed)}})
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
