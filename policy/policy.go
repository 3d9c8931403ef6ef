// Package policy compiles network policy into packet-filter state, as data.
//
// Compile is a pure function: from the cluster's WorkloadEndpoints,
// NetworkPolicies (Kubernetes networking.k8s.io/v1 semantics),
// GlobalNetworkPolicies (ordered, Allow/Deny, evaluated first) and IPPools it
// computes the chains, the hooks into the kernel's packet path and the
// named sets one node needs, in a backend-neutral model (model.go) that
// package dataplane renders for nftables or iptables. Nothing here touches the kernel: the agent
// hands the result to package dataplane, which diffs it against the kernel
// and applies the difference atomically.
//
// Layout (see docs/policy.md):
//
//	filter FORWARD -> tabby-FORWARD
//	  -i cali+ -> tabby-from-wl (dispatch by -i) -> tabby-fw-<if>  egress of the workload
//	  -o cali+ -> tabby-to-wl   (dispatch by -o) -> tabby-tw-<if>  ingress of the workload
//	  -i cali+ / -o cali+ -> ACCEPT (both directions passed)
//	tabby-fw-<if>: anti-spoofing, conntrack, then the egress policies
//	tabby-tw-<if>: conntrack, then the ingress policies
//	tabby-pi-<hash> / tabby-po-<hash>: one chain per policy and direction
//	nat POSTROUTING -> tabby-POSTROUTING: natOutgoing masquerade
//
// A policy chain signals "allowed" with MarkAccept and returns; a
// GlobalNetworkPolicy Deny rule drops at once. The endpoint chain returns
// as soon as the mark is set, and drops at its end when any policy of that
// direction selected the endpoint (isolation); with no such policy the
// endpoint chain just returns (default allow).
//
// Every name Compile emits starts with Prefix, and only those are ever
// changed or removed by the dataplane.
package policy

import (
	"strings"

	"github.com/tabbynet/tabby/api"
)

// Names and marks of the compiled layout.
const (
	// Prefix starts every chain and ipset name Tabby owns.
	Prefix = "tabby-"
	// WorkloadIfacePrefix starts every host-side workload interface name.
	WorkloadIfacePrefix = api.WorkloadIfacePrefix

	ChainForward     = "tabby-FORWARD"
	ChainInput       = "tabby-INPUT"
	ChainFromWL      = "tabby-from-wl"
	ChainToWL        = "tabby-to-wl"
	ChainPostrouting = "tabby-POSTROUTING"

	// SetAllPools holds the CIDR of every IPv4 IPPool; SetMasqPools those
	// of the IPv4 pools with natOutgoing. SetAllPools6 and SetMasqPools6
	// are the same for IPv6 pools.
	SetAllPools   = "tabby-all-pools"
	SetMasqPools  = "tabby-masq-pools"
	SetAllPools6  = "tabby-all-pools6"
	SetMasqPools6 = "tabby-masq-pools6"

	// MarkAccept is the packet-mark bit a policy chain sets when one of its
	// rules allows the packet. It stays clear of kube-proxy's 0x4000 and
	// 0x8000.
	MarkAccept = 0x10000
	// MarkPass is the bit a policy chain sets for a Pass rule: the rest
	// of the tier is skipped (tiers.go).
	MarkPass = 0x20000

	// MaxChainName is the longest iptables chain name (the kernel's limit
	// is 29 bytes with the terminating NUL).
	MaxChainName = 28
	// MaxSetName is the longest ipset name (31 bytes plus NUL).
	MaxSetName = 31
)

// NeighbourDiscoveryTypes are the ICMPv6 types a workload may always send
// to its node, before anti-spoofing and whatever the endpoint-to-host
// action (Calico's list): multicast listener query, report and done
// (130–132), router solicitation (133), neighbour solicitation and
// advertisement (135, 136). They come from the pod's link-local address,
// which is not among its endpoint's addresses, and IPv6 does not work
// without them (the pod resolves its gateway, and answers the node's
// solicitations for its own address). Router advertisements (134) and
// redirects (137) are not on the list: the node is the pod's router, never
// the other way round.
var NeighbourDiscoveryTypes = []uint8{130, 131, 132, 133, 135, 136}

