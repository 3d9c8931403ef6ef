package policy

import (
	"net/netip"
	"slices"

	"github.com/tabbynet/tabby/api"
)

// The node guard keeps pods from speaking for their node (docs/bgp.md,
// "No pod speaks for its node"): a workload never reaches the BGP port or the
// agent's own ports of any cluster node, nor the BGP port of a configured
// BGP peer, and its traffic to a cluster node is never masqueraded to its
// node's address. It does not depend on any policy and is always on: while
// a node's agent is down (a rolling update, a crash) the rules stay in the
// kernel, and a pod of that node cannot open a session that its peers
// would take for the node's own.

// Names of the node guard.
const (
	// ChainNodeGuard is jumped to first from ChainForward and ChainInput
	// for packets from workloads. It sits in the filter hooks: after
	// kube-proxy's DNAT (a Service address that leads to a node's BGP port
	// is caught too) and before natOutgoing's masquerade.
	ChainNodeGuard = "tabby-node-guard"
	// SetNodes holds every cluster node's IPv4 addresses; SetNodes6 the
	// IPv6 ones. natOutgoing never masquerades traffic to them.
	SetNodes  = "tabby-nodes"
	SetNodes6 = "tabby-nodes6"
	// SetBGPPeers holds the IPv4 addresses of the BGPPeers outside the
	// cluster; SetBGPPeers6 the IPv6 ones.
	SetBGPPeers  = "tabby-bgp-peers"
	SetBGPPeers6 = "tabby-bgp-peers6"
	// BGPPort is BGP's well-known TCP port.
	BGPPort = 179
)

// NodeGuard is what the node guard protects.
type NodeGuard struct {
	// NodeAddrs are the addresses of every cluster node, both families.
	NodeAddrs []netip.Addr
	// PeerAddrs are the addresses of the configured BGP peers.
	PeerAddrs []netip.Addr
	// NodePorts are the TCP ports no workload may open on a cluster node:
	// BGP (179 and the configured listen port) and the agent's own (the
	// health and status port, the GoBGP API).
	NodePorts []uint16
	// PeerPorts are the TCP ports no workload may open on a BGP peer:
	// 179 and every port a BGPPeer names.
	PeerPorts []uint16
}

// NewNodeGuard computes the guard from the cluster view: every node's
// BGP addresses (spec.bgp) and listed addresses (spec.addresses), every
// BGPPeer's peerIP, BGP's port and the configuration's listen port, and
// agentPorts (the agent's own TCP ports, which the agent knows from its
// flags). Addresses that do not parse are left out.
func NewNodeGuard(nodes []*api.Node, peers []*api.BGPPeer, cfg *api.BGPConfiguration, agentPorts []uint16) NodeGuard {
	var g NodeGuard
	for _, n := range nodes {
		if n == nil {
			continue
		}
		if p, ok := n.IPv4(); ok {
			g.NodeAddrs = append(g.NodeAddrs, p.Addr())
		}
		if p, ok := n.IPv6(); ok {
			g.NodeAddrs = append(g.NodeAddrs, p.Addr())
		}
		for _, a := range n.Spec.Addresses {
			if ip, ok := parseHostAddr(a.Address); ok {
				g.NodeAddrs = append(g.NodeAddrs, ip)
			}
		}
	}
	g.NodePorts = append([]uint16{BGPPort}, agentPorts...)
	if cfg != nil && cfg.Spec.ListenPort != nil && *cfg.Spec.ListenPort != 0 {
		g.NodePorts = append(g.NodePorts, *cfg.Spec.ListenPort)
	}
	g.PeerPorts = []uint16{BGPPort}
	for _, p := range peers {
		if p == nil || p.Spec.PeerIP == "" {
			continue
		}
		if ap, err := netip.ParseAddrPort(p.Spec.PeerIP); err == nil {
			g.PeerAddrs = append(g.PeerAddrs, ap.Addr().Unmap())
			if ap.Port() != 0 {
				g.PeerPorts = append(g.PeerPorts, ap.Port())
			}
		} else if ip, ok := parseHostAddr(p.Spec.PeerIP); ok {
			g.PeerAddrs = append(g.PeerAddrs, ip)
		}
	}
	return g
}

