package policy

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/tabbynet/tabby/api"
)

// This file compiles host endpoints (Calico's HostEndpoint semantics, see
// docs/policy.md). Nothing here is emitted while the node has no host
// endpoint: the ruleset is then what it was before host endpoints existed.
//
//	filter INPUT   -> tabby-INPUT -> ... -> tabby-HOST-IN  -> tabby-hi-<hep>   to the node
//	filter OUTPUT  -> tabby-HOST-OUT -> cali+: tabby-to-wl (node → pod)
//	                                 -> tabby-ho-<hep>  from the node
//	filter FORWARD -> tabby-FORWARD -> tabby-HOST-FWI -> tabby-hfi-<hep>  forwarded in (applyOnForward)
//	                                -> tabby-HOST-FWO -> tabby-hfo-<hep>  forwarded out (applyOnForward)
//	mangle PREROUTING -> tabby-HOST-PRE -> tabby-hp-<hep>  preDNAT, before kube-proxy's DNAT
//	tabby-INPUT, -i cali+ -> tabby-wh-<hep>  a pod to its node, through the "*" endpoint's ingress policy
//
// Failsafe ports are accepted in the input and output chains before any
// policy, and skip the preDNAT policies, so that no policy cuts a node off.

// Host endpoint chains and tables.
const (
	ChainHostIn      = "tabby-HOST-IN"
	ChainHostOut     = "tabby-HOST-OUT"
	ChainHostFwdIn   = "tabby-HOST-FWI"
	ChainHostFwdOut  = "tabby-HOST-FWO"
	ChainHostPreDNAT = "tabby-HOST-PRE"

	// TableMangle holds the preDNAT chains: its PREROUTING runs after
	// conntrack and before the nat table's DNAT.
	TableMangle = "mangle"
)

// Failsafe is a port host endpoint policy never blocks: inbound, to the
// node's Port from Net (any when invalid); outbound, from the node to Port
// at Net.
type Failsafe struct {
	Proto string // "tcp", "udp", "sctp"
	Port  uint16
	Net   netip.Prefix
}

// FailsafesFrom converts the api's failsafe ports, skipping unusable ones
// (validation refuses them).
func FailsafesFrom(ports []api.ProtoPort) []Failsafe {
	var out []Failsafe
	for _, p := range ports {
		f := Failsafe{Proto: strings.ToLower(p.Protocol), Port: p.Port}
		if p.Net != "" {
			n, err := netip.ParsePrefix(p.Net)
			if err != nil {
				continue
			}
			f.Net = n.Masked()
		}
		out = append(out, f)
	}
	return out
}

// hostEP is a local host endpoint with its chain names.
type hostEP struct {
	hep  *api.HostEndpoint
	name string
	id   string // hash part of the chain names
}

func (h hostEP) chain(kind string) string { return Prefix + kind + "-" + h.id }

// hostEndpoints picks the node's host endpoints: one per named interface
// and one "*" (the first by name in each case, a warning for the rest).
func (c *compiler) hostEndpoints() (named []hostEP, all *hostEP) {
	var mine []*api.HostEndpoint
	for _, h := range c.in.HostEndpoints {
		if h != nil && h.Spec.Node == c.in.Node {
			mine = append(mine, h)
		}
	}
	slices.SortFunc(mine, func(a, b *api.HostEndpoint) int { return cmp.Compare(a.Metadata.Name, b.Metadata.Name) })
	byIface := map[string]string{}
	for _, h := range mine {
		n := h.Spec.InterfaceName
		if n == "" || n == "lo" || strings.HasPrefix(n, WorkloadIfacePrefix) || len(n) > 15 {
			c.warnf("host endpoint %s: interface %q cannot be policed", h.Metadata.Name, n)
			continue
		}
		if first, dup := byIface[n]; dup {
			c.warnf("host endpoints %s and %s share interface %s: %s not policed", first, h.Metadata.Name, n, h.Metadata.Name)
			continue
		}
		byIface[n] = h.Metadata.Name
		e := hostEP{hep: h, name: h.Metadata.Name, id: shortHash("hep/"+h.Metadata.Name, 16)}
		if n == api.AllInterfaces {
			all = &e
		} else {
			named = append(named, e)
		}
	}
	slices.SortFunc(named, func(a, b hostEP) int { return cmp.Compare(a.hep.Spec.InterfaceName, b.hep.Spec.InterfaceName) })
	return named, all
}

// hostPolicyKind says which of a host endpoint's policies a chain uses.
type hostPolicyKind int

const (
	hostNormal  hostPolicyKind = iota // to and from the node's own processes
	hostForward                       // applyOnForward, forwarded traffic
	hostPreDNAT                       // preDNAT, before DNAT
)

