package api

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// ---------------------------------------------------------------- Service

// KindService is the kind of Service records.
const KindService = "Service"

// Values of ServiceSpec.ExternalTrafficPolicy (Kubernetes' spelling).
const (
	TrafficPolicyCluster = "Cluster"
	TrafficPolicyLocal   = "Local"
)

// Service is the compact record of one Kubernetes Service that
// tabby-kube-controllers writes (agents hold no Kubernetes rights) and
// agents advertise from (docs/bgp.md, "Services"). It is namespaced by the
// Service's namespace and named as the Service.
type Service struct {
	TypeMeta `json:",inline"`
	Metadata ObjectMeta  `json:"metadata"`
	Spec     ServiceSpec `json:"spec"`
}

// ServiceSpec is what advertisement needs of a Service. Addresses are
// bare IPv4 or IPv6 addresses; lists are sorted.
type ServiceSpec struct {
	// Type is the Service's spec.type (ClusterIP, NodePort,
	// LoadBalancer), informational.
	Type string `json:"type,omitempty"`
	// ClusterIPs are spec.clusterIPs (none for a headless Service).
	ClusterIPs []string `json:"clusterIPs,omitempty"`
	// ExternalIPs are spec.externalIPs.
	ExternalIPs []string `json:"externalIPs,omitempty"`
	// LoadBalancerIPs are the ip fields of status.loadBalancer.ingress.
	LoadBalancerIPs []string `json:"loadBalancerIPs,omitempty"`
	// ExternalTrafficPolicy is Cluster (the default) or Local.
	ExternalTrafficPolicy string `json:"externalTrafficPolicy,omitempty"`
	// EndpointNodes are the nodes with at least one ready endpoint of
	// the Service (EndpointSlices' nodeName of ready endpoints).
	EndpointNodes []string `json:"endpointNodes,omitempty"`
	// EndpointAddresses are the addresses of the ready endpoints, so that
	// `tabbyctl explain pod` can name the Services that lead to a pod.
	EndpointAddresses []string `json:"endpointAddresses,omitempty"`
}

// GetTypeMeta implements Object.
func (s *Service) GetTypeMeta() *TypeMeta { return &s.TypeMeta }

// GetMeta implements Object.
func (s *Service) GetMeta() *ObjectMeta { return &s.Metadata }

// SetDefaults implements Object: externalTrafficPolicy Cluster.
func (s *Service) SetDefaults() {
	setTypeMeta(&s.TypeMeta, KindService)
	if s.Spec.ExternalTrafficPolicy == "" {
		s.Spec.ExternalTrafficPolicy = TrafficPolicyCluster
	}
}

// Local reports whether the Service's external addresses are only
// advertised from nodes with a ready local endpoint.
func (s *Service) Local() bool { return s.Spec.ExternalTrafficPolicy == TrafficPolicyLocal }

// HasEndpointOn reports whether node has a ready endpoint of the Service.
func (s *Service) HasEndpointOn(node string) bool { return slices.Contains(s.Spec.EndpointNodes, node) }

// Validate implements Object.
func (s *Service) Validate() error {
	var v validator
	v.typeMeta(&s.TypeMeta, KindService)
	v.meta(&s.Metadata, kindInfoOf(s))
	for _, f := range []struct {
		path string
		list []string
	}{
		{"spec.clusterIPs", s.Spec.ClusterIPs},
		{"spec.externalIPs", s.Spec.ExternalIPs},
		{"spec.loadBalancerIPs", s.Spec.LoadBalancerIPs},
		{"spec.endpointAddresses", s.Spec.EndpointAddresses},
	} {
		for i, a := range f.list {
			if _, err := ParseServiceAddr(a); err != nil {
				v.add(idx(f.path, i), "%s", err)
			}
		}
	}
	switch s.Spec.ExternalTrafficPolicy {
	case "", TrafficPolicyCluster, TrafficPolicyLocal:
	default:
		v.add("spec.externalTrafficPolicy", "%q must be %s or %s", s.Spec.ExternalTrafficPolicy, TrafficPolicyCluster, TrafficPolicyLocal)
	}
	for i, n := range s.Spec.EndpointNodes {
		if p := checkDNSSubdomain(n); p != "" {
			v.add(idx("spec.endpointNodes", i), "%s", p)
		}
	}
	return v.err()
}

