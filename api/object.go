package api

// Object methods and defaults of every kind. SetDefaults is idempotent and
// never overrides a value the user set.

import "net/netip"

func setTypeMeta(tm *TypeMeta, kind string) {
	tm.APIVersion = APIVersion
	tm.Kind = kind
}

func boolPtr(b bool) *bool { return &b }

// ---------------------------------------------------------------- Node

// GetTypeMeta implements Object.
func (n *Node) GetTypeMeta() *TypeMeta { return &n.TypeMeta }

// GetMeta implements Object.
func (n *Node) GetMeta() *ObjectMeta { return &n.Metadata }

// SetDefaults implements Object.
func (n *Node) SetDefaults() { setTypeMeta(&n.TypeMeta, KindNode) }

// EffectiveASN returns the node's AS number: its own override, else the
// cluster's (cfg may be nil).
func (n *Node) EffectiveASN(cfg *BGPConfiguration) uint32 {
	if n != nil && n.Spec.BGP != nil && n.Spec.BGP.ASNumber != nil {
		return *n.Spec.BGP.ASNumber
	}
	return cfg.EffectiveASN()
}

// RouteReflectorClusterID returns the node's route-reflector cluster ID, ""
// when the node is not a route reflector.
func (n *Node) RouteReflectorClusterID() string {
	if n == nil || n.Spec.BGP == nil {
		return ""
	}
	return n.Spec.BGP.RouteReflectorClusterID
}

// ---------------------------------------------------------------- IPPool

// GetTypeMeta implements Object.
func (p *IPPool) GetTypeMeta() *TypeMeta { return &p.TypeMeta }

// GetMeta implements Object.
func (p *IPPool) GetMeta() *ObjectMeta { return &p.Metadata }

// SetDefaults implements Object: blockSize 26 for an IPv4 pool, 122 for
// an IPv6 one.
func (p *IPPool) SetDefaults() {
	setTypeMeta(&p.TypeMeta, KindIPPool)
	if p.Spec.BlockSize == 0 {
		p.Spec.BlockSize = p.DefaultBlockSize()
	}
}

// DefaultBlockSize is the blockSize of the pool when none is set: that of
// its CIDR's family (IPv4 when the CIDR does not parse).
func (p *IPPool) DefaultBlockSize() int {
	pr, err := netip.ParsePrefix(p.Spec.CIDR)
	def, _, _ := BlockSizes(err == nil && pr.Addr().Is6())
	return def
}

// SelectsNode reports whether the pool may be used for a node with the
// given labels: a pool without a nodeSelector serves every node.
func (p *IPPool) SelectsNode(nodeLabels map[string]string) bool {
	if p.Spec.NodeSelector == nil {
		return true
	}
	return p.Spec.NodeSelector.Matches(nodeLabels)
}

// ---------------------------------------------------------------- IPAMConfig

// GetTypeMeta implements Object.
func (c *IPAMConfig) GetTypeMeta() *TypeMeta { return &c.TypeMeta }

// GetMeta implements Object.
func (c *IPAMConfig) GetMeta() *ObjectMeta { return &c.Metadata }

// SetDefaults implements Object: autoAllocateBlocks true.
func (c *IPAMConfig) SetDefaults() {
	setTypeMeta(&c.TypeMeta, KindIPAMConfig)
	if c.Spec.AutoAllocateBlocks == nil {
		c.Spec.AutoAllocateBlocks = boolPtr(true)
	}
}

// AutoAllocate reports whether nodes may claim new blocks. A nil config
// means the defaults.
func (c *IPAMConfig) AutoAllocate() bool {
	if c == nil || c.Spec.AutoAllocateBlocks == nil {
		return true
	}
	return *c.Spec.AutoAllocateBlocks
}

// ---------------------------------------------------------------- BGPConfiguration

// GetTypeMeta implements Object.
func (c *BGPConfiguration) GetTypeMeta() *TypeMeta { return &c.TypeMeta }