// hostPolicies returns the chains of the global policies that select h in
// dir for kind, in order. Namespaced policies and global ones with a
// namespaceSelector select workloads only.
func (c *compiler) hostPolicies(h hostEP, dir direction, kind hostPolicyKind) []string {
	var out []string
	for _, g := range c.gnps {
		in, eg := g.AppliesTo()
		if (dir == ingress && !in) || (dir == egress && !eg) || g.Spec.NamespaceSelector != nil || g.Spec.DoNotTrack {
			continue
		}
		switch kind {
		case hostNormal:
			if g.Spec.PreDNAT {
				continue
			}
		case hostForward:
			if !g.Spec.ApplyOnForward || g.Spec.PreDNAT {
				continue
			}
		case hostPreDNAT:
			if !g.Spec.PreDNAT || dir != ingress {
				continue
			}
		}
		if g.Spec.Selector != nil && !g.Spec.Selector.Matches(h.hep.Metadata.Labels) {
			continue
		}
		if kind == hostPreDNAT {
			out = append(out, c.preDNATChain(g))
			continue
		}
		out = append(out, c.globalPolicyChain(g, dir))
	}
	return out
}

// preDNATChain emits (once) and names a preDNAT policy's chain: its
// ingress rules in the mangle table (iptables chains are per table; the
// nftables backend holds every chain in one table, hence a name of its
// own, "tabby-pd-…").
func (c *compiler) preDNATChain(g *api.GlobalNetworkPolicy) string {
	name := Prefix + "pd-" + shortHash("gnp/"+g.Metadata.Name, 16)
	if _, ok := c.preDNAT[name]; ok {
		return name
	}
	// Workloads never use a preDNAT policy (policiesFor), so the filter
	// chain globalPolicyChain emits is only a template here.
	_, had := c.chains[c.policyChainName("gnp/"+g.Metadata.Name, ingress)]
	filter := c.globalPolicyChain(g, ingress)
	ch := c.chains[filter]
	if !had {
		delete(c.chains, filter)
	}
	if c.preDNAT == nil {
		c.preDNAT = map[string]Chain{}
	}
	c.preDNAT[name] = Chain{Table: TableMangle, Name: name, Rules: ch.Rules}
	return name
}

// Rules shared by the host endpoint chains.
var (
	ruleAcceptIfOK        = Rule{Match: []Match{{Kind: MatchMark, Mark: MarkAccept, Mask: MarkAccept}}, Verdict: Verdict{Kind: VerdictAccept}}
	ruleEstablishedReturn = Rule{Match: []Match{{Kind: MatchEstablished}}, Verdict: Verdict{Kind: VerdictReturn}}
	ruleReturn            = Rule{Verdict: Verdict{Kind: VerdictReturn}}
)

// hostChains emits the host endpoint chains and returns them with the
// jumps they need, and the rules tabby-INPUT and tabby-FORWARD gain. All
// are empty when the node has no host endpoint.
func (c *compiler) hostChains() (chains []Chain, jumps []Jump, hooks hostHooks) {
	named, all := c.hostEndpoints()
	eps := slices.Clone(named)
	if all != nil {
		eps = append(eps, *all)
	}
	if len(eps) == 0 {
		return nil, nil, hostHooks{}
	}
	in, out := c.failsafeRules(false), c.failsafeRules(true)
	for _, h := range eps {
		chains = append(chains, c.endpointHostChains(h, in, out)...)
	}
	// A pod to its node goes through the "*" endpoint's ingress policy
	// (when a policy selects it) before the endpoint-to-host action.
	if all != nil {
		ch := Chain{Table: TableFilter, Name: all.chain("wh")}
		if pols := c.hostPolicies(*all, ingress, hostNormal); len(pols) > 0 {
			ch.Rules = append(ch.Rules, ruleEstablishedReturn)
			ch.Rules = append(ch.Rules, hostPolicyRules(pols, ruleReturnIfOK)...)
			ch.Rules = append(ch.Rules, withOrigin(ruleDrop, defaultDeny(ingress)))
		}
		chains = append(chains, ch)
		hooks.toHost = []Rule{{Match: []Match{inIface(WorkloadIfacePrefix + "+")}, Verdict: Verdict{Kind: VerdictJump, Chain: ch.Name}}}
	}
	for _, name := range slices.Sorted(maps.Keys(c.preDNAT)) {
		chains = append(chains, c.preDNAT[name])
	}
	dispatch := hostDispatchChains(named, all)
	for i := range dispatch {
		if dispatch[i].Name == ChainHostOut {
			dispatch[i].Rules = append(c.tunnelHostRules(true), dispatch[i].Rules...)
		}
	}
	chains = append(chains, dispatch...)
	c.cache.shareHostChains(chains)
	hooks.input = append(c.tunnelHostRules(false), jumpTo(ChainHostIn))
	hooks.forwardIn = []Rule{jumpTo(ChainHostFwdIn)}
	hooks.forwardOut = []Rule{jumpTo(ChainHostFwdOut)}
	jumps = []Jump{
		{Table: TableFilter, From: "OUTPUT", To: ChainHostOut},
		{Table: TableMangle, From: "PREROUTING", To: ChainHostPreDNAT},
	}
	return chains, jumps, hooks
}

