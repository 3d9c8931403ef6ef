package bgp

import (
	"net/netip"
	"slices"

	"github.com/osrg/gobgp/v4/pkg/apiutil"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

// candidate is one path to a prefix, reduced to what best-path and ECMP
// decisions need.
type candidate struct {
	local     bool       // originated by this speaker
	peer      netip.Addr // the peer it came from (zero when local)
	nextHop   netip.Addr
	ibgp      bool
	localPref uint32
	asPathLen int
	origin    uint8
	med       uint32
}

// sameCost reports whether two paths tie on every attribute GoBGP's
// best-path comparison looks at before the router-ID tie break (eBGP over
// iBGP, local preference, AS path length, origin, MED); such paths are
// used together as ECMP.
func sameCost(a, b candidate) bool {
	return a.ibgp == b.ibgp && a.localPref == b.localPref && a.asPathLen == b.asPathLen &&
		a.origin == b.origin && a.med == b.med
}

// selectRoutes turns the RIB into learned routes. paths must list each
// prefix's paths best first, as GoBGP keeps them. A prefix we originate
// ourselves is skipped (the local route wins and the agent owns it), as is
// every path whose next hop is one of self, and every path from a peer in
// skip (BFD peers found silent). The remaining best path and all
// paths tying with it give the route's next hops.
func selectRoutes(rib map[netip.Prefix][]candidate, self []netip.Addr, skip map[netip.Addr]bool) []LearnedRoute {
	var out []LearnedRoute
	for prefix, paths := range rib {
		if slices.ContainsFunc(paths, func(c candidate) bool { return c.local }) {
			continue
		}
		var best *candidate
		var hops []netip.Addr
		for i := range paths {
			c := paths[i]
			if !c.nextHop.IsValid() || slices.Contains(self, c.nextHop) || skip[c.peer] {
				continue
			}
			if best == nil {
				best = &paths[i]
			} else if !sameCost(*best, c) {
				continue
			}
			if !slices.Contains(hops, c.nextHop) {
				hops = append(hops, c.nextHop)
			}
		}
		if len(hops) == 0 {
			continue
		}
		slices.SortFunc(hops, netip.Addr.Compare)
		out = append(out, LearnedRoute{Prefix: prefix, NextHops: hops})
	}
	slices.SortFunc(out, func(a, b LearnedRoute) int { return a.Prefix.Compare(b.Prefix) })
	return out
}

// candidateFromPath extracts a candidate from a GoBGP path. ok is false for
// withdrawals and for paths that are not IPv4 or IPv6 unicast. A next hop
// of the other family than the prefix (an IPv4-mapped IPv6 next hop, say),
// or a link-local one (the kernel route would need an interface), leaves
// the candidate without next hop: selectRoutes skips it.
func candidateFromPath(p *apiutil.Path, ourASN uint32) (netip.Prefix, candidate, bool) {
	if p == nil || p.Withdrawal || (p.Family != gobgp.RF_IPv4_UC && p.Family != gobgp.RF_IPv6_UC) {
		return netip.Prefix{}, candidate{}, false
	}
	nlri, ok := p.Nlri.(*gobgp.IPAddrPrefix)
	if !ok {
		return netip.Prefix{}, candidate{}, false
	}
	c := candidate{
		local:     !p.PeerAddress.IsValid(),
		peer:      p.PeerAddress,
		ibgp:      p.PeerASN == ourASN,
		localPref: 100,
	}
	for _, a := range p.Attrs {
		switch a := a.(type) {
		case *gobgp.PathAttributeNextHop:
			c.nextHop = a.Value
		case *gobgp.PathAttributeMpReachNLRI:
			if !c.nextHop.IsValid() {
				c.nextHop = a.Nexthop
			}
		case *gobgp.PathAttributeLocalPref:
			c.localPref = a.Value
		case *gobgp.PathAttributeOrigin:
			c.origin = a.Value
		case *gobgp.PathAttributeMultiExitDisc:
			c.med = a.Value
		case *gobgp.PathAttributeAsPath:
			for _, seg := range a.Value {
				c.asPathLen += seg.ASLen()
			}
		}
	}
	prefix := nlri.Prefix.Masked()
	if nh := c.nextHop; nh.Is4() != prefix.Addr().Is4() || nh.Is4In6() || nh.IsLinkLocalUnicast() || nh.Zone() != "" {
		c.nextHop = netip.Addr{}
	}
	return prefix, c, true
}

// equalRoutes reports whether two route sets are the same.
func equalRoutes(a, b []LearnedRoute) bool {
	return slices.EqualFunc(a, b, func(x, y LearnedRoute) bool {
		return x.Prefix == y.Prefix && slices.Equal(x.NextHops, y.NextHops)
	})
}
