package api

import "net/netip"

// LabelSelector is the Kubernetes label selector form. A nil *LabelSelector
// means "not specified"; an empty one selects everything.
type LabelSelector struct {
	MatchLabels      map[string]string          `json:"matchLabels,omitempty"`
	MatchExpressions []LabelSelectorRequirement `json:"matchExpressions,omitempty"`
}

// Label selector operators.
const (
	OpIn           = "In"
	OpNotIn        = "NotIn"
	OpExists       = "Exists"
	OpDoesNotExist = "DoesNotExist"
)

// LabelSelectorRequirement is one matchExpressions entry.
type LabelSelectorRequirement struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values,omitempty"`
}

// ---------------------------------------------------------------- Node

// Node is a host running tabby-agent. Its labels are metadata.labels.
type Node struct {
	TypeMeta `json:",inline"`
	Metadata ObjectMeta `json:"metadata"`
	Spec     NodeSpec   `json:"spec"`
}

// NodeSpec describes a node's addresses and BGP identity.
type NodeSpec struct {
	// Addresses lists the node's addresses (informational, for example
	// InternalIP); routing uses BGP.IPv4Address.
	Addresses []NodeAddress `json:"addresses,omitempty"`
	BGP       *NodeBGPSpec  `json:"bgp,omitempty"`

	// The node's VXLAN tunnel (docs/vxlan.md), written by its agent:
	// the address of its vxlan.tabby device (from a VXLAN pool, through
	// IPAM) and that device's MAC; the same for IPv6 and vxlan-v6.tabby.
	// Calico's names. Empty while the node has no tunnel in that family.
	IPv4VXLANTunnelAddr  string `json:"ipv4VXLANTunnelAddr,omitempty"`
	VXLANTunnelMACAddr   string `json:"vxlanTunnelMACAddr,omitempty"`
	IPv6VXLANTunnelAddr  string `json:"ipv6VXLANTunnelAddr,omitempty"`
	VXLANTunnelMACAddrV6 string `json:"vxlanTunnelMACAddrV6,omitempty"`
}

// NodeAddress is one address of a node.
type NodeAddress struct {
	Address string `json:"address"`
	Type    string `json:"type,omitempty"`
}

// NodeBGPSpec is the node's BGP identity.
type NodeBGPSpec struct {
	// IPv4Address is the node's underlay address with its prefix length
	// ("198.18.0.2/24"); it is the BGP router ID, session address and next hop.
	IPv4Address string `json:"ipv4Address,omitempty"`
	// IPv6Address is the node's IPv6 underlay address with its prefix
	// length ("2001:db8::11/64"), as Calico's field: the next hop of the
	// node's IPv6 routes, which BGP carries on the IPv4 sessions.
	IPv6Address string `json:"ipv6Address,omitempty"`
	// ASNumber overrides BGPConfiguration's asNumber for this node.
	ASNumber *uint32 `json:"asNumber,omitempty"`
	// RouteReflectorClusterID makes the node a route reflector with that
	// cluster ID (an IPv4 address in dotted form).
	RouteReflectorClusterID string `json:"routeReflectorClusterID,omitempty"`
	// RouterID is the node's 32-bit BGP router ID (dotted IPv4). Needed
	// by nobody with an IPv4 address (it is the router ID); a node with
	// IPv6 only gets one derived from its name unless this sets it
	// (docs/ipv6.md, "IPv6-only nodes").
	RouterID string `json:"routerID,omitempty"`
}

// ---------------------------------------------------------------- IPPool

// IPPool is a range of pod addresses, carved into blocks.
type IPPool struct {
	TypeMeta `json:",inline"`
	Metadata ObjectMeta `json:"metadata"`
	Spec     IPPoolSpec `json:"spec"`
}