// parseHostAddr parses an address or an address with a prefix length.
func parseHostAddr(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return a.Unmap(), true
	}
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Addr().Unmap(), true
	}
	return netip.Addr{}, false
}

// nodeGuardSetNames are the node and peer sets of a family.
func nodeGuardSetNames(f Family) (nodes, peers string) {
	if f == IPv6 {
		return SetNodes6, SetBGPPeers6
	}
	return SetNodes, SetBGPPeers
}

// on reports whether the guard protects anything. The agent always sets
// it (the BGP port at least); the zero value, as a test's Input has it,
// emits no guard rules or sets.
func (g NodeGuard) on() bool {
	return len(g.NodeAddrs) > 0 || len(g.PeerAddrs) > 0 || len(g.NodePorts) > 0 || len(g.PeerPorts) > 0
}

// guardJump is the first rule of ChainForward and ChainInput, when the
// guard is on.
func (c *compiler) guardJump() []Rule {
	if !c.in.Guard.on() {
		return nil
	}
	return []Rule{{Match: []Match{inIface(WorkloadIfacePrefix + "+")}, Verdict: Verdict{Kind: VerdictJump, Chain: ChainNodeGuard}}}
}

// nodeGuardChain drops, per family, TCP from workloads to a node's
// protected ports and to a peer's BGP ports, and fills the node and peer
// sets. Connections already open when the rule appears are dropped too:
// the chain does not look at conntrack state.
func (c *compiler) nodeGuardChain() Chain {
	g := c.in.Guard
	byFam := func(addrs []netip.Addr) map[Family][]netip.Prefix {
		out := map[Family][]netip.Prefix{}
		for _, a := range addrs {
			if a.IsValid() {
				out[FamilyOf(a)] = append(out[FamilyOf(a)], netip.PrefixFrom(a, a.BitLen()))
			}
		}
		return out
	}
	nodes, peers := byFam(g.NodeAddrs), byFam(g.PeerAddrs)
	ch := Chain{Table: TableFilter, Name: ChainNodeGuard}
	for _, f := range Families {
		nodeSet, peerSet := nodeGuardSetNames(f)
		c.addNetSet(nodeSet, f, nodes[f])
		c.addNetSet(peerSet, f, peers[f])
		ch.Rules = append(ch.Rules, guardRules(nodeSet, f, g.NodePorts)...)
		ch.Rules = append(ch.Rules, guardRules(peerSet, f, g.PeerPorts)...)
	}
	return ch
}

// guardRules drop TCP to the members of set on ports, in chunks a port
// match holds.
func guardRules(set string, f Family, ports []uint16) []Rule {
	ports = slices.Compact(slices.Sorted(slices.Values(ports)))
	ports = slices.DeleteFunc(ports, func(p uint16) bool { return p == 0 })
	var out []Rule
	for chunk := range slices.Chunk(ports, MaxPortsPerMatch) {
		prs := make([]PortRange, 0, len(chunk))
		for _, p := range chunk {
			prs = append(prs, PortRange{Lo: p, Hi: p})
		}
		out = append(out, Rule{
			Match:   []Match{setMatch(set, f, true, false), protoMatch("tcp"), {Kind: MatchDstPorts, Ports: prs}},
			Verdict: Verdict{Kind: VerdictDrop},
		})
	}
	return out
}

// noMasqToNodes is natOutgoing's first rule of a family: traffic to a
// cluster node keeps the pod's address, so that the node it reaches never
// takes it for its peer's own.
func (c *compiler) noMasqToNodes(f Family) []Rule {
	if !c.in.Guard.on() {
		return nil
	}
	nodeSet, _ := nodeGuardSetNames(f)
	return []Rule{{Match: []Match{setMatch(nodeSet, f, true, false)}, Verdict: Verdict{Kind: VerdictReturn}}}
}
