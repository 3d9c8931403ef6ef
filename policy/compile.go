package policy

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/tabbynet/tabby/api"
)

// compiler holds one compilation's state.
type compiler struct {
	in       Input
	eps      []*endpoint                // every endpoint, by name
	local    []*endpoint                // this node's, by interface
	gnps     []*api.GlobalNetworkPolicy // enforced, by tier, order, name
	sgnps    []*api.GlobalNetworkPolicy // staged (asGlobal), by tier, order, name
	tiers    []*api.Tier                // in order
	tierIdx  map[string]int             // index in tiers by name
	staged   map[*api.GlobalNetworkPolicy]bool
	nps      []*api.NetworkPolicy
	npsByNs  map[string][]*api.NetworkPolicy // nps by namespace, in order
	sets     map[string]*Set
	chains   map[string]Chain // policy chains emitted so far, by name
	warnings []string
	// cache, when set, lends the work of the Compiler's previous pass
	// (cache.go); nil compiles from scratch.
	cache *Compiler
	// refs, when set, records the policies policiesFor picks (for the
	// cache of endpoint chains).
	refs *[]policyRef
	// names remembers policy chain names (shared with the cache).
	names map[chainKey]string
	// preDNAT holds the mangle-table chains of preDNAT policies (host.go).
	preDNAT map[string]Chain
	// nsTable shares namespace labels when there is no cache (nslabels.go).
	nsTable *nsLabelTable
}

// Compile computes the node's packet-filter state from the cluster state.
// It is pure and deterministic: the same input gives the same ruleset.
// Inputs it cannot use are skipped and named in Ruleset.Warnings.
func Compile(in Input) *Ruleset { return compile(in, nil) }

func compile(in Input, cache *Compiler) *Ruleset {
	c := &compiler{in: in, cache: cache}
	// Sized as the last pass's: a pass that changes little does not grow
	// them step by step.
	nsets, nchains := 0, 0
	if cache != nil {
		nsets, nchains = len(cache.sets)+8, len(cache.policies)
	}
	c.sets, c.chains = make(map[string]*Set, nsets), make(map[string]Chain, nchains)
	c.cache.begin(c)
	c.parseEndpoints()
	c.orderPolicies()
	c.cache.prepare(c)

	// Endpoint chains by kind, each kind in interface order, so that the
	// list is nearly sorted already (sorting thousands of chains is a
	// good part of a pass that changes little).
	n := len(c.local)
	fws, tws, extras := make([]Chain, 0, n), make([]Chain, 0, n), []Chain(nil)
	fromDispatch, toDispatch := make([]DispatchTarget, 0, n), make([]DispatchTarget, 0, n)
	for _, ep := range c.local {
		fw, tw, extra := c.endpointChains(ep)
		fws, tws = append(fws, fw), append(tws, tw)
		extras = append(extras, extra...)
		fromDispatch = append(fromDispatch, DispatchTarget{ep.iface(), fw.Name})
		toDispatch = append(toDispatch, DispatchTarget{ep.iface(), tw.Name})
	}
	hostChains, hostJumps, hooks := c.hostChains()
	chains := make([]Chain, 0, len(fws)+len(tws)+len(extras)+len(c.chains)+len(hostChains)+7)
	chains = append(chains, c.forwardChain(hooks), c.inputChain(hooks))
	if c.in.Guard.on() {
		chains = append(chains, c.cache.nodeGuard(c))
	}
	chains = append(chains, hostChains...)
	chains = append(chains, fws...)
	for _, name := range slices.Sorted(maps.Keys(c.chains)) {
		chains = append(chains, c.chains[name])
	}
	chains = append(chains, extras...)
	chains = append(chains,
		Chain{Table: TableFilter, Name: ChainFromWL, Dispatch: &Dispatch{Targets: fromDispatch}},
		Chain{Table: TableFilter, Name: ChainToWL, Dispatch: &Dispatch{Out: true, Targets: toDispatch}})
	chains = append(chains, tws...)
	chains = append(chains, c.natChain())
	tunnel, tunnelJumps := c.cache.tunnelGuard(c)
	chains = append(chains, tunnel...)
	slices.SortFunc(chains, func(a, b Chain) int {
		return cmp.Or(cmp.Compare(a.Table, b.Table), cmp.Compare(a.Name, b.Name))
	})
	c.cache.end(c)
	return &Ruleset{
		Chains: chains,
		// The tunnel guard's jump comes first in INPUT: it only drops, and
		// nothing that accepts may let a forged VXLAN packet by.
		Jumps: append(append(tunnelJumps,
			Jump{Table: TableFilter, From: "FORWARD", To: ChainForward},
			Jump{Table: TableFilter, From: "INPUT", To: ChainInput},
			Jump{Table: TableNAT, From: "POSTROUTING", To: ChainPostrouting},
		), hostJumps...),
		Sets:     c.sortedSets(),
		Warnings: c.warnings,
	}
}

