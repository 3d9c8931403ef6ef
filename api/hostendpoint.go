package api

import (
	"fmt"
	"net/netip"
	"strings"
)

// This file holds the host-protection kinds: HostEndpoint (Calico's
// resource) and ClusterConfiguration, the cluster-wide singleton that
// switches automatic host endpoints on and lists the failsafe ports.

// Kinds of the host-protection resources.
const (
	KindHostEndpoint         = "HostEndpoint"
	KindClusterConfiguration = "ClusterConfiguration"
)

// AllInterfaces is the interfaceName of a host endpoint that stands for
// every interface of its node but the workload ones (and lo).
const AllInterfaces = "*"

// AutoHostEndpointSuffix ends the name of a node's automatic host endpoint
// (Calico's "<node>-auto-hep").
const AutoHostEndpointSuffix = "-auto-hep"

// DefaultAllowProfile is the profile that makes a host endpoint allow what
// no policy decided, instead of denying it. Automatic host endpoints carry
// it (Calico's "projectcalico-default-allow", which is accepted too), so
// that switching them on alone cuts no traffic.
const DefaultAllowProfile = "tabby-default-allow"

// CalicoDefaultAllowProfile is Calico's name for DefaultAllowProfile.
const CalicoDefaultAllowProfile = "projectcalico-default-allow"

// HostEndpoint is one interface of a node, or all of them ("*"), as an
// endpoint GlobalNetworkPolicies select by its labels.
type HostEndpoint struct {
	TypeMeta `json:",inline"`
	Metadata ObjectMeta       `json:"metadata"`
	Spec     HostEndpointSpec `json:"spec"`
}

// HostEndpointSpec names the node and interface.
type HostEndpointSpec struct {
	Node string `json:"node"`
	// InterfaceName is an interface of the node, or AllInterfaces.
	InterfaceName string `json:"interfaceName"`
	// ExpectedIPs are the interface's addresses, informational (Tabby does
	// not resolve an interface from them).
	ExpectedIPs []string `json:"expectedIPs,omitempty"`
	// Profiles: only DefaultAllowProfile (or Calico's name for it) means
	// anything to Tabby, which has no Profile kind.
	Profiles []string `json:"profiles,omitempty"`
}

// DefaultAllow reports whether the endpoint carries the default-allow
// profile.
func (h *HostEndpoint) DefaultAllow() bool {
	for _, p := range h.Spec.Profiles {
		if p == DefaultAllowProfile || p == CalicoDefaultAllowProfile {
			return true
		}
	}
	return false
}

// AllInterfaces reports whether the endpoint is its node's "*" endpoint.
func (h *HostEndpoint) AllInterfaces() bool { return h.Spec.InterfaceName == AllInterfaces }

// AutoHostEndpoint is the host endpoint automatic host endpoints give a
// node: all interfaces, the node's labels, its addresses as expectedIPs
// (as Calico's), the default-allow profile.
func AutoHostEndpoint(n *Node) *HostEndpoint {
	labels := make(map[string]string, len(n.Metadata.Labels))
	for k, v := range n.Metadata.Labels {
		labels[k] = v
	}
	h := &HostEndpoint{
		Metadata: ObjectMeta{Name: n.Metadata.Name + AutoHostEndpointSuffix, Labels: labels},
		Spec:     HostEndpointSpec{Node: n.Metadata.Name, InterfaceName: AllInterfaces, Profiles: []string{DefaultAllowProfile}},
	}
	for _, f := range []func() (netip.Prefix, bool){n.IPv4, n.IPv6} {
		if p, ok := f(); ok {
			h.Spec.ExpectedIPs = append(h.Spec.ExpectedIPs, p.Addr().String())
		}
	}
	h.SetDefaults()
	return h
}

// GetTypeMeta implements Object.
func (h *HostEndpoint) GetTypeMeta() *TypeMeta { return &h.TypeMeta }

// GetMeta implements Object.
func (h *HostEndpoint) GetMeta() *ObjectMeta { return &h.Metadata }

// SetDefaults implements Object.
func (h *HostEndpoint) SetDefaults() { setTypeMeta(&h.TypeMeta, KindHostEndpoint) }

