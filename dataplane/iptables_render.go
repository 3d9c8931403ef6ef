package dataplane

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/tabbynet/tabby/policy"
)

// dispatchFanout is the number of dispatch targets above which iptables
// dispatch chains split into one sub-chain per character after the
// interface prefix, so that a packet meets about n/16 interface matches
// instead of n. (nftables looks the interface up in a verdict map.)
const dispatchFanout = 32

// RenderIPTables renders the neutral state's IPv4 part for iptables and
// ipset (RenderIPTablesFamily). It is pure; the Linux firewall and the
// fake both use it.
func RenderIPTables(s FirewallState) IPTablesState { return RenderIPTablesFamily(s, policy.IPv4) }

// RenderIPTablesFamily renders the part of the neutral state that applies
// to one family: for iptables and `family inet` ipsets (IPv4), or for
// ip6tables and `family inet6` ipsets (IPv6). Rules whose terms are of the
// other family are left out (they never match this family's packets),
// family terms of this one vanish (the table is the family), and so do
// the other family's sets. Chains and jumps are the same in both.
func RenderIPTablesFamily(s FirewallState, fam policy.Family) IPTablesState {
	return renderIPTables(s, fam, FlowLogRules{})
}

// renderIPTables is RenderIPTablesFamily with flow logs: a rule that logs
// (fl.Logs) is preceded by the same matches with an NFLOG target (an
// iptables rule has one target), and every rule with an Origin carries it
// (IPTChain.Origins) for its counters.
func renderIPTables(s FirewallState, fam policy.Family, fl FlowLogRules) IPTablesState {
	out := IPTablesState{Jumps: slices.Clone(s.Jumps)}
	for _, c := range s.Chains {
		if c.Dispatch != nil {
			out.Chains = append(out.Chains, iptDispatchChains(c)...)
			continue
		}
		ic := IPTChain{Table: c.Table, Name: c.Name, Rules: make([][]string, 0, len(c.Rules))}
		for _, r := range c.Rules {
			for _, args := range iptRules(r, fam) {
				if r.Origin != nil && ic.Origins == nil {
					ic.Origins = make([]*policy.Origin, len(ic.Rules), cap(ic.Rules))
				}
				if fl.Logs(r) {
					ic.Rules = append(ic.Rules, iptLogRule(args, fl.Group, r.Origin))
					if ic.Origins != nil {
						ic.Origins = append(ic.Origins, nil) // the verdict's rule counts
					}
				}
				ic.Rules = append(ic.Rules, args)
				if ic.Origins != nil {
					ic.Origins = append(ic.Origins, r.Origin)
				}
			}
		}
		out.Chains = append(out.Chains, ic)
	}
	for _, set := range s.Sets {
		if set.AddrFamily() != fam {
			continue
		}
		typ := "hash:net"
		if set.Type == policy.SetTypeAddrPort {
			typ = "hash:ip,port"
		}
		out.Sets = append(out.Sets, IPSet{Name: set.Name, Type: typ, Family: fam, Members: set.Members()})
	}
	return out
}

// iptRules renders one rule for a family's table: none when the rule is
// of the other family, one per type for an ICMPv6 type list (the icmp6
// match takes one type), else one.
func iptRules(r policy.Rule, fam policy.Family) [][]string {
	if f := r.Family(); f != 0 && f != fam {
		return nil
	}
	i := slices.IndexFunc(r.Match, func(m policy.Match) bool { return m.Kind == policy.MatchICMPv6Types })
	if i < 0 {
		return [][]string{iptRule(r)}
	}
	var out [][]string
	for _, t := range r.Match[i].ICMPTypes {
		one := r
		one.Match = slices.Clone(r.Match)
		one.Match[i].ICMPTypes = []uint8{t}
		out = append(out, iptRule(one))
	}
	return out
}

