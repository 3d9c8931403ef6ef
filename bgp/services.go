package bgp

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/tabbynet/tabby/api"
)

// ServiceView is what the Service source computes from: the Service
// configuration in force on the node (api.EffectiveServices: the node's
// own BGPConfiguration over the cluster's), the Service records, the
// node's name, and whether BGP carries IPv6 here.
type ServiceView struct {
	Node     string
	Config   api.BGPConfigurationSpec
	Services []*api.Service
	IPv6     bool
	// Pools are the IP pools (their CIDRs): a serviceClusterIPs range
	// overlapping one is refused.
	Pools []netip.Prefix
}

// Kinds of Service address in a ServiceDecision.
const (
	ServiceClusterIPRange = "clusterIPRange" // a serviceClusterIPs CIDR
	ServiceExternalIP     = "externalIP"
	ServiceLoadBalancerIP = "loadBalancerIP"
)

// ServiceDecision is what the node does with one Service prefix: a
// serviceClusterIPs range, or one external or LoadBalancer IP of a
// Service (as /32, /128). Refused says the configuration does not allow
// the address (an operator's mistake, worth a log line and a status
// entry); an address that is not advertised for a normal reason (a Local
// Service without a ready endpoint here) is neither advertised nor
// refused, and Reason says why.
type ServiceDecision struct {
	// Service is "<namespace>/<name>", empty for a serviceClusterIPs range.
	Service    string       `json:"service,omitempty"`
	Kind       string       `json:"kind"`
	Prefix     netip.Prefix `json:"prefix"`
	Advertised bool         `json:"advertised"`
	Refused    bool         `json:"refused,omitempty"`
	Reason     string       `json:"reason,omitempty"`
}

// ServiceDecisions decides, for every Service prefix of v, whether this
// node advertises it (docs/bgp.md, "Services"):
//   - every serviceClusterIPs CIDR, from every node;
//   - an external IP inside serviceExternalIPs, a LoadBalancer IP inside
//     serviceLoadBalancerIPs, as /32 (/128): for externalTrafficPolicy
//     Cluster from every node, for Local only from nodes with a ready
//     endpoint of the Service;
//   - an external or LoadBalancer IP is not advertised when no range of
//     its kind is configured, and refused when it lies outside them; and
//     so is a serviceClusterIPs range that overlaps an IP pool (every
//     node would draw the pool's traffic);
//   - IPv6 only when the node carries IPv6.
//
// It is pure; the result is sorted by prefix, then Service. One address
// of two Services is decided once per Service.
func ServiceDecisions(v ServiceView) []ServiceDecision {
	var out []ServiceDecision
	family := func(d ServiceDecision) ServiceDecision {
		if d.Advertised && !d.Prefix.Addr().Is4() && !v.IPv6 {
			d.Advertised, d.Reason = false, "IPv6: this node has no IPv6 address, so BGP carries no IPv6"
		}
		return d
	}
	for _, p := range api.ServicePrefixes(v.Config.ServiceClusterIPs) {
		d := ServiceDecision{Kind: ServiceClusterIPRange, Prefix: p, Advertised: true}
		if i := slices.IndexFunc(v.Pools, p.Overlaps); i >= 0 {
			d.Advertised, d.Refused = false, true
			d.Reason = fmt.Sprintf("serviceClusterIPs range %s overlaps IP pool %s: every node would draw the pool's traffic", p, v.Pools[i])
		}
		out = append(out, family(d))
	}
	extRanges := api.ServicePrefixes(v.Config.ServiceExternalIPs)
	lbRanges := api.ServicePrefixes(v.Config.ServiceLoadBalancerIPs)
	for _, s := range v.Services {
		if s == nil {
			continue
		}
		name := s.Metadata.Namespace + "/" + s.Metadata.Name
		decide := func(kind, field string, addrs []string, ranges []netip.Prefix) {
			seen := map[netip.Addr]bool{}
			for _, a := range api.ServiceAddrs(addrs) {
				if seen[a] {
					continue
				}
				seen[a] = true
				d := ServiceDecision{Service: name, Kind: kind, Prefix: netip.PrefixFrom(a, a.BitLen())}
				switch {
				case len(ranges) == 0:
					// The kind is not advertised at all: not a mistake.
					d.Reason = fmt.Sprintf("no %s configured in BGPConfiguration", field)
				case !slices.ContainsFunc(ranges, func(r netip.Prefix) bool { return r.Contains(a) }):
					d.Refused = true
					d.Reason = fmt.Sprintf("%s is outside %s %v", a, field, ranges)
				case s.Local() && !s.HasEndpointOn(v.Node):
					d.Reason = "externalTrafficPolicy Local and no ready endpoint on this node"
				default:
					d.Advertised = true
				}
				out = append(out, family(d))
			}
		}
		decide(ServiceExternalIP, "serviceExternalIPs", s.Spec.ExternalIPs, extRanges)
		decide(ServiceLoadBalancerIP, "serviceLoadBalancerIPs", s.Spec.LoadBalancerIPs, lbRanges)
	}
	slices.SortStableFunc(out, func(a, b ServiceDecision) int {
		return cmp.Or(a.Prefix.Compare(b.Prefix), cmp.Compare(a.Service, b.Service))
	})
	return out
}