func (c *compiler) warnf(format string, args ...any) {
	c.warnings = append(c.warnings, fmt.Sprintf(format, args...))
}

// namespaceLabels are an endpoint's namespace labels plus the name label
// Kubernetes puts on every namespace.
func namespaceLabels(ns string, labels map[string]string) map[string]string {
	out := make(map[string]string, len(labels)+1)
	maps.Copy(out, labels)
	out[NamespaceNameLabel] = ns
	return out
}

// orderPolicies sorts global policies by tier (tiers.go), then order
// (none last), then name, and namespaced ones by namespace and name.
// Policies of a tier that does not exist are left out whole.
func (c *compiler) orderPolicies() {
	c.orderGlobals()
	for _, p := range c.in.NetworkPolicies {
		if p != nil {
			c.nps = append(c.nps, p)
		}
	}
	slices.SortStableFunc(c.nps, func(x, y *api.NetworkPolicy) int {
		return cmp.Or(cmp.Compare(npNamespace(x), npNamespace(y)), cmp.Compare(x.Metadata.Name, y.Metadata.Name))
	})
	// Each namespace's policies are a run of the sorted list.
	c.npsByNs = map[string][]*api.NetworkPolicy{}
	for i := 0; i < len(c.nps); {
		ns := npNamespace(c.nps[i])
		j := i + 1
		for j < len(c.nps) && npNamespace(c.nps[j]) == ns {
			j++
		}
		c.npsByNs[ns] = c.nps[i:j:j]
		i = j
	}
}

func npNamespace(p *api.NetworkPolicy) string {
	if p.Metadata.Namespace == "" {
		return "default"
	}
	return p.Metadata.Namespace
}

// direction is ingress (to the workload) or egress (from it).
type direction int

const (
	ingress direction = iota
	egress
)

// policyChainName is policyChainName, remembered: endpoints ask for the
// same policies' chains over and over.
func (c *compiler) policyChainName(identity string, dir direction) string {
	k := chainKey{identity, dir}
	if n, ok := c.names[k]; ok {
		return n
	}
	if c.names == nil {
		c.names = map[chainKey]string{}
	}
	n := policyChainName(identity, dir)
	c.names[k] = n
	return n
}

type chainKey struct {
	identity string
	dir      direction
}

// policyChainName names a policy's chain for a direction: "tabby-pi-" or
// "tabby-po-" and 16 characters of a hash of the policy's identity.
func policyChainName(identity string, dir direction) string {
	d := "pi"
	if dir == egress {
		d = "po"
	}
	return Prefix + d + "-" + shortHash(identity, 16)
}

// Rules and verdicts shared by many chains.
var (
	ruleEstablished = Rule{Match: []Match{{Kind: MatchEstablished}}, Verdict: Verdict{Kind: VerdictAccept}}
	ruleClearMark   = Rule{Verdict: Verdict{Kind: VerdictSetMark, Mark: 0, Mask: MarkAccept}}
	ruleReturnIfOK  = Rule{Match: []Match{{Kind: MatchMark, Mark: MarkAccept, Mask: MarkAccept}}, Verdict: Verdict{Kind: VerdictReturn}}
	actionAllow     = Verdict{Kind: VerdictSetMark, Mark: MarkAccept, Mask: MarkAccept}
	actionDrop      = Verdict{Kind: VerdictDrop}
	ruleDrop        = Rule{Verdict: actionDrop}
)

func jumpTo(chain string) Rule { return Rule{Verdict: Verdict{Kind: VerdictJump, Chain: chain}} }