// endpointHostChains are one host endpoint's chains: to and from the node
// (hi, ho), forwarded in and out (hfi, hfo), preDNAT (hp). in and out are
// the failsafe rules.
func (c *compiler) endpointHostChains(h hostEP, in, out []Rule) []Chain {
	var chains []Chain
	nd := Rule{Match: []Match{{Kind: MatchICMPv6Types, ICMPTypes: hostNDTypes}}, Verdict: Verdict{Kind: VerdictAccept}}
	// To the node: established, neighbour discovery, failsafes, then
	// policy; what no policy decided is dropped, or accepted with the
	// default-allow profile when no policy selects h.
	for _, d := range []struct {
		kind string
		dir  direction
		fs   []Rule
	}{{"hi", ingress, in}, {"ho", egress, out}} {
		ch := Chain{Table: TableFilter, Name: h.chain(d.kind), Rules: []Rule{ruleEstablished, nd}}
		ch.Rules = append(ch.Rules, d.fs...)
		pols := c.hostPolicies(h, d.dir, hostNormal)
		ch.Rules = append(ch.Rules, hostPolicyRules(pols, ruleAcceptIfOK)...)
		if len(pols) == 0 && h.hep.DefaultAllow() {
			ch.Rules = append(ch.Rules, Rule{Verdict: Verdict{Kind: VerdictAccept}})
		} else {
			ch.Rules = append(ch.Rules, withOrigin(ruleDrop, defaultDeny(d.dir)))
		}
		chains = append(chains, ch)
	}
	// Forwarded: only applyOnForward policies, allowed when none selects h.
	for _, d := range []struct {
		kind string
		dir  direction
	}{{"hfi", ingress}, {"hfo", egress}} {
		ch := Chain{Table: TableFilter, Name: h.chain(d.kind)}
		if pols := c.hostPolicies(h, d.dir, hostForward); len(pols) > 0 {
			ch.Rules = append(ch.Rules, ruleEstablishedReturn)
			ch.Rules = append(ch.Rules, hostPolicyRules(pols, ruleReturnIfOK)...)
			ch.Rules = append(ch.Rules, withOrigin(ruleDrop, defaultDeny(d.dir)))
		}
		chains = append(chains, ch)
	}
	// preDNAT: established flows and failsafes skip it, Deny drops, the
	// rest goes on to the normal policy after DNAT.
	pre := Chain{Table: TableMangle, Name: h.chain("hp")}
	if pols := c.hostPolicies(h, ingress, hostPreDNAT); len(pols) > 0 {
		pre.Rules = append(pre.Rules, ruleEstablishedReturn)
		for _, r := range in {
			pre.Rules = append(pre.Rules, Rule{Match: r.Match, Verdict: Verdict{Kind: VerdictReturn}})
		}
		pre.Rules = append(pre.Rules, hostPolicyRules(pols, ruleReturnIfOK)...)
		pre.Rules = append(pre.Rules, ruleClearMark)
	}
	return append(chains, pre)
}

// hostDispatchChains send each hook's packets to the chain of their host
// endpoint: a named endpoint's for its interface, else the "*" one's, else
// back (not policed). Workload interfaces and lo are never host endpoints;
// the node's traffic to its pods meets the pods' ingress policy instead.
func hostDispatchChains(named []hostEP, all *hostEP) []Chain {
	wl := WorkloadIfacePrefix + "+"
	dispatch := func(name, table string, out bool, kind string, head []Rule) Chain {
		ch := Chain{Table: table, Name: name, Rules: head}
		iface := inIface
		if out {
			iface = outIface
		}
		for _, h := range named {
			ch.Rules = append(ch.Rules, Rule{Match: []Match{iface(h.hep.Spec.InterfaceName)}, Verdict: Verdict{Kind: VerdictGoto, Chain: h.chain(kind)}})
		}
		if all != nil {
			ch.Rules = append(ch.Rules, Rule{Verdict: Verdict{Kind: VerdictGoto, Chain: all.chain(kind)}})
		}
		return ch
	}
	notWL := func(out bool) []Rule {
		iface := inIface
		if out {
			iface = outIface
		}
		return []Rule{{Match: []Match{iface(wl)}, Verdict: Verdict{Kind: VerdictReturn}}, {Match: []Match{iface("lo")}, Verdict: Verdict{Kind: VerdictReturn}}}
	}
	// The node to its pods: the pod's ingress policy, as from anywhere,
	// but for the neighbour discovery IPv6 needs.
	nodeToPod := []Rule{
		{Match: []Match{outIface(wl), {Kind: MatchICMPv6Types, ICMPTypes: NeighbourDiscoveryTypes}}, Verdict: Verdict{Kind: VerdictAccept}},
		{Match: []Match{outIface(wl)}, Verdict: Verdict{Kind: VerdictJump, Chain: ChainToWL}},
		{Match: []Match{outIface(wl)}, Verdict: Verdict{Kind: VerdictAccept}},
		{Match: []Match{outIface("lo")}, Verdict: Verdict{Kind: VerdictReturn}},
	}
	return []Chain{
		dispatch(ChainHostIn, TableFilter, false, "hi", notWL(false)),
		dispatch(ChainHostOut, TableFilter, true, "ho", nodeToPod),
		dispatch(ChainHostFwdIn, TableFilter, false, "hfi", notWL(false)),
		dispatch(ChainHostFwdOut, TableFilter, true, "hfo", notWL(true)),
		dispatch(ChainHostPreDNAT, TableMangle, false, "hp", notWL(false)),
	}
}