// Tables Compile emits chains into.
const (
	TableFilter = "filter"
	TableNAT    = "nat"
)

// Input is the cluster state Compile works from.
type Input struct {
	// Node is the node being compiled for: endpoints with spec.node equal
	// to it get chains; every endpoint feeds the selector sets.
	Node string
	// Endpoints are every WorkloadEndpoint of the cluster, but those in
	// Remote.
	Endpoints []*api.WorkloadEndpoint
	// Remote are endpoints of other nodes in compact form (an agent's
	// cluster view: syncer.CompactRemote); they select and are selected
	// as they would whole in Endpoints.
	Remote []*api.RemoteEndpoint
	// NetworkPolicies are every namespaced NetworkPolicy.
	NetworkPolicies []*api.NetworkPolicy
	// GlobalPolicies are every GlobalNetworkPolicy.
	GlobalPolicies []*api.GlobalNetworkPolicy
	// Pools are every IPPool.
	Pools []*api.IPPool
	// Tiers are the tiers in evaluation order (api.EffectiveTiers); nil
	// means the built-in ones. A change of tiers recompiles everything.
	Tiers []*api.Tier
	// StagedPolicies are every StagedGlobalNetworkPolicy: they only count.
	StagedPolicies []*api.StagedGlobalNetworkPolicy
	// EndpointToHostAction is what a packet from a local workload to this
	// node meets once it passed the workload's anti-spoofing check and
	// egress policy (Calico's DefaultEndpointToHostAction):
	// EndpointToHostDrop ("" too), EndpointToHostAccept, or
	// EndpointToHostReturn (on to the node's other INPUT rules).
	EndpointToHostAction string
	// HostProtectedPorts are the node's ports no workload may reach,
	// whatever the action: the etcd client port, the GoBGP API.
	HostProtectedPorts []HostPort
	// HostEndpoints are every HostEndpoint of the cluster, the automatic
	// ones included (host.go); those of Node get chains.
	HostEndpoints []*api.HostEndpoint
	// FailsafeInbound and FailsafeOutbound are the ports host endpoint
	// policy never blocks.
	FailsafeInbound  []Failsafe
	FailsafeOutbound []Failsafe
	// Guard is what the node guard protects (nodeguard.go).
	Guard NodeGuard
	// TunnelGuard, when set, drops VXLAN packets from anything but a
	// cluster node (ChainTunnel).
	TunnelGuard *TunnelGuard
}

// HostPort is a protocol ("tcp", "udp", "sctp") and port of the node.
type HostPort struct {
	Proto string
	Port  uint16
}

// Endpoint-to-host actions.
const (
	EndpointToHostDrop   = "Drop"
	EndpointToHostAccept = "Accept"
	EndpointToHostReturn = "Return"
)

// Ruleset is the complete packet-filter state of one node.
type Ruleset struct {
	// Chains sorted by table and name.
	Chains []Chain
	// Jumps in a fixed order.
	Jumps []Jump
	// Sets sorted by name.
	Sets []Set
	// Warnings name inputs that were skipped (an unparsable address, an
	// interface without the workload prefix); they never stop compilation.
	Warnings []string
}

// RulesPerEndpoint counts the rules a packet of a local endpoint may meet
// because of the endpoint (its dispatch entries, anti-spoofing and
// endpoint chains), divided by the number of local endpoints; 0 without
// any.
func (r *Ruleset) RulesPerEndpoint() float64 {
	n, rules := 0, 0
	for _, c := range r.Chains {
		switch {
		case strings.HasPrefix(c.Name, "tabby-tw-"):
			n++
			rules += len(c.Rules)
		case strings.HasPrefix(c.Name, "tabby-fw-"), strings.HasPrefix(c.Name, "tabby-sp-"):
			rules += len(c.Rules)
		case c.Dispatch != nil:
			rules += len(c.Dispatch.Targets)
		}
	}
	if n == 0 {
		return 0
	}
	return float64(rules) / float64(n)
}