// ServiceAdvertisements are the advertised prefixes of ds, one per
// prefix, with the communities of every prefixAdvertisements entry whose
// CIDR holds the prefix.
func ServiceAdvertisements(ds []ServiceDecision, pas []api.PrefixAdvertisement) []Advertisement {
	var out []Advertisement
	for _, d := range ds {
		if d.Advertised {
			out = append(out, withCommunities(Advertisement{Prefix: d.Prefix, ExternalOnly: true}, pas))
		}
	}
	return MergeAdvertisements(out)
}

// ServicePrefixes are every prefix of ds, advertised here or not but not
// refused: the Service addresses of the cluster, which no learned route
// may take the place of (ImportContext.Services).
func ServicePrefixes(ds []ServiceDecision) []netip.Prefix {
	var out []netip.Prefix
	for _, d := range ds {
		if !d.Refused {
			out = append(out, d.Prefix)
		}
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return slices.Compact(out)
}

func withCommunities(a Advertisement, pas []api.PrefixAdvertisement) Advertisement {
	for _, pa := range pas {
		r, err := netip.ParsePrefix(pa.CIDR)
		if err != nil || r.Bits() > a.Prefix.Bits() || !r.Masked().Contains(a.Prefix.Addr()) {
			continue
		}
		for _, c := range pa.Communities {
			std, large, err := api.ParseAnyCommunity(c)
			switch {
			case err != nil:
			case large != nil:
				a.LargeCommunities = append(a.LargeCommunities, *large)
			default:
				a.Communities = append(a.Communities, std)
			}
		}
	}
	return a
}

// serviceMarker is the large community the speaker puts on the paths of
// Service prefixes (Advertisement.ExternalOnly) so that its export policy
// can keep them from cluster peers without a prefix list that would
// change, and soft-reset every session, with each Service. Its global
// administrator is AS 4294967295, reserved (RFC 7300), so no operator's
// community collides with it; the export policy strips it towards
// external peers, so it never leaves the node.
var serviceMarker = api.LargeCommunity{ASN: 4294967295, Local1: 25, Local2: 1}

// ServiceSource advertises the Service prefixes ServiceDecisions lets
// this node advertise (nothing when the view has no ServiceView).
type ServiceSource struct{}

// Name implements AdvertisementSource.
func (ServiceSource) Name() string { return "services" }

// Advertisements implements AdvertisementSource.
func (ServiceSource) Advertisements(v SourceView) []Advertisement {
	if v.Services == nil {
		return nil
	}
	return ServiceAdvertisements(ServiceDecisions(*v.Services), v.Services.Config.PrefixAdvertisements)
}