// GetMeta implements Object.
func (c *BGPConfiguration) GetMeta() *ObjectMeta { return &c.Metadata }

// SetDefaults implements Object: asNumber 64512, nodeToNodeMeshEnabled true,
// listenPort 179; nothing for a node's configuration (NodeConfigName).
func (c *BGPConfiguration) SetDefaults() {
	setTypeMeta(&c.TypeMeta, KindBGPConfiguration)
	if isNodeConfigName(c.Metadata.Name) {
		return // a node's configuration holds overrides only
	}
	if c.Spec.ASNumber == nil {
		asn := DefaultASNumber
		c.Spec.ASNumber = &asn
	}
	if c.Spec.NodeToNodeMeshEnabled == nil {
		c.Spec.NodeToNodeMeshEnabled = boolPtr(true)
	}
	if c.Spec.ListenPort == nil {
		port := DefaultListenPort
		c.Spec.ListenPort = &port
	}
}

// EffectiveASN returns the cluster AS number, DefaultASNumber when unset. A
// nil configuration means the defaults.
func (c *BGPConfiguration) EffectiveASN() uint32 {
	if c == nil || c.Spec.ASNumber == nil {
		return DefaultASNumber
	}
	return *c.Spec.ASNumber
}

// MeshEnabled reports whether the node-to-node full mesh is on (the default).
func (c *BGPConfiguration) MeshEnabled() bool {
	if c == nil || c.Spec.NodeToNodeMeshEnabled == nil {
		return true
	}
	return *c.Spec.NodeToNodeMeshEnabled
}

// Port returns the BGP listen port, DefaultListenPort when unset.
func (c *BGPConfiguration) Port() uint16 {
	if c == nil || c.Spec.ListenPort == nil {
		return DefaultListenPort
	}
	return *c.Spec.ListenPort
}

// ---------------------------------------------------------------- BGPPeer

// GetTypeMeta implements Object.
func (p *BGPPeer) GetTypeMeta() *TypeMeta { return &p.TypeMeta }

// GetMeta implements Object.
func (p *BGPPeer) GetMeta() *ObjectMeta { return &p.Metadata }

// SetDefaults implements Object: sourceAddress UseNodeIP; with bfd, its
// interval 300ms and multiplier 3.
func (p *BGPPeer) SetDefaults() {
	setTypeMeta(&p.TypeMeta, KindBGPPeer)
	if p.Spec.SourceAddress == "" {
		p.Spec.SourceAddress = SourceAddressUseNodeIP
	}
	if b := p.Spec.BFD; b != nil {
		if b.Interval == nil {
			b.Interval = &Duration{DefaultBFDInterval}
		}
		if b.Multiplier == nil {
			m := uint32(DefaultBFDMultiplier)
			b.Multiplier = &m
		}
	}
}

// IsGlobal reports whether the peering applies to every node (neither node
// nor nodeSelector is set).
func (p *BGPPeer) IsGlobal() bool {
	return p.Spec.Node == "" && p.Spec.NodeSelector == nil
}

// AppliesToNode reports whether the peering is made by the named node with
// the given labels.
func (p *BGPPeer) AppliesToNode(name string, labels map[string]string) bool {
	switch {
	case p.Spec.Node != "":
		return p.Spec.Node == name
	case p.Spec.NodeSelector != nil:
		return p.Spec.NodeSelector.Matches(labels)
	}
	return true
}

// ---------------------------------------------------------------- WorkloadEndpoint

// GetTypeMeta implements Object.
func (w *WorkloadEndpoint) GetTypeMeta() *TypeMeta { return &w.TypeMeta }

// GetMeta implements Object.
func (w *WorkloadEndpoint) GetMeta() *ObjectMeta { return &w.Metadata }

// SetDefaults implements Object: named ports default to protocol TCP.
func (w *WorkloadEndpoint) SetDefaults() {
	setTypeMeta(&w.TypeMeta, KindWorkloadEndpoint)
	for i := range w.Spec.Ports {
		if w.Spec.Ports[i].Protocol == "" {
			w.Spec.Ports[i].Protocol = ProtocolTCP
		}
	}
}

