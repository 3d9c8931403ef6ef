package bgp

import (
	"net/netip"

	gobgpapi "github.com/osrg/gobgp/v4/api"
)

// Third-party next hops (RFC 4271 section 5.1.3).
//
// GoBGP sets itself as the next hop of every route it sends to an eBGP peer.
// A node that peers with a top-of-rack router therefore announces the other
// nodes' blocks (learned over iBGP) with itself as next hop, and the router
// may pick that path: traffic for node2's pods then detours through node1,
// and when node1 dies its stale paths (kept for the graceful-restart time)
// black-hole node2's pods at the router. BIRD, and so Calico, keep the
// original next hop when it lies on the subnet shared with the eBGP peer;
// the export policy below does the same.
const (
	sharedSubnetSet  = "tabby-shared-subnet"
	thirdPartyPolicy = "tabby-third-party-next-hop"
)

// thirdPartyNextHopPolicy builds the global export policy: a route sent to a
// peer inside subnet whose original next hop is inside subnet keeps that
// next hop. It changes nothing for iBGP peers (GoBGP never rewrites a
// learned route's next hop towards them, and our own routes carry our
// router ID) and nothing for peers or next hops elsewhere (they keep
// next-hop-self). It neither accepts nor rejects: the default (accept)
// decides.
//
// subnet6, when valid, is the node's IPv6 subnet: IPv6 routes travel on the
// same (IPv4) sessions, so the peers are still matched by subnet, and an
// IPv6 route whose original next hop lies inside subnet6 keeps it too.
func thirdPartyNextHopPolicy(subnet, subnet6 netip.Prefix) (*gobgpapi.DefinedSet, *gobgpapi.Policy) {
	var nextHops []string
	for _, p := range []netip.Prefix{subnet, subnet6} {
		if p.IsValid() {
			nextHops = append(nextHops, p.Masked().String())
		}
	}
	// Peers on either subnet: IPv6 sessions (an IPv6-only node's) too.
	set := &gobgpapi.DefinedSet{
		DefinedType: gobgpapi.DefinedType_DEFINED_TYPE_NEIGHBOR,
		Name:        sharedSubnetSet,
		List:        nextHops,
	}
	pol := &gobgpapi.Policy{
		Name: thirdPartyPolicy,
		Statements: []*gobgpapi.Statement{{
			Name: thirdPartyPolicy + "-stmt",
			Conditions: &gobgpapi.Conditions{
				// For export policies GoBGP matches the neighbor set
				// against the peer the route is sent to, and the next-hop
				// list against the route's original next hop.
				NeighborSet:   &gobgpapi.MatchSet{Type: gobgpapi.MatchSet_TYPE_ANY, Name: sharedSubnetSet},
				NextHopInList: nextHops,
			},
			Actions: &gobgpapi.Actions{
				RouteAction: gobgpapi.RouteAction_ROUTE_ACTION_UNSPECIFIED,
				Nexthop:     &gobgpapi.NexthopAction{Unchanged: true},
			},
		}},
	}
	return set, pol
}