// Default and limits of IPPoolSpec.BlockSize. Calico accepts 20–32 for
// IPv4 and 116–128 for IPv6; Tabby refuses blocks of one address (/32,
// /128): such a block has its blackhole route on the pod's own host route,
// and every pod would claim a block. A block holds at most 4,096 addresses
// in either family.
const (
	DefaultBlockSize = 26
	MinBlockSize     = 20
	MaxBlockSize     = 31

	DefaultBlockSizeV6 = 122
	MinBlockSizeV6     = 116
	MaxBlockSizeV6     = 127
)

// BlockSizes returns the default and the limits of a pool's blockSize for
// the address family of cidr (IPv6 when is6).
func BlockSizes(is6 bool) (def, lo, hi int) {
	if is6 {
		return DefaultBlockSizeV6, MinBlockSizeV6, MaxBlockSizeV6
	}
	return DefaultBlockSize, MinBlockSize, MaxBlockSize
}

// IPPoolSpec describes a pool.
type IPPoolSpec struct {
	CIDR             string         `json:"cidr"`
	BlockSize        int            `json:"blockSize,omitempty"`
	NATOutgoing      bool           `json:"natOutgoing,omitempty"`
	Disabled         bool           `json:"disabled,omitempty"`
	NodeSelector     *LabelSelector `json:"nodeSelector,omitempty"`
	DisableBGPExport bool           `json:"disableBGPExport,omitempty"`
	// BGPCommunities are standard communities ("65001:100") added to the
	// pool's prefixes (blocks, borrowed addresses) when they are
	// advertised, so that routers can tell pod routes apart (Calico's
	// prefixAdvertisements).
	BGPCommunities []string `json:"bgpCommunities,omitempty"`
	// BGPLargeCommunities are large communities (RFC 8092, "65001:1:100",
	// three numbers of 32 bits) added to the same prefixes as
	// BGPCommunities, for 4-byte AS numbers.
	BGPLargeCommunities []string `json:"bgpLargeCommunities,omitempty"`
	// BGPAggregate makes nodes advertise the pool's CIDR itself to
	// external peers (routers outside the cluster): Only instead of the
	// pool's blocks and borrowed addresses, WithBlocks in addition to
	// them. Cluster peers always get the blocks and never the aggregate.
	// Empty: blocks only (Calico's behaviour). See docs/bgp.md.
	BGPAggregate AggregateMode `json:"bgpAggregate,omitempty"`
	// AllowedUses says what the pool's addresses are for (Calico 3.30's
	// field): Workload (pod addresses) and Tunnel (tunnel device
	// addresses), the default when empty; or LoadBalancer alone, for the
	// addresses tabby-kube-controllers gives type LoadBalancer Services.
	// Pod IPAM never allocates from a LoadBalancer pool, it has no blocks,
	// and natOutgoing, nodeSelector and bgpAggregate do not apply to it.
	// See docs/ipam.md.
	AllowedUses []IPPoolUse `json:"allowedUses,omitempty"`
	// VXLANMode encapsulates traffic to the pool's addresses on other
	// nodes in VXLAN: Always, or CrossSubnet (only to nodes outside this
	// node's underlay subnet; the rest is routed natively over BGP).
	// Empty means Never. See docs/vxlan.md.
	VXLANMode VXLANMode `json:"vxlanMode,omitempty"`
}

// IPPoolUse is one value of IPPoolSpec.AllowedUses.
type IPPoolUse string

// Uses of an IPPool.
const (
	UseWorkload     IPPoolUse = "Workload"
	UseTunnel       IPPoolUse = "Tunnel"
	UseLoadBalancer IPPoolUse = "LoadBalancer"
)

// DefaultPoolUses are the uses of a pool whose allowedUses is empty.
var DefaultPoolUses = []IPPoolUse{UseWorkload, UseTunnel}

// AggregateMode is IPPoolSpec.BGPAggregate.
type AggregateMode string

// Aggregate modes of an IPPool.
const (
	AggregateNone       AggregateMode = ""
	AggregateOnly       AggregateMode = "Only"
	AggregateWithBlocks AggregateMode = "WithBlocks"
)

// ---------------------------------------------------------------- IPAMConfig

