package ipam

import (
	"net/netip"
	"slices"
)

// nodeCache is what the last slow-path assign for a node read: every pool,
// the Node's labels and the node's confirmed affine blocks. The fast path
// allocates from it with a single transaction that compares the revisions of
// everything it relied on (block, pool, Node when the pool has a selector,
// and that the handle does not exist), so a stale cache costs one failed
// transaction and never a wrong allocation. Cached values are never mutated:
// updates replace them.
type nodeCache struct {
	pools  []poolInfo
	node   nodeInfo
	blocks []*block // sorted by CIDR
}

func (a *Allocator) cached(node string) *nodeCache {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.caches[node]
}

func (a *Allocator) setCache(node string, c *nodeCache) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c == nil {
		delete(a.caches, node)
		return
	}
	a.caches[node] = c
}

// cacheBlock records a block this process just wrote: it replaces the cached
// copy (or joins the cache when it is affine to the node and add is set);
// a nil b removes cidr.
func (a *Allocator) cacheBlock(node string, cidr netip.Prefix, b *block, add bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.caches[node]
	if c == nil {
		return
	}
	blocks := slices.Clone(c.blocks)
	i, found := slices.BinarySearchFunc(blocks, cidr, func(x *block, p netip.Prefix) int { return comparePrefix(x.cidr, p) })
	switch {
	case found && b != nil && blocks[i].rev > b.rev:
		return // a newer write already refreshed it
	case found && b != nil && b.node == node:
		blocks[i] = b
	case found:
		blocks = slices.Delete(blocks, i, i+1)
	case b != nil && add && b.node == node:
		blocks = slices.Insert(blocks, i, b)
	default:
		return
	}
	a.caches[node] = &nodeCache{pools: c.pools, node: c.node, blocks: blocks}
}

func comparePrefix(x, y netip.Prefix) int {
	if c := x.Addr().Compare(y.Addr()); c != 0 {
		return c
	}
	return x.Bits() - y.Bits()
}

// rememberWritten records the handle record this process just wrote for
// node (one per node: the pod being added).
func (a *Allocator) rememberWritten(node string, h *handle) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lastHandle[node] = h
}

// lastWritten returns the handle record last written for node when it is
// the named one, else nil.
func (a *Allocator) lastWritten(node, name string) *handle {
	a.mu.Lock()
	defer a.mu.Unlock()
	if h := a.lastHandle[node]; h != nil && h.Handle == name {
		return h
	}
	return nil
}