// ---------------------------------------------------------------- NetworkPolicy

// GetTypeMeta implements Object.
func (p *NetworkPolicy) GetTypeMeta() *TypeMeta { return &p.TypeMeta }

// GetMeta implements Object.
func (p *NetworkPolicy) GetMeta() *ObjectMeta { return &p.Metadata }

// SetDefaults implements Object, with Kubernetes' defaults: every port's
// protocol TCP; policyTypes Ingress, plus Egress when there are egress rules.
func (p *NetworkPolicy) SetDefaults() {
	setTypeMeta(&p.TypeMeta, KindNetworkPolicy)
	defaultPorts := func(ports []NetworkPolicyPort) {
		for i := range ports {
			if ports[i].Protocol == nil {
				proto := ProtocolTCP
				ports[i].Protocol = &proto
			}
		}
	}
	for i := range p.Spec.Ingress {
		defaultPorts(p.Spec.Ingress[i].Ports)
	}
	for i := range p.Spec.Egress {
		defaultPorts(p.Spec.Egress[i].Ports)
	}
	p.Spec.PolicyTypes = p.effectiveTypes()
}

// ---------------------------------------------------------------- GlobalNetworkPolicy

// GetTypeMeta implements Object.
func (p *GlobalNetworkPolicy) GetTypeMeta() *TypeMeta { return &p.TypeMeta }

// GetMeta implements Object.
func (p *GlobalNetworkPolicy) GetMeta() *ObjectMeta { return &p.Metadata }

// SetDefaults implements Object, with Calico's defaults for types: Ingress
// when there are no egress rules, Egress when there are only egress rules,
// both when there are both.
func (p *GlobalNetworkPolicy) SetDefaults() {
	setTypeMeta(&p.TypeMeta, KindGlobalNetworkPolicy)
	p.Spec.Types = p.effectiveTypes()
}

func (p *GlobalNetworkPolicy) effectiveTypes() []PolicyType {
	switch {
	case len(p.Spec.Types) > 0:
		return p.Spec.Types
	case len(p.Spec.Egress) == 0:
		return []PolicyType{PolicyTypeIngress}
	case len(p.Spec.Ingress) == 0:
		return []PolicyType{PolicyTypeEgress}
	}
	return []PolicyType{PolicyTypeIngress, PolicyTypeEgress}
}

// AppliesTo returns which directions the policy governs: its types, or
// the defaults SetDefaults would fill in.
func (p *GlobalNetworkPolicy) AppliesTo() (ingress, egress bool) {
	t := p.effectiveTypes()
	return hasType(t, PolicyTypeIngress), hasType(t, PolicyTypeEgress)
}

func (p *NetworkPolicy) effectiveTypes() []PolicyType {
	if len(p.Spec.PolicyTypes) > 0 {
		return p.Spec.PolicyTypes
	}
	if len(p.Spec.Egress) > 0 {
		return []PolicyType{PolicyTypeIngress, PolicyTypeEgress}
	}
	return []PolicyType{PolicyTypeIngress}
}

// AppliesTo returns which directions the policy governs: its policyTypes,
// or the defaults SetDefaults would fill in.
func (p *NetworkPolicy) AppliesTo() (ingress, egress bool) {
	t := p.effectiveTypes()
	return hasType(t, PolicyTypeIngress), hasType(t, PolicyTypeEgress)
}

func hasType(types []PolicyType, t PolicyType) bool {
	for _, x := range types {
		if x == t {
			return true
		}
	}
	return false
}

// Protocols.
const (
	ProtocolTCP  = "TCP"
	ProtocolUDP  = "UDP"
	ProtocolSCTP = "SCTP"
	ProtocolICMP = "ICMP"
	// ProtocolICMPv6 is ICMP for IPv6 (next header 58), as Calico spells it;
	// a rule with it matches IPv6 packets only, one with ICMP IPv4 ones.
	ProtocolICMPv6 = "ICMPv6"
)
