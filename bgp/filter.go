package bgp

import (
	"net/netip"
	"slices"
)

// ImportContext is what the node itself routes; learned routes must never
// take its place. The agent fills it from its view and the kernel.
type ImportContext struct {
	// Workloads are the addresses of this node's workloads.
	Workloads []netip.Addr
	// Blocks are this node's affine blocks.
	Blocks []netip.Prefix
	// NodeSubnets are the node's own subnets (the uplink's prefixes).
	NodeSubnets []netip.Prefix
	// NodeRoutes are the node's own routes: connected routes and every
	// main-table route without a Tabby protocol (a default route from
	// DHCP, say). A learned route equal to one of them is dropped, so it
	// never outranks the node's route; one covering it (less specific)
	// stays, since the longest match picks the node's route anyway.
	NodeRoutes []netip.Prefix
	// Services are the cluster's Service prefixes (ServicePrefixes): a
	// learned route equal to one is dropped, so that a node never routes
	// a Service address to another node (kube-proxy on this node handles
	// it), whichever peer sent it. Equal, not inside: a ClusterIP range
	// written too wide (over a pool, say) must not cost the pod routes.
	Services []netip.Prefix
}

// Rejected is a learned route FilterLearned dropped, with the prefix of
// the node's own that it would have overridden.
type Rejected struct {
	Route LearnedRoute
	Over  netip.Prefix
}

// FilterLearned drops every learned route that equals or is more specific
// than a local workload address, a local block or a node subnet, or that
// equals a Service prefix or
// equals one of the node's own routes. It is pure; kept keeps the order of
// learned.
func FilterLearned(learned []LearnedRoute, ic ImportContext) (kept []LearnedRoute, rejected []Rejected) {
	var protect []netip.Prefix
	for _, a := range ic.Workloads {
		if a.IsValid() {
			protect = append(protect, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	for _, list := range [][]netip.Prefix{ic.Blocks, ic.NodeSubnets} {
		for _, p := range list {
			if p.IsValid() {
				protect = append(protect, p.Masked())
			}
		}
	}
	for _, r := range learned {
		dst := r.Prefix.Masked()
		over, hit := netip.Prefix{}, false
		for _, p := range protect {
			// dst is p or inside it.
			if p.Bits() <= dst.Bits() && p.Contains(dst.Addr()) {
				over, hit = p, true
				break
			}
		}
		for _, list := range [][]netip.Prefix{ic.Services, ic.NodeRoutes} {
			if hit {
				break
			}
			if i := slices.IndexFunc(list, func(p netip.Prefix) bool { return p.Masked() == dst }); i >= 0 {
				over, hit = list[i].Masked(), true
			}
		}
		if hit {
			rejected = append(rejected, Rejected{Route: r, Over: over})
			continue
		}
		kept = append(kept, r)
	}
	return kept, rejected
}