// fromWorkloadChain is the egress chain of a local endpoint: anti-spoofing
// first (also when no policy selects it), then conntrack, then policy. It
// returns extra chains it needs (the anti-spoofing chain of an endpoint
// with several addresses of a family).
//
// Anti-spoofing is per family: a packet whose source is not one of the
// endpoint's addresses of its family is dropped, so a pod without an IPv6
// address sends no IPv6 at all (the neighbour discovery it needs towards
// its node is accepted in the input chain before this one runs).
func (c *compiler) fromWorkloadChain(ep *endpoint) (Chain, []Chain) {
	ch := Chain{Table: TableFilter, Name: Prefix + "fw-" + ep.iface()}
	var extra []Chain
	if len(ep.addrs) == 0 {
		ch.Rules = append(ch.Rules, ruleDrop)
		return ch, nil
	}
	byFamily := map[Family][]netip.Addr{}
	for _, a := range ep.addrs {
		byFamily[FamilyOf(a)] = append(byFamily[FamilyOf(a)], a)
	}
	var sp *Chain
	for _, f := range Families {
		addrs := byFamily[f]
		switch len(addrs) {
		case 0:
			ch.Rules = append(ch.Rules, Rule{Match: []Match{familyMatch(f)}, Verdict: actionDrop})
		case 1:
			ch.Rules = append(ch.Rules, Rule{Match: []Match{{Kind: MatchSrcNet, Net: netip.PrefixFrom(addrs[0], f.Bits()), Negate: true}}, Verdict: actionDrop})
		default:
			// One chain for the families with several addresses: it
			// returns for each of them and drops the rest of the family.
			if sp == nil {
				sp = &Chain{Table: TableFilter, Name: Prefix + "sp-" + ep.iface()}
			}
			for _, a := range addrs {
				sp.Rules = append(sp.Rules, Rule{Match: []Match{{Kind: MatchSrcNet, Net: netip.PrefixFrom(a, f.Bits())}}, Verdict: Verdict{Kind: VerdictReturn}})
			}
			sp.Rules = append(sp.Rules, Rule{Match: []Match{familyMatch(f)}, Verdict: actionDrop})
			ch.Rules = append(ch.Rules, Rule{Match: []Match{familyMatch(f)}, Verdict: Verdict{Kind: VerdictJump, Chain: sp.Name}})
		}
	}
	if sp != nil {
		extra = append(extra, *sp)
	}
	ch.Rules = append(ch.Rules, ruleEstablished)
	rules, tierChains := c.tieredRules(ep, egress)
	ch.Rules = append(ch.Rules, rules...)
	return ch, append(extra, tierChains...)
}

// toWorkloadChain is the ingress chain of a local endpoint.
// Its tier chains are returned as extra chains.
func (c *compiler) toWorkloadChain(ep *endpoint) (Chain, []Chain) {
	ch := Chain{Table: TableFilter, Name: Prefix + "tw-" + ep.iface()}
	ch.Rules = append(ch.Rules, ruleEstablished)
	rules, extra := c.tieredRules(ep, ingress)
	ch.Rules = append(ch.Rules, rules...)
	return ch, extra
}

// forwardChain sends workload traffic through both dispatches and accepts
// what they let through. The from-workload chains return rather than
// accept, so that traffic between two local workloads meets the
// destination's ingress policy too.
//
// With host endpoints (host.go), forwarded traffic meets the applyOnForward
// policy of the endpoint it came in by first, and that of the one it goes
// out by after the workload chains. The node guard (nodeguard.go) comes
// before all of it.
func (c *compiler) forwardChain(h hostHooks) Chain {
	wl := WorkloadIfacePrefix + "+"
	accept := Verdict{Kind: VerdictAccept}
	rules := c.guardJump()
	rules = append(rules, h.forwardIn...)
	rules = append(rules,
		Rule{Match: []Match{inIface(wl)}, Verdict: Verdict{Kind: VerdictJump, Chain: ChainFromWL}},
		Rule{Match: []Match{outIface(wl)}, Verdict: Verdict{Kind: VerdictJump, Chain: ChainToWL}})
	rules = append(rules, h.forwardOut...)
	rules = append(rules,
		Rule{Match: []Match{inIface(wl)}, Verdict: accept},
		Rule{Match: []Match{outIface(wl)}, Verdict: accept})
	return Chain{Table: TableFilter, Name: ChainForward, Rules: rules}
}