// Validate implements Object.
func (h *HostEndpoint) Validate() error {
	var v validator
	v.typeMeta(&h.TypeMeta, KindHostEndpoint)
	v.meta(&h.Metadata, kindInfoOf(h))
	s := &h.Spec
	if s.Node == "" {
		v.add("spec.node", "is required")
	} else if p := checkDNSSubdomain(s.Node); p != "" {
		v.add("spec.node", "%s", p)
	}
	switch n := s.InterfaceName; {
	case n == AllInterfaces:
	case n == "":
		v.add("spec.interfaceName", "is required (an interface of the node, or %q for all of them)", AllInterfaces)
	case strings.HasPrefix(n, WorkloadIfacePrefix):
		v.add("spec.interfaceName", "%q is a workload interface (%s…): workload endpoints police those", n, WorkloadIfacePrefix)
	case n == "lo":
		v.add("spec.interfaceName", "lo is never policed")
	default:
		if p := checkIfName(n); p != "" {
			v.add("spec.interfaceName", "%s", p)
		}
	}
	for i, ip := range s.ExpectedIPs {
		if a, err := netip.ParseAddr(ip); err != nil || a.Zone() != "" {
			v.add(idx("spec.expectedIPs", i), "%q is not an IP address", ip)
		}
	}
	for i, p := range s.Profiles {
		if p == "" {
			v.add(idx("spec.profiles", i), "must not be empty")
		}
	}
	return v.err()
}

// ---------------------------------------------------------------- ClusterConfiguration

// Values of ClusterConfigurationSpec.AutoHostEndpoints.
const (
	Enabled  = "Enabled"
	Disabled = "Disabled"
)

// ClusterConfiguration is the singleton (name "default") for cluster-wide
// settings of the agents that are neither IPAM nor BGP: Calico keeps them
// in FelixConfiguration (failsafe ports) and KubeControllersConfiguration
// (automatic host endpoints).
type ClusterConfiguration struct {
	TypeMeta `json:",inline"`
	Metadata ObjectMeta               `json:"metadata"`
	Spec     ClusterConfigurationSpec `json:"spec"`
}

// ClusterConfigurationSpec holds the settings.
type ClusterConfigurationSpec struct {
	// AutoHostEndpoints Enabled gives every node a "*" host endpoint
	// carrying its labels (AutoHostEndpoint); "" is Disabled.
	AutoHostEndpoints string `json:"autoHostEndpoints,omitempty"`
	// FailsafeInboundHostPorts and FailsafeOutboundHostPorts are what
	// host endpoint policy can never block; nil means the defaults
	// (DefaultFailsafeInbound, DefaultFailsafeOutbound), an empty list none.
	FailsafeInboundHostPorts  *[]ProtoPort `json:"failsafeInboundHostPorts,omitempty"`
	FailsafeOutboundHostPorts *[]ProtoPort `json:"failsafeOutboundHostPorts,omitempty"`
}

// ProtoPort is a failsafe port: a protocol (TCP, UDP or SCTP), a port and,
// optionally, the remote network it is limited to.
type ProtoPort struct {
	Protocol string `json:"protocol"`
	Port     uint16 `json:"port"`
	Net      string `json:"net,omitempty"`
}

func (p ProtoPort) String() string {
	s := fmt.Sprintf("%s:%d", strings.ToLower(p.Protocol), p.Port)
	if p.Net != "" {
		s += " (" + p.Net + ")"
	}
	return s
}

// DefaultFailsafeInbound are the inbound failsafe ports without a
// configuration (Calico's, plus the kubelet): SSH, BGP, etcd client and
// peer, the API server, the kubelet, DNS, DHCP. The agent adds its own
// health port.
var DefaultFailsafeInbound = []ProtoPort{
	{Protocol: ProtocolTCP, Port: 22}, {Protocol: ProtocolUDP, Port: 68}, {Protocol: ProtocolTCP, Port: 179},
	{Protocol: ProtocolTCP, Port: 2379}, {Protocol: ProtocolTCP, Port: 2380}, {Protocol: ProtocolTCP, Port: 6443},
	{Protocol: ProtocolTCP, Port: 10250}, {Protocol: ProtocolUDP, Port: 53}, {Protocol: ProtocolUDP, Port: 67},
}