// ParseServiceAddr parses one address of a Service record: an IPv4 or
// IPv6 address without zone (an IPv4-mapped IPv6 address is unmapped).
func ParseServiceAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%q is not an IP address", s)
	}
	if a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%q: a Service address has no zone", s)
	}
	return a.Unmap(), nil
}

// ServiceAddrs parses list, leaving out entries that do not parse.
func ServiceAddrs(list []string) []netip.Addr {
	out := make([]netip.Addr, 0, len(list))
	for _, s := range list {
		if a, err := ParseServiceAddr(s); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// ---------------------------------------------------------------- BGPConfiguration: Services

// ServiceCIDR is one entry of BGPConfiguration's serviceClusterIPs,
// serviceExternalIPs and serviceLoadBalancerIPs (Calico's
// ServiceClusterIPBlock and friends).
type ServiceCIDR struct {
	CIDR string `json:"cidr"`
}

// PrefixAdvertisement gives the Service prefixes inside CIDR communities:
// "aa:nn" standard ones and "aa:nn:mm" large ones (Calico's field; Tabby
// takes literal values, not names).
type PrefixAdvertisement struct {
	CIDR        string   `json:"cidr"`
	Communities []string `json:"communities"`
}

// NodeConfigPrefix starts the name of a node's own BGPConfiguration
// ("node.worker-1"), as Calico's.
const NodeConfigPrefix = "node."

// NodeConfigName is the name of node's own BGPConfiguration.
func NodeConfigName(node string) string { return NodeConfigPrefix + node }

func isNodeConfigName(name string) bool {
	n, ok := strings.CutPrefix(name, NodeConfigPrefix)
	return ok && n != "" && checkDNSSubdomain(n) == ""
}

// ServicePrefixes parses cidrs, masked, leaving out entries that do not parse.
func ServicePrefixes(cidrs []ServiceCIDR) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(cidrs))
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c.CIDR); err == nil && p.Addr().Zone() == "" {
			out = append(out, p.Masked())
		}
	}
	return out
}

// serviceAdvertisement validates the Service fields of c and, for a
// node's configuration, that it sets nothing cluster-wide.
func (v *validator) serviceAdvertisement(c *BGPConfiguration) {
	s := &c.Spec
	for _, f := range []struct {
		path string
		list []ServiceCIDR
	}{
		{"spec.serviceClusterIPs", s.ServiceClusterIPs},
		{"spec.serviceExternalIPs", s.ServiceExternalIPs},
		{"spec.serviceLoadBalancerIPs", s.ServiceLoadBalancerIPs},
	} {
		seen := map[netip.Prefix]int{}
		for i, e := range f.list {
			path := idx(f.path, i) + ".cidr"
			p, ok := v.cidr(path, e.CIDR)
			if !ok {
				continue
			}
			if p.Addr().Is4In6() {
				v.add(path, "%q: an IPv4-mapped IPv6 range; write the IPv4 range", e.CIDR)
				continue
			}
			if p.Bits() == 0 {
				v.add(path, "%q would advertise every %s address", e.CIDR, familyName(p.Addr().Is6()))
			}
			if j, dup := seen[p]; dup {
				v.add(path, "%q is listed twice (also at [%d])", e.CIDR, j)
			}
			seen[p] = i
		}
	}
	for i, pa := range s.PrefixAdvertisements {
		path := idx("spec.prefixAdvertisements", i)
		v.cidr(path+".cidr", pa.CIDR)
		if len(pa.Communities) == 0 {
			v.add(path+".communities", "is required")
		}
		for j, c := range pa.Communities {
			if _, _, err := ParseAnyCommunity(c); err != nil {
				v.add(idx(path+".communities", j), "%s", err)
			}
		}
	}
	if !isNodeConfigName(c.Metadata.Name) {
		return
	}
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"asNumber", s.ASNumber != nil}, {"nodeToNodeMeshEnabled", s.NodeToNodeMeshEnabled != nil},
		{"listenPort", s.ListenPort != nil}, {"nodeMeshPassword", !s.NodeMeshPassword.IsZero()},
		{"nodeMeshMaxRestartTime", s.NodeMeshMaxRestartTime != nil},
		{"keepaliveTime", s.KeepaliveTime != nil}, {"holdTime", s.HoldTime != nil},
	} {
		if f.set {
			v.add("spec."+f.name, "is cluster-wide: set it in the BGPConfiguration %q, not in a node's %q", SingletonName, c.Metadata.Name)
		}
	}
}