// IPAMConfig is the singleton (name "default") that tunes IPAM.
type IPAMConfig struct {
	TypeMeta `json:",inline"`
	Metadata ObjectMeta     `json:"metadata"`
	Spec     IPAMConfigSpec `json:"spec"`
}

// IPAMConfigSpec tunes IPAM.
type IPAMConfigSpec struct {
	// StrictAffinity forbids borrowing addresses from other nodes' blocks.
	StrictAffinity bool `json:"strictAffinity,omitempty"`
	// AutoAllocateBlocks lets a node claim new blocks (default true).
	AutoAllocateBlocks *bool `json:"autoAllocateBlocks,omitempty"`
	// MaxBlocksPerHost limits the blocks affine to one node (0: no limit).
	MaxBlocksPerHost int `json:"maxBlocksPerHost,omitempty"`
}

// ---------------------------------------------------------------- BGP

// Defaults of BGPConfigurationSpec.
const (
	DefaultASNumber   uint32 = 64512
	DefaultListenPort uint16 = 179
)

// BGPConfiguration is the singleton (name "default") for cluster-wide BGP.
type BGPConfiguration struct {
	TypeMeta `json:",inline"`
	Metadata ObjectMeta           `json:"metadata"`
	Spec     BGPConfigurationSpec `json:"spec"`
}

// BGPConfigurationSpec holds cluster-wide BGP settings.
type BGPConfigurationSpec struct {
	ASNumber               *uint32     `json:"asNumber,omitempty"`
	NodeToNodeMeshEnabled  *bool       `json:"nodeToNodeMeshEnabled,omitempty"`
	ListenPort             *uint16     `json:"listenPort,omitempty"`
	NodeMeshPassword       BGPPassword `json:"nodeMeshPassword,omitzero"`
	NodeMeshMaxRestartTime *Duration   `json:"nodeMeshMaxRestartTime,omitempty"`
	KeepaliveTime          *Duration   `json:"keepaliveTime,omitempty"`
	HoldTime               *Duration   `json:"holdTime,omitempty"`

	// ServiceClusterIPs are the ClusterIP ranges every node advertises
	// as they are (Calico's field); see docs/bgp.md, "Services".
	ServiceClusterIPs []ServiceCIDR `json:"serviceClusterIPs,omitempty"`
	// ServiceExternalIPs are the ranges a Service's spec.externalIPs
	// must lie in to be advertised (as /32, /128).
	ServiceExternalIPs []ServiceCIDR `json:"serviceExternalIPs,omitempty"`
	// ServiceLoadBalancerIPs are the ranges a Service's LoadBalancer
	// ingress IPs must lie in to be advertised (as /32, /128).
	ServiceLoadBalancerIPs []ServiceCIDR `json:"serviceLoadBalancerIPs,omitempty"`
	// PrefixAdvertisements add communities to the Service prefixes
	// inside each CIDR (Calico's field, literal values only).
	PrefixAdvertisements []PrefixAdvertisement `json:"prefixAdvertisements,omitempty"`
	// VXLANVNI and VXLANPort are the cluster's VXLAN network identifier
	// and UDP port (Calico's FelixConfiguration names; defaults 4096 and
	// 4789). They live here because this is the cluster-wide singleton
	// every agent watches; VXLAN needs no BGP session. See docs/vxlan.md.
	VXLANVNI  *uint32 `json:"vxlanVNI,omitempty"`
	VXLANPort *uint16 `json:"vxlanPort,omitempty"`

	// Automatic route reflectors (docs/bgp.md, "Reflectors that place
	// themselves"); see api/reflectors.go.
	AutoReflectorSpec `json:",inline"`
}

// BGPPeer is an explicit BGP session: global (no node, no nodeSelector), for
// one node, or for the nodes a selector picks. PeerIP names a router outside
// the cluster; PeerSelector instead names the cluster nodes to peer with.
type BGPPeer struct {
	TypeMeta `json:",inline"`
	Metadata ObjectMeta  `json:"metadata"`
	Spec     BGPPeerSpec `json:"spec"`
}

