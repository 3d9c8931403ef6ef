package ipam

import (
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strings"

	"github.com/tabbynet/tabby/api"
)

// poolInfo is an IPPool as IPAM sees it, with the etcd key and revision that
// allocation transactions compare against.
type poolInfo struct {
	pool      *api.IPPool
	name      string
	prefix    netip.Prefix
	blockBits int
	key       string
	rev       int64
}

// family is 4 or 6.
func (p poolInfo) family() int { return familyOf(p.prefix.Addr()) }

// familyOf is 4 or 6.
func familyOf(a netip.Addr) int {
	if a.Is6() {
		return 6
	}
	return 4
}

// newPoolInfo checks the fields IPAM relies on.
func newPoolInfo(p *api.IPPool, key string, rev int64) (poolInfo, error) {
	pfx, err := p.Prefix()
	if err != nil {
		return poolInfo{}, fmt.Errorf("pool %s: cidr: %w", p.Metadata.Name, err)
	}
	def, lo, hi := api.BlockSizes(pfx.Addr().Is6())
	bits := p.Spec.BlockSize
	if bits == 0 {
		bits = def
	}
	switch {
	case pfx.Addr().Is4In6() || pfx.Addr().Zone() != "":
		return poolInfo{}, fmt.Errorf("pool %s: cidr %s is not a plain IPv4 or IPv6 prefix", p.Metadata.Name, pfx)
	case bits < lo || bits > hi:
		return poolInfo{}, fmt.Errorf("pool %s: blockSize %d outside %d–%d", p.Metadata.Name, bits, lo, hi)
	case bits < pfx.Bits() && !p.IsLoadBalancer():
		// A LoadBalancer pool has no blocks: its addresses are handed
		// out one by one (lb.go), so its blockSize means nothing.
		return poolInfo{}, fmt.Errorf("pool %s: blockSize /%d is larger than the pool %s", p.Metadata.Name, bits, pfx)
	}
	return poolInfo{pool: p, name: p.Metadata.Name, prefix: pfx, blockBits: bits, key: key, rev: rev}, nil
}

// isNamed reports whether a requested pool, by name or by CIDR (as
// Calico's ipv4_pools allows), is this one.
func (p poolInfo) isNamed(r string) bool {
	if r == p.name {
		return true
	}
	pfx, err := netip.ParsePrefix(r)
	return err == nil && pfx.Masked() == p.prefix
}

// holds reports whether the block lies inside the pool.
func (p poolInfo) holds(b netip.Prefix) bool {
	return p.prefix.Bits() <= b.Bits() && p.prefix.Contains(b.Addr())
}

// poolFor returns the pool that holds the block or address prefix.
func poolFor(pools []poolInfo, b netip.Prefix) (poolInfo, bool) {
	for _, p := range pools {
		if p.holds(b) {
			return p, true
		}
	}
	return poolInfo{}, false
}

// unusableReason says why a pool cannot serve the node, "" when it can.
func unusableReason(p poolInfo, labels map[string]string, requested []string, use api.IPPoolUse) string {
	switch {
	case len(requested) > 0 && !slices.ContainsFunc(requested, p.isNamed):
		return fmt.Sprintf("is not among the requested pools %v", requested)
	case p.pool.IsLoadBalancer():
		return "is a LoadBalancer pool (allowedUses [LoadBalancer]): its addresses are for Services, never for pods"
	case !p.pool.Allows(use):
		return fmt.Sprintf("does not allow %s use (allowedUses %v)", use, p.pool.Uses())
	case p.pool.Spec.Disabled:
		return "is disabled"
	case !p.pool.SelectsNode(labels):
		return fmt.Sprintf("does not select the node (nodeSelector %s)", p.pool.Spec.NodeSelector)
	}
	return ""
}

// usablePools returns the pools of family (4 or 6) the node may allocate
// from, sorted by name. A requested pool that does not exist, or is of the
// other family, is an error: a typo should not silently fall back to
// nothing.
func usablePools(pools []poolInfo, family int, node string, labels map[string]string, requested []string, use api.IPPoolUse) ([]poolInfo, error) {
	for _, name := range requested {
		i := slices.IndexFunc(pools, func(p poolInfo) bool { return p.isNamed(name) })
		if i < 0 {
			return nil, fmt.Errorf("ipam: requested pool %q does not exist (no IP pool has that name or CIDR): %w", name, ErrNoPool)
		}
		if f := pools[i].family(); f != family {
			return nil, fmt.Errorf("ipam: requested pool %q is an IPv%d pool, asked for an IPv%d address: %w", name, f, family, ErrNoPool)
		}
	}
	var out []poolInfo
	var why []string
	for _, p := range pools {
		if p.family() != family {
			continue
		}
		if r := unusableReason(p, labels, requested, use); r != "" {
			why = append(why, fmt.Sprintf("%s %s", p.name, r))
			continue
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		if len(why) == 0 {
			return nil, fmt.Errorf("ipam: no usable IPv%d pool for node %s: no IPv%d pools exist: %w", family, node, family, ErrNoPool)
		}
		return nil, fmt.Errorf("ipam: no usable IPv%d pool for node %s: %s: %w", family, node, strings.Join(why, "; "), ErrNoPool)
	}
	slices.SortFunc(out, func(a, b poolInfo) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

func poolNames(pools []poolInfo) []string {
	out := make([]string, len(pools))
	for i, p := range pools {
		out[i] = p.name
	}
	return out
}

// nodeHash spreads nodes over a pool's blocks so that nodes claiming at the
// same time rarely race for the same block.
func nodeHash(node string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(node))
	return h.Sum64()
}

// freeBlock returns a block of pool p that no existing block overlaps,
// scanning from a node-dependent start so that concurrent claims from
// different nodes spread out. taken holds the existing blocks.
func freeBlock(p poolInfo, node string, taken map[netip.Prefix]bool, odd []netip.Prefix) (netip.Prefix, bool) {
	n := numBlocks(p.prefix, p.blockBits)
	if n == 0 {
		return netip.Prefix{}, false
	}
	start := int(nodeHash(node) % uint64(n))
	for i := range n {
		cand := nthBlock(p.prefix, p.blockBits, (start+i)%n)
		if taken[cand] || slices.ContainsFunc(odd, cand.Overlaps) {
			continue
		}
		return cand, true
	}
	return netip.Prefix{}, false
}
