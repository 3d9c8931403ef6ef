package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// PoolInUseError is returned by DeletePool for a pool with allocations.
type PoolInUseError struct {
	Pool      string
	Allocated int
	// LoadBalancer: the pool's addresses are held by Services, not pods.
	LoadBalancer bool
}

func (e *PoolInUseError) Error() string {
	return fmt.Sprintf("pool %s is in use: %d addresses allocated", e.Pool, e.Allocated)
}

// Is makes errors.Is(err, ErrInUse) hold.
func (e *PoolInUseError) Is(target error) bool { return target == ErrInUse }

// CreatePool stores a new IPPool after checking that IPAM can use it and
// that it overlaps no existing pool (the error names the other pool and
// wraps ErrPoolOverlap). Two overlapping pools created at the same moment
// cannot both survive: after writing, the later of the two deletes itself.
func (a *Allocator) CreatePool(ctx context.Context, pool *api.IPPool) (*api.IPPool, error) {
	if pool == nil {
		return nil, errors.New("ipam: create pool: nil pool")
	}
	c := *pool
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("ipam: invalid pool %s: %w", c.Metadata.Name, err)
	}
	mine, err := newPoolInfo(&c, "", 0)
	if err != nil {
		return nil, fmt.Errorf("ipam: %w", err)
	}
	pools, err := a.listPools(ctx)
	if err != nil {
		return nil, err
	}
	if err := overlapping(mine, pools, 0); err != nil {
		return nil, err
	}
	created, err := datastore.CreateAs(ctx, a.store, &c)
	if err != nil {
		return nil, fmt.Errorf("ipam: creating pool %s: %w", c.Metadata.Name, err)
	}
	rev, _ := strconv.ParseInt(created.Metadata.ResourceVersion, 10, 64)
	// Someone may have created an overlapping pool between our list and our
	// create; the older pool wins.
	if pools, err = a.listPools(ctx); err != nil {
		return nil, err
	}
	if err := overlapping(mine, pools, rev); err != nil {
		derr := a.store.Delete(ctx, api.KindIPPool, "", created.Metadata.Name, created.Metadata.ResourceVersion)
		if derr != nil && !errors.Is(derr, datastore.ErrNotFound) {
			return nil, errors.Join(err, fmt.Errorf("removing the overlapping pool again: %w", derr))
		}
		return nil, err
	}
	return created, nil
}

// overlapping reports a pool other than mine that overlaps it; with rev > 0
// only pools written before rev count.
func overlapping(mine poolInfo, pools []poolInfo, rev int64) error {
	for _, p := range pools {
		if p.name == mine.name || !p.prefix.Overlaps(mine.prefix) || (rev > 0 && p.rev > rev) {
			continue
		}
		return fmt.Errorf("ipam: spec.cidr: %s %s (%s) overlaps %s %s (%s): %w", poolKind(mine), mine.name, mine.prefix, poolKind(p), p.name, p.prefix, ErrPoolOverlap)
	}
	return nil
}

// DeletePool deletes a pool that holds no allocations, with its blocks and
// their affinities. While any address of it is allocated it refuses with a
// *PoolInUseError. To close the race with allocations in flight it first
// disables the pool (which fails every allocation transaction that read the
// pool before), counts again, and re-enables it if it is still in use.
func (a *Allocator) DeletePool(ctx context.Context, name string) error {
	return a.retry(ctx, "ipam: deleting pool "+name, func() error { return a.deletePoolOnce(ctx, name) })
}