// ParseAnyCommunity parses a standard ("aa:nn") or a large ("aa:nn:mm")
// community; large says which it was.
func ParseAnyCommunity(s string) (std uint32, large *LargeCommunity, err error) {
	if strings.Count(s, ":") == 2 {
		l, err := ParseLargeCommunity(s)
		if err != nil {
			return 0, nil, err
		}
		return 0, &l, nil
	}
	n, err := ParseCommunity(s)
	if err != nil {
		return 0, nil, err
	}
	if w := wellKnownCommunities[n]; w != "" {
		return 0, nil, fmt.Errorf("%q is the well-known community %s, which would stop the prefixes from being propagated", s, w)
	}
	return n, nil, nil
}

// EffectiveServices returns the Service fields in force on a node: each
// list of the node's own configuration (nil: none) that is set replaces
// the cluster's (global) one; prefix advertisements of both apply, the
// node's first.
func EffectiveServices(global, node *BGPConfiguration) BGPConfigurationSpec {
	var out BGPConfigurationSpec
	if global != nil {
		out.ServiceClusterIPs = global.Spec.ServiceClusterIPs
		out.ServiceExternalIPs = global.Spec.ServiceExternalIPs
		out.ServiceLoadBalancerIPs = global.Spec.ServiceLoadBalancerIPs
		out.PrefixAdvertisements = global.Spec.PrefixAdvertisements
	}
	if node == nil {
		return out
	}
	if len(node.Spec.ServiceClusterIPs) > 0 {
		out.ServiceClusterIPs = node.Spec.ServiceClusterIPs
	}
	if len(node.Spec.ServiceExternalIPs) > 0 {
		out.ServiceExternalIPs = node.Spec.ServiceExternalIPs
	}
	if len(node.Spec.ServiceLoadBalancerIPs) > 0 {
		out.ServiceLoadBalancerIPs = node.Spec.ServiceLoadBalancerIPs
	}
	if len(node.Spec.PrefixAdvertisements) > 0 {
		out.PrefixAdvertisements = append(slices.Clone(node.Spec.PrefixAdvertisements), out.PrefixAdvertisements...)
	}
	return out
}

// ServiceAdvertisementStatus is what a node does with one Service prefix
// (AgentStatus.Services): a serviceClusterIPs range (Service empty) or an
// external or LoadBalancer IP of a Service.
type ServiceAdvertisementStatus struct {
	// Service is "<namespace>/<name>", empty for a serviceClusterIPs range.
	Service string `json:"service,omitempty"`
	// Kind is clusterIPRange, externalIP or loadBalancerIP.
	Kind       string `json:"kind"`
	Prefix     string `json:"prefix"`
	Advertised bool   `json:"advertised,omitempty"`
	// Refused says the configuration does not allow the address.
	Refused bool   `json:"refused,omitempty"`
	Reason  string `json:"reason,omitempty"`
}