// Values of BGPPeerSpec.SourceAddress.
const (
	SourceAddressUseNodeIP = "UseNodeIP"
	SourceAddressNone      = "None"
)

// BGPPeerSpec describes an explicit peering.
type BGPPeerSpec struct {
	PeerIP         string         `json:"peerIP,omitempty"`
	ASNumber       uint32         `json:"asNumber,omitempty"`
	Node           string         `json:"node,omitempty"`
	NodeSelector   *LabelSelector `json:"nodeSelector,omitempty"`
	PeerSelector   *LabelSelector `json:"peerSelector,omitempty"`
	Password       BGPPassword    `json:"password,omitzero"`
	KeepaliveTime  *Duration      `json:"keepaliveTime,omitempty"`
	HoldTime       *Duration      `json:"holdTime,omitempty"`
	MaxRestartTime *Duration      `json:"maxRestartTime,omitempty"`
	SourceAddress  string         `json:"sourceAddress,omitempty"`

	// AcceptDefault lets a peer outside the cluster send a default route
	// (0.0.0.0/0); without it, or a filter accepting it, it is rejected.
	AcceptDefault bool `json:"acceptDefault,omitempty"`
	// MaxPrefixes is the most prefixes the peer may send; over it the
	// session is shut down until the configuration changes. 0 means the
	// default: 10000 for peers outside the cluster, no limit for nodes.
	MaxPrefixes uint32 `json:"maxPrefixes,omitempty"`
	// Filters names the BGPFilters applied to the peering, in order: their
	// rules are concatenated and the first that matches a prefix decides.
	Filters []string `json:"filters,omitempty"`
	// BFD enables fast failure detection on the peering.
	BFD *BGPPeerBFD `json:"bfd,omitempty"`

	// LocalASNumber is the AS number this node speaks as on the sessions
	// the BGPPeer makes, instead of its own (Calico 3.31's field). Only
	// with peerIP towards a router outside the cluster.
	LocalASNumber uint32 `json:"localASNumber,omitempty"`
	// KeepOriginalNextHop sends routes to the peer with their original
	// next hop (Calico's field; the same as nextHopMode Keep).
	KeepOriginalNextHop bool `json:"keepOriginalNextHop,omitempty"`
	// NextHopMode says which next hop routes sent to the peer carry:
	// Auto (the default: this node for its own routes and towards eBGP
	// peers, except a third-party next hop on the shared subnet), Self
	// (always this node) or Keep (the route's original next hop).
	NextHopMode string `json:"nextHopMode,omitempty"`
}

// Values of BGPPeerSpec.NextHopMode (Calico's).
const (
	NextHopModeAuto = "Auto"
	NextHopModeSelf = "Self"
	NextHopModeKeep = "Keep"
)

// ---------------------------------------------------------------- WorkloadEndpoint

// WorkloadEndpoint is one pod interface. It is namespaced by the pod's
// namespace; metadata.labels are the pod's labels.
type WorkloadEndpoint struct {
	TypeMeta `json:",inline"`
	Metadata ObjectMeta           `json:"metadata"`
	Spec     WorkloadEndpointSpec `json:"spec"`
}

// WorkloadEndpointSpec describes a pod interface.
type WorkloadEndpointSpec struct {
	Node          string `json:"node"`
	Orchestrator  string `json:"orchestrator,omitempty"`
	Pod           string `json:"pod,omitempty"`
	ContainerID   string `json:"containerID"`
	Endpoint      string `json:"endpoint,omitempty"`
	InterfaceName string `json:"interfaceName"`
	MAC           string `json:"mac,omitempty"`
	// IPNetworks are the pod's addresses as /32 CIDRs.
	IPNetworks []string `json:"ipNetworks"`
	// IPAMHandle is the IPAM handle the addresses are held under.
	IPAMHandle string `json:"ipamHandle,omitempty"`
	// NamespaceLabels are the labels of the pod's namespace, for policy
	// namespaceSelectors.
	NamespaceLabels map[string]string `json:"namespaceLabels,omitempty"`
	Profiles        []string          `json:"profiles,omitempty"`
	// Ports are the pod's named ports, for named ports in policy.
	Ports []EndpointPort `json:"ports,omitempty"`
}

