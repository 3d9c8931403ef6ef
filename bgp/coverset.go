package bgp

import (
	"net/netip"
	"slices"
)

// coverPrefixes returns the fewest prefixes that hold exactly the given
// addresses: aligned runs of consecutive addresses merge into one prefix
// (198.18.4.0 … 198.18.7.255 is 198.18.4.0/22), every other address is a
// host prefix. A GoBGP neighbour set is matched by a linear scan of its
// prefixes for every path and neighbour, so the cluster's set — one entry
// per node otherwise — costs a reflector O(clients) per reflected path
// (docs/bgp.md, "Many signed peers"). Invalid addresses are left out.
func coverPrefixes(addrs []netip.Addr) []string {
	var ps []netip.Prefix
	for _, a := range addrs {
		if a.IsValid() {
			a = a.Unmap()
			ps = append(ps, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	slices.SortFunc(ps, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	ps = slices.Compact(ps)
	// In ascending order, a prefix can only merge with the one before it
	// (its lower sibling); the parent may then merge with the one before.
	var stack []netip.Prefix
	for _, p := range ps {
		for len(stack) > 0 {
			top := stack[len(stack)-1]
			parent, ok := siblingsParent(top, p)
			if !ok {
				break
			}
			stack, p = stack[:len(stack)-1], parent
		}
		stack = append(stack, p)
	}
	out := make([]string, len(stack))
	for i, p := range stack {
		out[i] = p.String()
	}
	return out
}

// siblingsParent returns the prefix one bit shorter that a and b split
// exactly (a its lower half, b its upper), if they do.
func siblingsParent(a, b netip.Prefix) (netip.Prefix, bool) {
	if a.Bits() != b.Bits() || a.Bits() == 0 || a.Addr().Is4() != b.Addr().Is4() {
		return netip.Prefix{}, false
	}
	parent, err := a.Addr().Prefix(a.Bits() - 1)
	if err != nil || parent.Addr() != a.Addr() || !parent.Contains(b.Addr()) {
		return netip.Prefix{}, false
	}
	return parent, true
}
