package api

import (
	"net/netip"
	"time"
)

// Values of BGPConfigurationSpec.RouteReflectorMode.
const (
	// RouteReflectorModeManual (or empty): the reflectors are the nodes
	// an operator gave a routeReflectorClusterID.
	RouteReflectorModeManual = "Manual"
	// RouteReflectorModeAuto: the agents elect routeReflectorsPerZone
	// reflectors in each zone among the live, eligible nodes.
	RouteReflectorModeAuto = "Auto"
)

// Values of AutoReflectorSpec.RouteReflectorPeering: how two reflectors
// with different cluster IDs (the elected reflectors of different zones)
// treat each other (docs/bgp.md, "Reflectors that place themselves").
const (
	// ReflectorPeeringNonClient: as plain iBGP peers, neither the other's
	// client (RFC 4456's full mesh of reflectors): a route one learns from
	// the other goes to its clients only. Auto mode's default.
	ReflectorPeeringNonClient = "NonClient"
	// ReflectorPeeringClient: each as the other's client, Calico's rule
	// (a reflector makes every iBGP peer without its cluster ID its
	// client). Manual mode always peers so.
	ReflectorPeeringClient = "Client"
)

// Defaults of the automatic route reflectors.
const (
	DefaultZoneLabel              = "topology.kubernetes.io/zone"
	DefaultRouteReflectorsPerZone = 2
	DefaultRouteReflectorGrace    = 10 * time.Second
)

// AutoReflectorSpec are BGPConfiguration's automatic route reflector
// settings (docs/bgp.md, "Reflectors that place themselves"). Only
// RouteReflectorMode Auto turns them on.
type AutoReflectorSpec struct {
	RouteReflectorMode string `json:"routeReflectorMode,omitempty"`
	// RouteReflectorsPerZone is how many reflectors each zone gets
	// (default 2; a zone with fewer eligible live nodes gets them all).
	RouteReflectorsPerZone *uint32 `json:"routeReflectorsPerZone,omitempty"`
	// ZoneLabel is the node label naming a node's zone (default
	// topology.kubernetes.io/zone); nodes without it form one zone "".
	ZoneLabel string `json:"zoneLabel,omitempty"`
	// RouteReflectorNodeSelector picks the nodes that may be elected;
	// unset means every node.
	RouteReflectorNodeSelector *LabelSelector `json:"routeReflectorNodeSelector,omitempty"`
	// RouteReflectorGracePeriod is how long a reflector's liveness record
	// may be gone (after its lease expired) before another node replaces
	// it (default 10s).
	RouteReflectorGracePeriod *Duration `json:"routeReflectorGracePeriod,omitempty"`
	// RouteReflectorPeering is how elected reflectors of different zones
	// peer: NonClient (default) or Client (Calico's rule). Auto mode only.
	RouteReflectorPeering string `json:"routeReflectorPeering,omitempty"`
}

// AutoReflectors reports whether the cluster elects its route reflectors.
func (c *BGPConfiguration) AutoReflectors() bool {
	return c != nil && c.Spec.RouteReflectorMode == RouteReflectorModeAuto
}

// EffectiveReflectorsPerZone is routeReflectorsPerZone or its default.
func (s AutoReflectorSpec) EffectiveReflectorsPerZone() int {
	if s.RouteReflectorsPerZone == nil {
		return DefaultRouteReflectorsPerZone
	}
	return int(*s.RouteReflectorsPerZone)
}

// EffectiveZoneLabel is zoneLabel or its default.
func (s AutoReflectorSpec) EffectiveZoneLabel() string {
	if s.ZoneLabel == "" {
		return DefaultZoneLabel
	}
	return s.ZoneLabel
}

// EffectiveReflectorGrace is routeReflectorGracePeriod or its default.
func (s AutoReflectorSpec) EffectiveReflectorGrace() time.Duration {
	if s.RouteReflectorGracePeriod == nil {
		return DefaultRouteReflectorGrace
	}
	return s.RouteReflectorGracePeriod.Duration
}

// EffectiveReflectorPeering is how two elected reflectors of different
// cluster IDs peer: routeReflectorPeering, NonClient by default in Auto
// mode; Client (Calico's rule) in Manual mode, where the operator's
// BGPPeers, not Tabby, decide which reflectors peer.
func (s AutoReflectorSpec) EffectiveReflectorPeering() string {
	switch {
	case s.RouteReflectorMode != RouteReflectorModeAuto:
		return ReflectorPeeringClient
	case s.RouteReflectorPeering == "":
		return ReflectorPeeringNonClient
	}
	return s.RouteReflectorPeering
}

// Eligible reports whether a node with labels may be elected.
func (s AutoReflectorSpec) Eligible(labels map[string]string) bool {
	return s.RouteReflectorNodeSelector == nil || s.RouteReflectorNodeSelector.Matches(labels)
}

// autoReflectors validates the automatic route reflector settings.
func (v *validator) autoReflectors(s *AutoReflectorSpec) {
	switch s.RouteReflectorMode {
	case "", RouteReflectorModeManual, RouteReflectorModeAuto:
	default:
		v.add("spec.routeReflectorMode", "%q must be Manual or Auto", s.RouteReflectorMode)
	}
	if n := s.RouteReflectorsPerZone; n != nil && (*n < 1 || *n > 16) {
		v.add("spec.routeReflectorsPerZone", "%d must be between 1 and 16", *n)
	}
	if s.ZoneLabel != "" {
		if msg := checkQualifiedName(s.ZoneLabel); msg != "" {
			v.add("spec.zoneLabel", "%s", msg)
		}
	}
	if s.RouteReflectorNodeSelector != nil {
		v.selector("spec.routeReflectorNodeSelector", s.RouteReflectorNodeSelector)
	}
	if g := s.RouteReflectorGracePeriod; g != nil && (g.Duration < 0 || g.Duration > time.Hour) {
		v.add("spec.routeReflectorGracePeriod", "%v must be between 0s and 1h", g.Duration)
	}
	switch s.RouteReflectorPeering {
	case "", ReflectorPeeringClient:
	case ReflectorPeeringNonClient:
		if s.RouteReflectorMode != RouteReflectorModeAuto {
			v.add("spec.routeReflectorPeering", "NonClient needs routeReflectorMode Auto: reflectors chosen by hand peer "+
				"by Calico's rule (each the other's client), since only the election guarantees that every reflector peers with every other")
		}
	default:
		v.add("spec.routeReflectorPeering", "%q must be NonClient or Client", s.RouteReflectorPeering)
	}
}

// routerID validates a node's spec.bgp.routerID: a dotted IPv4 address
// other than 0.0.0.0.
func (v *validator) routerID(path, s string) {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() || a.IsUnspecified() {
		v.add(path, "%q must be a dotted IPv4 address other than 0.0.0.0 (a BGP router ID is 32 bits)", s)
	}
}

// peerAddr validates a BGPPeer's peerIP: an IPv4 or IPv6 unicast address
// (an IPv6 one needs the node's spec.bgp.ipv6Address to be used).
func (v *validator) peerAddr(path, s string) {
	a, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		v.add(path, "%q is not a valid IP address", s)
	case a.Zone() != "" || a.IsLinkLocalUnicast():
		v.add(path, "%q: link-local (unnumbered) sessions are not supported; use a global or unique local address", s)
	case a.Is4In6():
		v.add(path, "%q: write an IPv4-mapped address as IPv4", s)
	case a.IsUnspecified() || a.IsMulticast() || a.IsLoopback():
		v.add(path, "%q is not a unicast address", s)
	}
}