// EndpointPort is a named container port.
type EndpointPort struct {
	Name     string `json:"name"`
	Protocol string `json:"protocol,omitempty"`
	Port     uint16 `json:"port"`
}

// ---------------------------------------------------------------- NetworkPolicy

// Policy types.
type PolicyType string

// The policy types.
const (
	PolicyTypeIngress PolicyType = "Ingress"
	PolicyTypeEgress  PolicyType = "Egress"
)

// NetworkPolicy is a namespaced policy whose spec is exactly Kubernetes'
// networking.k8s.io/v1 NetworkPolicySpec.
type NetworkPolicy struct {
	TypeMeta `json:",inline"`
	Metadata ObjectMeta        `json:"metadata"`
	Spec     NetworkPolicySpec `json:"spec"`
}

// NetworkPolicySpec mirrors networking.k8s.io/v1.
type NetworkPolicySpec struct {
	PodSelector LabelSelector              `json:"podSelector"`
	Ingress     []NetworkPolicyIngressRule `json:"ingress,omitempty"`
	Egress      []NetworkPolicyEgressRule  `json:"egress,omitempty"`
	PolicyTypes []PolicyType               `json:"policyTypes,omitempty"`
}

// NetworkPolicyIngressRule mirrors networking.k8s.io/v1.
type NetworkPolicyIngressRule struct {
	Ports []NetworkPolicyPort `json:"ports,omitempty"`
	From  []NetworkPolicyPeer `json:"from,omitempty"`
}

// NetworkPolicyEgressRule mirrors networking.k8s.io/v1.
type NetworkPolicyEgressRule struct {
	Ports []NetworkPolicyPort `json:"ports,omitempty"`
	To    []NetworkPolicyPeer `json:"to,omitempty"`
}

// NetworkPolicyPeer mirrors networking.k8s.io/v1.
type NetworkPolicyPeer struct {
	PodSelector       *LabelSelector `json:"podSelector,omitempty"`
	NamespaceSelector *LabelSelector `json:"namespaceSelector,omitempty"`
	IPBlock           *IPBlock       `json:"ipBlock,omitempty"`
}

// IPBlock mirrors networking.k8s.io/v1.
type IPBlock struct {
	CIDR   string   `json:"cidr"`
	Except []string `json:"except,omitempty"`
}

// NetworkPolicyPort mirrors networking.k8s.io/v1. Protocol defaults to TCP.
type NetworkPolicyPort struct {
	Protocol *string      `json:"protocol,omitempty"`
	Port     *IntOrString `json:"port,omitempty"`
	EndPort  *int32       `json:"endPort,omitempty"`
}

// ---------------------------------------------------------------- GlobalNetworkPolicy

// Rule actions.
const (
	ActionAllow = "Allow"
	ActionDeny  = "Deny"
)

// GlobalNetworkPolicy is a cluster-wide ordered policy with Allow, Deny and
// Pass rules, in a Tier (spec.tier, default "default"). In tier default it
// is evaluated before namespaced NetworkPolicy.
type GlobalNetworkPolicy struct {
	TypeMeta `json:",inline"`
	Metadata ObjectMeta              `json:"metadata"`
	Spec     GlobalNetworkPolicySpec `json:"spec"`
}

// GlobalNetworkPolicySpec selects endpoints and lists rules. Lower order
// comes first; a nil order comes last.
type GlobalNetworkPolicySpec struct {
	// Tier names the policy's Tier (api/tier.go); empty means TierDefault.
	Tier              string         `json:"tier,omitempty"`
	Order             *float64       `json:"order,omitempty"`
	Selector          *LabelSelector `json:"selector,omitempty"`
	NamespaceSelector *LabelSelector `json:"namespaceSelector,omitempty"`
	Types             []PolicyType   `json:"types,omitempty"`
	Ingress           []Rule         `json:"ingress,omitempty"`
	Egress            []Rule         `json:"egress,omitempty"`
	// ApplyOnForward, PreDNAT and DoNotTrack are about host endpoints
	// (api/hostendpoint.go, docs/policy.md).
	ApplyOnForward bool `json:"applyOnForward,omitempty"`
	PreDNAT        bool `json:"preDNAT,omitempty"`
	DoNotTrack     bool `json:"doNotTrack,omitempty"`
}