func (a *Allocator) deletePoolOnce(ctx context.Context, name string) error {
	pools, err := a.listPools(ctx)
	if err != nil {
		return err
	}
	var pi poolInfo
	for _, p := range pools {
		if p.name == name {
			pi = p
		}
	}
	if pi.pool == nil {
		return fmt.Errorf("ipam: pool %s: %w", name, datastore.ErrNotFound)
	}
	blocks, n, err := a.poolBlocks(ctx, pi.prefix)
	if err != nil {
		return err
	}
	if n > 0 {
		return &PoolInUseError{Pool: name, Allocated: n, LoadBalancer: pi.pool.IsLoadBalancer()}
	}
	cur := pi.pool
	if !cur.Spec.Disabled {
		d := *cur
		d.Spec.Disabled = true
		disabled, err := datastore.UpdateAs(ctx, a.store, &d)
		if errors.Is(err, datastore.ErrConflict) || errors.Is(err, datastore.ErrNotFound) {
			return errRetry
		}
		if err != nil {
			return fmt.Errorf("disabling pool %s: %w", name, err)
		}
		cur = disabled
		if blocks, n, err = a.poolBlocks(ctx, pi.prefix); err != nil {
			return err
		}
		if n > 0 {
			e := *cur
			e.Spec.Disabled = false
			if _, err := a.store.Update(ctx, &e); err != nil {
				return errors.Join(&PoolInUseError{Pool: name, Allocated: n, LoadBalancer: pi.pool.IsLoadBalancer()}, fmt.Errorf("re-enabling pool %s: %w", name, err))
			}
			return &PoolInUseError{Pool: name, Allocated: n, LoadBalancer: pi.pool.IsLoadBalancer()}
		}
	}
	affs, err := a.listAffinities(ctx, affinitiesPrefix)
	if err != nil {
		return err
	}
	done := map[netip.Prefix]bool{}
	for _, b := range blocks {
		done[b.cidr] = true
		cmps := []datastore.Cmp{{Key: blockKey(b.cidr), ModRevision: b.rev}}
		ops := []datastore.Op{{Key: blockKey(b.cidr), Delete: true}, {Key: summaryKey(b.cidr), Delete: true}}
		for _, af := range affs {
			if af.block == b.cidr {
				cmps = append(cmps, datastore.Cmp{Key: affinityKey(af.node, af.block), ModRevision: af.rev})
				ops = append(ops, datastore.Op{Key: affinityKey(af.node, af.block), Delete: true})
			}
		}
		if _, err := a.txn(ctx, cmps, ops); err != nil {
			return err
		}
		if b.node != "" {
			a.cacheBlock(b.node, b.cidr, nil, false)
		}
		if err := a.written("delete-pool"); err != nil {
			return err
		}
	}
	// Affinities whose block was already gone.
	for _, af := range affs {
		if !pi.holds(af.block) || done[af.block] {
			continue
		}
		_, err := a.txn(ctx, []datastore.Cmp{{Key: affinityKey(af.node, af.block), ModRevision: af.rev}},
			[]datastore.Op{{Key: affinityKey(af.node, af.block), Delete: true}})
		if err != nil && !errors.Is(err, errRetry) {
			return err
		}
	}
	err = a.store.Delete(ctx, api.KindIPPool, "", name, cur.Metadata.ResourceVersion)
	if errors.Is(err, datastore.ErrConflict) {
		return errRetry
	}
	if err != nil && !errors.Is(err, datastore.ErrNotFound) {
		return fmt.Errorf("ipam: deleting pool %s: %w", name, err)
	}
	return a.written("delete-pool")
}

// poolBlocks returns the blocks inside prefix and how many addresses they
// and LoadBalancer Services hold.
func (a *Allocator) poolBlocks(ctx context.Context, prefix netip.Prefix) ([]*block, int, error) {
	all, _, err := a.listBlocks(ctx)
	if err != nil {
		return nil, 0, err
	}
	var out []*block
	n, err := a.lbInUse(ctx, prefix)
	if err != nil {
		return nil, 0, err
	}
	for _, b := range all {
		if prefix.Overlaps(b.cidr) {
			out = append(out, b)
			n += b.inUse()
		}
	}
	return out, n, nil
}

// poolKind names a pool's use for messages.
func poolKind(p poolInfo) string {
	if p.pool.IsLoadBalancer() {
		return "LoadBalancer pool"
	}
	return "pool"
}