// inputChain polices traffic from workloads to this node as the forward
// path polices traffic between workloads: first the node's protected ports
// are dropped whatever else applies, then the workload's own chain
// (anti-spoofing, established flows, egress policy; it returns when policy
// allows), then the endpoint-to-host action. Established flows the node
// opened to a pod (kubelet probes) come back through the workload chain's
// conntrack rule, so a Drop action keeps them working.
//
// With host endpoints (host.go), a pod's packet meets the "*" endpoint's
// ingress policy before the action, and the node's other traffic goes to
// the host endpoint chains at the end.
func (c *compiler) inputChain(h hostHooks) Chain {
	wl := WorkloadIfacePrefix + "+"
	rules := c.guardJump()
	byProto := map[string][]uint16{}
	for _, hp := range c.in.HostProtectedPorts {
		switch hp.Proto {
		case "tcp", "udp", "sctp":
			byProto[hp.Proto] = append(byProto[hp.Proto], hp.Port)
		default:
			c.warnf("protected host port %s/%d: protocol must be tcp, udp or sctp", hp.Proto, hp.Port)
		}
	}
	for _, proto := range slices.Sorted(maps.Keys(byProto)) {
		ports := slices.Compact(slices.Sorted(slices.Values(byProto[proto])))
		for chunk := range slices.Chunk(ports, MaxPortsPerMatch) {
			var prs []PortRange
			for _, p := range chunk {
				prs = append(prs, PortRange{Lo: p, Hi: p})
			}
			rules = append(rules, Rule{
				Match:   []Match{inIface(wl), protoMatch(proto), {Kind: MatchDstPorts, Ports: prs}},
				Verdict: Verdict{Kind: VerdictDrop},
			})
		}
	}
	// Neighbour discovery comes from the pod's link-local address, which
	// anti-spoofing would drop, and must pass whatever the action.
	rules = append(rules, Rule{
		Match:   []Match{inIface(wl), {Kind: MatchICMPv6Types, ICMPTypes: NeighbourDiscoveryTypes}},
		Verdict: Verdict{Kind: VerdictAccept},
	})
	rules = append(rules, Rule{Match: []Match{inIface(wl)}, Verdict: Verdict{Kind: VerdictJump, Chain: ChainFromWL}})
	rules = append(rules, h.toHost...)
	switch c.in.EndpointToHostAction {
	case EndpointToHostAccept:
		rules = append(rules, Rule{Match: []Match{inIface(wl)}, Verdict: Verdict{Kind: VerdictAccept}})
	case EndpointToHostReturn:
	case "", EndpointToHostDrop:
		rules = append(rules, Rule{Match: []Match{inIface(wl)}, Verdict: Verdict{Kind: VerdictDrop}})
	default:
		c.warnf("endpoint-to-host action %q is not Drop, Accept or Return: dropping", c.in.EndpointToHostAction)
		rules = append(rules, Rule{Match: []Match{inIface(wl)}, Verdict: Verdict{Kind: VerdictDrop}})
	}
	rules = append(rules, h.input...)
	return Chain{Table: TableFilter, Name: ChainInput, Rules: rules}
}

// natChain masquerades traffic from natOutgoing pools to destinations
// outside every pool of the family, and fills the pool sets of both
// families.
func (c *compiler) natChain() Chain {
	all := map[Family][]netip.Prefix{}
	masq := map[Family][]netip.Prefix{}
	for _, p := range c.in.Pools {
		if p == nil {
			continue
		}
		pr, err := p.Prefix()
		if err != nil || pr.Addr().Is4In6() {
			c.warnf("pool %s: cidr %q does not parse", p.Metadata.Name, p.Spec.CIDR)
			continue
		}
		f := FamilyOf(pr.Addr())
		for _, n := range netsExcept([]netip.Prefix{pr}, nil) {
			all[f] = append(all[f], n)
			if p.Spec.NATOutgoing {
				masq[f] = append(masq[f], n)
			}
		}
	}
	ch := Chain{Table: TableNAT, Name: ChainPostrouting}
	for _, f := range Families {
		allName, masqName := poolSetNames(f)
		c.addNetSet(allName, f, all[f])
		c.addNetSet(masqName, f, masq[f])
		ch.Rules = append(ch.Rules, c.noMasqToNodes(f)...)
		ch.Rules = append(ch.Rules, Rule{
			Match:   []Match{setMatch(masqName, f, false, false), setMatch(allName, f, true, true)},
			Verdict: Verdict{Kind: VerdictMasquerade},
		})
	}
	return ch
}

// poolSetNames are the names of the sets of every pool and of the
// natOutgoing pools of a family.
func poolSetNames(f Family) (all, masq string) {
	if f == IPv6 {
		return SetAllPools6, SetMasqPools6
	}
	return SetAllPools, SetMasqPools
}