// Rule is one GlobalNetworkPolicy rule. Action is Allow, Deny or Pass
// (ActionPass: on to the next tier).
type Rule struct {
	Action      string     `json:"action"`
	Protocol    *string    `json:"protocol,omitempty"`
	Source      EntityRule `json:"source,omitempty"`
	Destination EntityRule `json:"destination,omitempty"`
}

// EntityRule matches a packet's source or destination. Ports are numbers,
// "lo:hi" ranges or named ports.
type EntityRule struct {
	Selector          *LabelSelector `json:"selector,omitempty"`
	NamespaceSelector *LabelSelector `json:"namespaceSelector,omitempty"`
	Nets              []string       `json:"nets,omitempty"`
	NotNets           []string       `json:"notNets,omitempty"`
	Ports             []IntOrString  `json:"ports,omitempty"`
}

// ---------------------------------------------------------------- accessors

// IPv4 returns the node's BGP address and prefix, if it has a valid one.
func (n *Node) IPv4() (netip.Prefix, bool) {
	if n.Spec.BGP == nil || n.Spec.BGP.IPv4Address == "" {
		return netip.Prefix{}, false
	}
	p, err := netip.ParsePrefix(n.Spec.BGP.IPv4Address)
	if err != nil {
		a, err2 := netip.ParseAddr(n.Spec.BGP.IPv4Address)
		if err2 != nil || !a.Is4() {
			return netip.Prefix{}, false
		}
		return netip.PrefixFrom(a, 32), true
	}
	if !p.Addr().Is4() {
		return netip.Prefix{}, false
	}
	return p, true
}

// IPv6 returns the node's IPv6 underlay address and prefix, if it has a
// valid one.
func (n *Node) IPv6() (netip.Prefix, bool) {
	if n.Spec.BGP == nil || n.Spec.BGP.IPv6Address == "" {
		return netip.Prefix{}, false
	}
	p, err := netip.ParsePrefix(n.Spec.BGP.IPv6Address)
	if err != nil || !p.Addr().Is6() || p.Addr().Is4In6() || p.Addr().Zone() != "" {
		return netip.Prefix{}, false
	}
	return p, true
}

// Addrs returns the endpoint's addresses: each spec.ipNetworks entry is a
// CIDR or, from a lenient writer, a bare address. Entries that parse as
// neither are left out and reported, joined, in the error.
func (w *WorkloadEndpoint) Addrs() ([]netip.Addr, error) { return parseIPNetworks(w.Spec.IPNetworks) }

// Prefix returns the pool's CIDR, masked.
func (p *IPPool) Prefix() (netip.Prefix, error) {
	pr, err := netip.ParsePrefix(p.Spec.CIDR)
	if err != nil {
		return netip.Prefix{}, err
	}
	return pr.Masked(), nil
}

// Uses returns the pool's allowed uses: spec.allowedUses, or
// DefaultPoolUses when it is empty.
func (p *IPPool) Uses() []IPPoolUse {
	if len(p.Spec.AllowedUses) == 0 {
		return DefaultPoolUses
	}
	return p.Spec.AllowedUses
}

// Allows reports whether the pool's addresses may be used for u.
func (p *IPPool) Allows(u IPPoolUse) bool {
	for _, x := range p.Uses() {
		if x == u {
			return true
		}
	}
	return false
}

// IsLoadBalancer reports whether the pool is for LoadBalancer Service
// addresses (and so not for pods or tunnels).
func (p *IPPool) IsLoadBalancer() bool { return p.Allows(UseLoadBalancer) }