// DefaultFailsafeOutbound are the outbound failsafe ports without a
// configuration (Calico's): DNS, DHCP, BGP, etcd, the API server.
var DefaultFailsafeOutbound = []ProtoPort{
	{Protocol: ProtocolUDP, Port: 53}, {Protocol: ProtocolUDP, Port: 67}, {Protocol: ProtocolTCP, Port: 179},
	{Protocol: ProtocolTCP, Port: 2379}, {Protocol: ProtocolTCP, Port: 2380}, {Protocol: ProtocolTCP, Port: 6443},
	{Protocol: ProtocolTCP, Port: 53},
}

// AutoHostEndpointsEnabled reports whether nodes get automatic host
// endpoints; a nil configuration means no.
func (c *ClusterConfiguration) AutoHostEndpointsEnabled() bool {
	return c != nil && c.Spec.AutoHostEndpoints == Enabled
}

// FailsafeInbound returns the inbound failsafe ports in effect.
func (c *ClusterConfiguration) FailsafeInbound() []ProtoPort {
	if c == nil || c.Spec.FailsafeInboundHostPorts == nil {
		return append([]ProtoPort(nil), DefaultFailsafeInbound...)
	}
	return append([]ProtoPort(nil), *c.Spec.FailsafeInboundHostPorts...)
}

// FailsafeOutbound returns the outbound failsafe ports in effect.
func (c *ClusterConfiguration) FailsafeOutbound() []ProtoPort {
	if c == nil || c.Spec.FailsafeOutboundHostPorts == nil {
		return append([]ProtoPort(nil), DefaultFailsafeOutbound...)
	}
	return append([]ProtoPort(nil), *c.Spec.FailsafeOutboundHostPorts...)
}

// GetTypeMeta implements Object.
func (c *ClusterConfiguration) GetTypeMeta() *TypeMeta { return &c.TypeMeta }

// GetMeta implements Object.
func (c *ClusterConfiguration) GetMeta() *ObjectMeta { return &c.Metadata }

// SetDefaults implements Object.
func (c *ClusterConfiguration) SetDefaults() { setTypeMeta(&c.TypeMeta, KindClusterConfiguration) }

// Validate implements Object.
func (c *ClusterConfiguration) Validate() error {
	var v validator
	v.typeMeta(&c.TypeMeta, KindClusterConfiguration)
	v.meta(&c.Metadata, kindInfoOf(c))
	switch c.Spec.AutoHostEndpoints {
	case "", Enabled, Disabled:
	default:
		v.add("spec.autoHostEndpoints", "%q is not one of Enabled, Disabled", c.Spec.AutoHostEndpoints)
	}
	check := func(path string, ports *[]ProtoPort) {
		if ports == nil {
			return
		}
		for i, p := range *ports {
			pp := idx(path, i)
			if !validProtocol(p.Protocol, ProtocolTCP, ProtocolUDP, ProtocolSCTP) {
				v.add(pp+".protocol", "%q is not one of TCP, UDP, SCTP", p.Protocol)
			}
			if p.Port == 0 {
				v.add(pp+".port", "must be between 1 and 65535")
			}
			if p.Net != "" {
				v.cidr(pp+".net", p.Net)
			}
		}
	}
	check("spec.failsafeInboundHostPorts", c.Spec.FailsafeInboundHostPorts)
	check("spec.failsafeOutboundHostPorts", c.Spec.FailsafeOutboundHostPorts)
	return v.err()
}

// hostPolicyFlags checks a GlobalNetworkPolicy's host endpoint flags as
// Calico does: preDNAT needs applyOnForward and has no egress; doNotTrack
// is not supported (yet).
func (v *validator) hostPolicyFlags(p *GlobalNetworkPolicy) {
	s := &p.Spec
	if s.PreDNAT {
		if !s.ApplyOnForward {
			v.add("spec.preDNAT", "requires spec.applyOnForward: true")
		}
		_, eg := p.AppliesTo()
		if eg || len(s.Egress) > 0 {
			v.add("spec.preDNAT", "policies are ingress only (no Egress type, no egress rules)")
		}
	}
	if s.DoNotTrack {
		v.add("spec.doNotTrack", "is not supported by Tabby (untracked policy)")
	}
}
