package agent

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/ipam"
)

// desiredLocalRoutes computes this node's workload and blackhole routes
// (protocol RouteProtoWorkload) from its endpoints and affine blocks.
func desiredLocalRoutes(node string, weps []*api.WorkloadEndpoint, blocks []ipam.BlockInfo) []dataplane.Route {
	var out []dataplane.Route
	for _, b := range blocks {
		if b.Affinity == node && b.Confirmed {
			out = append(out, dataplane.Route{Dst: b.CIDR.Masked(), Type: dataplane.RouteBlackhole, Proto: dataplane.RouteProtoWorkload})
		}
	}
	for _, w := range weps {
		if w.Spec.Node != node || !strings.HasPrefix(w.Spec.InterfaceName, api.WorkloadIfacePrefix) {
			continue // the view refuses such records; never route via eth0 or lo
		}
		addrs, _ := w.Addrs() // entries that do not parse are skipped
		for _, a := range addrs {
			out = append(out, dataplane.Route{Dst: netip.PrefixFrom(a, a.BitLen()), Type: dataplane.RouteUnicast, Dev: w.Spec.InterfaceName, Proto: dataplane.RouteProtoWorkload})
		}
	}
	return sortRoutes(out)
}

// aggregateBlackholes returns a blackhole route for every pool aggregate
// this node advertises (bgp.AddAggregates): a router sends traffic for the
// whole pool to the node, and an address of the pool that no block or
// learned route covers is dropped here instead of following the node's
// default route back to the router (a loop until the TTL runs out). Every
// block and learned route inside the pool is more specific and wins.
func aggregateBlackholes(node string, pools []*api.IPPool, blocks []ipam.BlockInfo, borrowed []ipam.BorrowedAddr) []dataplane.Route {
	aggs := bgp.PoolAggregates(pools)
	if len(aggs) == 0 {
		return nil
	}
	affine, lent := bgpBlocks(node, blocks, borrowed)
	var out []dataplane.Route
	for _, p := range bgp.AddAggregates(bgp.DesiredAdvertisements(affine, lent), aggs) {
		if slices.ContainsFunc(aggs, func(a bgp.Aggregate) bool { return a.Prefix == p }) {
			out = append(out, dataplane.Route{Dst: p, Type: dataplane.RouteBlackhole, Proto: dataplane.RouteProtoWorkload})
		}
	}
	return out
}

// desiredLearnedRoutes turns BGP's best routes of both families into
// kernel routes (protocol RouteProtoBGP), dropping anything that points at
// this node itself (self: its addresses) and next hops of the other family.
func desiredLearnedRoutes(self []netip.Addr, learned []bgp.LearnedRoute) []dataplane.Route {
	var out []dataplane.Route
	for _, l := range learned {
		var gws []netip.Addr
		for _, nh := range l.NextHops {
			if nh.IsValid() && !slices.Contains(self, nh) && !nh.IsUnspecified() && nh.Is4() == l.Prefix.Addr().Is4() {
				gws = append(gws, nh)
			}
		}
		if len(gws) == 0 {
			continue
		}
		out = append(out, dataplane.Route{Dst: l.Prefix, Type: dataplane.RouteUnicast, Gateways: gws, Proto: dataplane.RouteProtoBGP}.Normalized())
	}
	return sortRoutes(out)
}

// bgpBlocks splits IPAM's blocks into what this node advertises: its affine
// blocks, and the addresses it borrowed from other nodes' blocks.
func bgpBlocks(node string, blocks []ipam.BlockInfo, borrowed []ipam.BorrowedAddr) (affine, borrowedOut []bgp.Block) {
	for _, b := range blocks {
		if b.Affinity == node && b.Confirmed {
			affine = append(affine, bgp.Block{CIDR: b.CIDR.Masked(), DisableBGPExport: b.DisableBGPExport})
		}
	}
	for _, a := range borrowed {
		if a.Node == node {
			borrowedOut = append(borrowedOut, bgp.Block{CIDR: netip.PrefixFrom(a.Addr, a.Addr.BitLen()), DisableBGPExport: a.DisableBGPExport})
		}
	}
	return affine, borrowedOut
}

func sortRoutes(rs []dataplane.Route) []dataplane.Route {
	slices.SortFunc(rs, dataplane.CompareRoutes)
	return rs
}
