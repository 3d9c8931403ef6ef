package policy

import (
	"net/netip"
	"slices"
)

// ChainTunnel drops VXLAN packets (UDP to the cluster's VXLAN port) that
// come from anything but a cluster node's underlay address: the tunnel
// device takes whatever reaches its port, so without it any host that can
// send a UDP packet to the node could inject traffic with any pod's
// source address. INPUT jumps to it; it only drops or falls through.
const ChainTunnel = Prefix + "tunnel"

// TunnelGuard is what ChainTunnel needs: the VXLAN port and every
// cluster node's underlay addresses (both families).
type TunnelGuard struct {
	Port  uint16
	Nodes []netip.Addr
}

// tunnelSetName is the set of the family's node addresses.
func tunnelSetName(f Family) string {
	if f == IPv6 {
		return Prefix + "tunnel-nodes-v6"
	}
	return Prefix + "tunnel-nodes-v4"
}

// tunnelGuard returns ChainTunnel, its sets (filled into c.sets) and its
// jump, or nothing when no pool encapsulates (in.TunnelGuard nil). A
// family without node addresses gets an empty set: no packet of it may
// reach the port.
func (c *compiler) tunnelGuard() ([]Chain, []Jump) {
	g := c.in.TunnelGuard
	if g == nil || g.Port == 0 {
		return nil, nil
	}
	var rules []Rule
	for _, f := range Families {
		s := &Set{Name: tunnelSetName(f), Type: SetTypeNet, Family: f}
		for _, a := range g.Nodes {
			if a.IsValid() && FamilyOf(a) == f && !a.Is4In6() {
				s.Nets = append(s.Nets, netip.PrefixFrom(a, a.BitLen()))
			}
		}
		slices.SortFunc(s.Nets, netip.Prefix.Compare)
		s.Nets = slices.Compact(s.Nets)
		c.sets[s.Name] = s
		rules = append(rules, Rule{
			Match: []Match{familyMatch(f), protoMatch("udp"), {Kind: MatchDstPorts, Ports: []PortRange{{Lo: g.Port, Hi: g.Port}}},
				setMatch(s.Name, f, false, true)},
			Verdict: Verdict{Kind: VerdictDrop},
		})
	}
	return []Chain{{Table: TableFilter, Name: ChainTunnel, Rules: rules}},
		[]Jump{{Table: TableFilter, From: "INPUT", To: ChainTunnel}}
}

// tunnelHostRules accept VXLAN between this node and the other cluster
// nodes ahead of host endpoint policy (in: from a node's address to the
// port; out: to one), as Calico's INPUT and OUTPUT chains do: a default-deny
// host policy must not cut the overlay. Nothing when no pool encapsulates.
// By the time INPUT reaches the host endpoint hook, a pod's packet has
// passed anti-spoofing, so a pod cannot borrow a node's address here.
func (c *compiler) tunnelHostRules(out bool) []Rule {
	g := c.in.TunnelGuard
	if g == nil || g.Port == 0 {
		return nil
	}
	var rules []Rule
	for _, f := range Families {
		rules = append(rules, Rule{
			Match: []Match{familyMatch(f), protoMatch("udp"), {Kind: MatchDstPorts, Ports: []PortRange{{Lo: g.Port, Hi: g.Port}}},
				setMatch(tunnelSetName(f), f, out, false)},
			Verdict: Verdict{Kind: VerdictAccept},
		})
	}
	return rules
}