// hostHooks are the rules the workload chains gain for host endpoints.
type hostHooks struct {
	input      []Rule // end of tabby-INPUT
	toHost     []Rule // tabby-INPUT, after a pod's own chain
	forwardIn  []Rule // start of tabby-FORWARD
	forwardOut []Rule // tabby-FORWARD, after the workload dispatches
}

// hostNDTypes are the ICMPv6 types a host endpoint always passes, in and
// out: multicast listener query, report and done (130–132), router
// solicitation and advertisement (133, 134: the node's uplink may take its
// address and route from its router), neighbour solicitation and
// advertisement (135, 136). IPv6 on the interface needs them.
var hostNDTypes = []uint8{130, 131, 132, 133, 134, 135, 136}

// hostPolicyRules evaluates global policy chains in order: the first to
// set the accept mark ends evaluation with allowed.
func hostPolicyRules(pols []string, allowed Rule) []Rule {
	if len(pols) == 0 {
		return nil
	}
	rules := []Rule{ruleClearMark}
	for _, p := range pols {
		rules = append(rules, jumpTo(p), allowed)
	}
	return rules
}

// failsafeRules accept the failsafe ports: inbound ones by destination
// port (from their net), outbound ones by destination port (to their net).
func (c *compiler) failsafeRules(outbound bool) []Rule {
	fs := c.in.FailsafeInbound
	if outbound {
		fs = c.in.FailsafeOutbound
	}
	type key struct {
		proto string
		net   netip.Prefix
	}
	groups := map[key][]uint16{}
	for _, f := range fs {
		switch f.Proto {
		case "tcp", "udp", "sctp":
		default:
			c.warnf("failsafe port %s/%d: protocol must be tcp, udp or sctp", f.Proto, f.Port)
			continue
		}
		k := key{f.Proto, f.Net}
		groups[k] = append(groups[k], f.Port)
	}
	keys := slices.SortedFunc(maps.Keys(groups), func(a, b key) int {
		return cmp.Or(cmp.Compare(a.proto, b.proto), cmp.Compare(a.net.String(), b.net.String()))
	})
	var rules []Rule
	for _, k := range keys {
		ports := slices.Compact(slices.Sorted(slices.Values(groups[k])))
		for chunk := range slices.Chunk(ports, MaxPortsPerMatch) {
			var m []Match
			if k.net.IsValid() {
				f := FamilyOf(k.net.Addr())
				if outbound {
					m = append(m, setMatch(c.netSet(f, []netip.Prefix{k.net}, nil), f, true, false))
				} else {
					m = append(m, Match{Kind: MatchSrcNet, Net: k.net})
				}
			}
			var prs []PortRange
			for _, p := range chunk {
				prs = append(prs, PortRange{Lo: p, Hi: p})
			}
			m = append(m, protoMatch(k.proto), Match{Kind: MatchDstPorts, Ports: prs})
			rules = append(rules, Rule{Match: m, Verdict: Verdict{Kind: VerdictAccept}})
		}
	}
	return rules
}

// shareHostChains replaces each host endpoint chain equal to the last
// pass's by the last pass's, so that consumers skip it by identity (they
// are few and cheap to build, but a firewall renders and hashes every
// chain whose slice is new), and remembers this pass's.
func (cc *Compiler) shareHostChains(chains []Chain) {
	if cc == nil {
		return
	}
	next := make(map[string]Chain, len(chains))
	for i, ch := range chains {
		if prev, ok := cc.hostChains[ch.Name]; ok && prev.Equal(ch) {
			chains[i] = prev
		}
		next[ch.Name] = chains[i]
	}
	cc.hostChains = next
}