// iptRule renders one rule's arguments.
func iptRule(r policy.Rule) []string {
	var a []string
	proto := ""
	for _, m := range r.Match {
		switch m.Kind {
		case policy.MatchInIface:
			a = append(a, "-i", m.Iface)
		case policy.MatchOutIface:
			a = append(a, "-o", m.Iface)
		case policy.MatchSrcNet:
			if m.Negate {
				a = append(a, "!")
			}
			a = append(a, "-s", m.Net.String())
		case policy.MatchProto:
			proto = m.Proto
			if proto == "icmpv6" {
				proto = "ipv6-icmp"
			}
			a = append(a, "-p", proto)
		case policy.MatchFamily:
			// The table is the family (iptRules left out the other one's).
		case policy.MatchICMPv6Types:
			a = append(a, "-p", "ipv6-icmp", "-m", "icmp6", "--icmpv6-type", strconv.Itoa(int(m.ICMPTypes[0])))
		case policy.MatchSrcPorts, policy.MatchDstPorts:
			dir := "d"
			if m.Kind == policy.MatchSrcPorts {
				dir = "s"
			}
			var ports []string
			for _, p := range m.Ports {
				if p.Lo == p.Hi {
					ports = append(ports, strconv.Itoa(int(p.Lo)))
				} else {
					ports = append(ports, fmt.Sprintf("%d:%d", p.Lo, p.Hi))
				}
			}
			if len(ports) == 1 {
				a = append(a, "-m", proto, "--"+dir+"port", ports[0])
			} else {
				a = append(a, "-m", "multiport", "--"+dir+"ports", strings.Join(ports, ","))
			}
		case policy.MatchSrcSet, policy.MatchDstSet, policy.MatchSrcAddrPortSet, policy.MatchDstAddrPortSet:
			a = append(a, "-m", "set")
			if m.Negate {
				a = append(a, "!")
			}
			flags := map[policy.MatchKind]string{policy.MatchSrcSet: "src", policy.MatchDstSet: "dst",
				policy.MatchSrcAddrPortSet: "src,src", policy.MatchDstAddrPortSet: "dst,dst"}[m.Kind]
			a = append(a, "--match-set", m.Set, flags)
		case policy.MatchEstablished:
			a = append(a, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED")
		case policy.MatchMark:
			a = append(a, "-m", "mark", "--mark", fmt.Sprintf("%#x/%#x", m.Mark, m.Mask))
		default:
			// ValidateFirewallState's caller built the state from the
			// compiler; an unknown kind is a programming error.
			panic(fmt.Sprintf("iptables: unknown match kind %d", m.Kind))
		}
	}
	v := r.Verdict
	switch v.Kind {
	case policy.VerdictAccept:
		a = append(a, "-j", "ACCEPT")
	case policy.VerdictDrop:
		a = append(a, "-j", "DROP")
	case policy.VerdictReturn:
		a = append(a, "-j", "RETURN")
	case policy.VerdictJump:
		a = append(a, "-j", v.Chain)
	case policy.VerdictGoto:
		a = append(a, "-g", v.Chain)
	case policy.VerdictSetMark:
		a = append(a, "-j", "MARK", "--set-xmark", fmt.Sprintf("%#x/%#x", v.Mark, v.Mask))
	case policy.VerdictMasquerade:
		a = append(a, "-j", "MASQUERADE")
	default:
		panic(fmt.Sprintf("iptables: unknown verdict kind %d", v.Kind))
	}
	return a
}

// iptLogRule is the NFLOG rule that goes before a rule (its arguments
// args) that logs: the same matches, the NFLOG target with the origin's
// prefix.
func iptLogRule(args []string, group uint16, o *policy.Origin) []string {
	i := len(args)
	for i > 0 && args[i-1] != "-j" && args[i-1] != "-g" {
		i--
	}
	return append(slices.Clone(args[:max(i-1, 0)]), "-j", "NFLOG", "--nflog-group", strconv.Itoa(int(group)), "--nflog-prefix", FlowLogPrefix(o))
}

// iptDispatchChains renders a dispatch chain as interface matches with
// goto, ending in DROP; with many targets it fans out by the character
// after the workload prefix.
func iptDispatchChains(c policy.Chain) []IPTChain {
	flag := "-i"
	if c.Dispatch.Out {
		flag = "-o"
	}
	drop := []string{"-j", "DROP"}
	leaf := func(name string, ts []policy.DispatchTarget) IPTChain {
		ch := IPTChain{Table: c.Table, Name: name}
		for _, t := range ts {
			ch.Rules = append(ch.Rules, []string{flag, t.Iface, "-g", t.Chain})
		}
		ch.Rules = append(ch.Rules, drop)
		return ch
	}
	targets := c.Dispatch.Targets
	if len(targets) <= dispatchFanout {
		return []IPTChain{leaf(c.Name, targets)}
	}
	groups := map[byte][]policy.DispatchTarget{}
	for _, t := range targets {
		k := byte('+')
		if len(t.Iface) > len(policy.WorkloadIfacePrefix) && strings.HasPrefix(t.Iface, policy.WorkloadIfacePrefix) {
			k = t.Iface[len(policy.WorkloadIfacePrefix)]
		}
		groups[k] = append(groups[k], t)
	}
	top := IPTChain{Table: c.Table, Name: c.Name}
	var out []IPTChain
	for _, k := range slices.Sorted(maps.Keys(groups)) {
		sub := fmt.Sprintf("%s-%c", c.Name, k)
		top.Rules = append(top.Rules, []string{flag, policy.WorkloadIfacePrefix + string(k) + "+", "-g", sub})
		out = append(out, leaf(sub, groups[k]))
	}
	top.Rules = append(top.Rules, drop)
	return append(out, top)
}
