package policy

import (
	"maps"
	"net/netip"
	"reflect"
	"slices"

	"github.com/tabbynet/tabby/api"
)

// Compiler compiles like Compile, reusing what its previous call computed
// for inputs that did not change: the parsed endpoints, each local
// endpoint's chains, each policy's chains and the members of each set,
// which it updates with the endpoints that came and went rather than
// recomputing. A pass that changes one policy or one pod therefore costs
// in proportion to what that change touches, not to the node's size.
//
// It caches by object identity: an object passed to Compile must not be
// modified afterwards, and a changed resource must be a new object (as the
// cluster view delivers them). Chains, rules and set members that did not
// change are shared between the Rulesets of successive calls (so a
// consumer can skip them by identity) and must not be modified either.
// The output always equals Compile's for the same input. A Compiler is not
// safe for concurrent use.
type Compiler struct {
	started bool
	// other is the input without its lists; when it changes (another
	// node name) everything is recomputed.
	other Input
	names map[chainKey]string

	// The endpoints of the last pass, parsed (endpoints.go); local and
	// warned are those policed here and those with warnings.
	eps, local map[*api.WorkloadEndpoint]*epEntry
	warned     map[*api.WorkloadEndpoint][]string
	// remote and warnedRemote are eps and warned of Input.Remote.
	remote       map[*api.RemoteEndpoint]*epEntry
	warnedRemote map[*api.RemoteEndpoint][]string
	pass         uint64
	// This pass's endpoints that came and went.
	added   []*epEntry
	removed []*endpoint
	// The policed endpoints by interface, as police leaves them, with
	// police's warnings; localDirty when local changed since.
	sortedLocal   []*endpoint
	localWarnings []string
	localDirty    bool
	// CompileChanges's changes, while it runs.
	changes []EndpointChange
	delta   bool
	// setsVersion counts the changes of the live sets' list; interest
	// is built from the version interestVersion (interest.go).
	setsVersion, interestVersion uint64
	interest                     *Interest

	chains, nextChains     map[*api.WorkloadEndpoint]*epChains
	policies, nextPolicies map[policyRef]*policyEntry
	// The maps of the pass before the last, kept to be refilled.
	spareChains   map[*api.WorkloadEndpoint]*epChains
	sparePolicies map[policyRef]*policyEntry
	sets          map[string]*liveSet

	// The ordered policies of the last pass, and whether this pass has
	// the same ones (globals; namespaced by namespace).
	gnps        []*api.GlobalNetworkPolicy
	sgnps       []*api.GlobalNetworkPolicy // staged, as asGlobal made them
	nps         map[string][]*api.NetworkPolicy
	globalsSame bool
	nsChanged   map[string]bool
	emitted     map[policyRef]bool // policy chains this pass emitted for cached endpoints
	// staged maps each staged policy to the GlobalNetworkPolicy standing
	// for it (tiers.go), so that its identity, the cache's key, lasts.
	staged map[*api.StagedGlobalNetworkPolicy]*api.GlobalNetworkPolicy
	// The guards' chains and sets, which depend on the input's other
	// fields only (reset with them).
	guard  *guardEntry
	tunnel *guardEntry
	// hostChains are the last pass's host endpoint chains (host.go).
	hostChains map[string]Chain
	// nsLabels shares the endpoints' namespace labels (nslabels.go).
	nsLabels nsLabelTable
}

// NewCompiler returns a Compiler with nothing cached.
func NewCompiler() *Compiler { return &Compiler{} }

// Compile returns what the package's Compile returns for in.
func (cc *Compiler) Compile(in Input) *Ruleset { return compile(in, cc) }

// policyRef is a policy and direction whose chain an endpoint uses.
type policyRef struct {
	g   *api.GlobalNetworkPolicy
	np  *api.NetworkPolicy
	dir direction
}

type epChains struct {
	fw, tw Chain
	extra  []Chain
	refs   []policyRef
}

type policyEntry struct {
	chain    Chain
	warnings []string
}

// setDef says what a live set holds: the addresses (or, named, the named
// port's triples) of the endpoints sel picks; fixed sets (address blocks)
// depend on no endpoint.
type setDef struct {
	fixed       bool
	sel         selection
	fam         Family
	named       bool
	proto, port string
}

// liveSet is a set kept up to date across passes by counting what each
// endpoint contributes.
type liveSet struct {
	def   setDef
	set   *Set
	addrs addrCounts
	ports map[AddrPort]int
	// What this pass's changes touched: addresses that came or went, and
	// whether a named port member did.
	touched []netip.Addr
	flipped bool
}

func (cc *Compiler) begin(c *compiler) {
	if cc == nil {
		return
	}
	other := c.in
	other.Endpoints, other.Remote, other.NetworkPolicies, other.GlobalPolicies, other.Pools, other.StagedPolicies = nil, nil, nil, nil, nil, nil
	if !cc.started || !reflect.DeepEqual(other, cc.other) {
		// The parsed endpoints and the sets of their addresses depend on
		// the node's name only: keep them for another change.
		keep := *cc
		*cc = Compiler{started: true, other: other, names: map[chainKey]string{},
			eps: map[*api.WorkloadEndpoint]*epEntry{}, local: map[*api.WorkloadEndpoint]*epEntry{}, warned: map[*api.WorkloadEndpoint][]string{},
			remote: map[*api.RemoteEndpoint]*epEntry{}, warnedRemote: map[*api.RemoteEndpoint][]string{},
			chains: map[*api.WorkloadEndpoint]*epChains{}, policies: map[policyRef]*policyEntry{}, sets: map[string]*liveSet{},
			staged: map[*api.StagedGlobalNetworkPolicy]*api.GlobalNetworkPolicy{}, setsVersion: keep.setsVersion + 1,
			nsLabels: keep.nsLabels}
		if keep.started && keep.other.Node == other.Node {
			cc.eps, cc.local, cc.warned, cc.pass = keep.eps, keep.local, keep.warned, keep.pass
			cc.remote, cc.warnedRemote = keep.remote, keep.warnedRemote
			cc.sortedLocal, cc.localWarnings, cc.localDirty = keep.sortedLocal, keep.localWarnings, keep.localDirty
			for name, s := range keep.sets {
				if !s.def.fixed {
					cc.sets[name] = s
				}
			}
		}
		cc.changes, cc.delta = keep.changes, keep.delta
	}
	c.names = cc.names
	// The maps of the pass before last are emptied and refilled: a pass
	// that changes little then allocates little.
	cc.nextChains = reuseMap(cc.spareChains, len(cc.chains))
	cc.nextPolicies = reuseMap(cc.sparePolicies, len(cc.policies))
	cc.spareChains, cc.sparePolicies = nil, nil
	cc.added, cc.removed = cc.added[:0], cc.removed[:0]
	cc.emitted = reuseMap(cc.emitted, 0)
}

// reuseMap returns m emptied, or a new map for n entries when m is nil.
func reuseMap[K comparable, V any](m map[K]V, n int) map[K]V {
	if m == nil {
		return make(map[K]V, n)
	}
	clear(m)
	return m
}

// prepare runs once the endpoints are parsed and the policies ordered: it
// updates the live sets with the endpoints that came and went, and notes
// which endpoints' policies are unchanged.
func (cc *Compiler) prepare(c *compiler) {
	if cc == nil {
		return
	}
	for _, s := range cc.sets {
		s.update(cc.removed, cc.added)
	}
	cc.globalsSame = slices.Equal(cc.gnps, c.gnps) && slices.Equal(cc.sgnps, c.sgnps)
	nps := c.npsByNs
	cc.nsChanged = map[string]bool{}
	for ns, ps := range nps {
		if !slices.Equal(ps, cc.nps[ns]) {
			cc.nsChanged[ns] = true
		}
	}
	for ns := range cc.nps {
		if _, ok := nps[ns]; !ok {
			cc.nsChanged[ns] = true
		}
	}
	cc.gnps, cc.sgnps, cc.nps = c.gnps, c.sgnps, nps
}

// end keeps what this pass used for the next one.
func (cc *Compiler) end(c *compiler) {
	if cc == nil {
		return
	}
	cc.spareChains, cc.chains, cc.nextChains = cc.chains, cc.nextChains, nil
	cc.sparePolicies, cc.policies, cc.nextPolicies = cc.policies, cc.nextPolicies, nil
	n := len(cc.sets)
	maps.DeleteFunc(cc.sets, func(name string, s *liveSet) bool { return c.sets[name] != s.set })
	if len(cc.sets) != n {
		cc.setsVersion++
	}
	maps.DeleteFunc(cc.staged, func(_ *api.StagedGlobalNetworkPolicy, g *api.GlobalNetworkPolicy) bool { return !c.staged[g] })
	cc.added, cc.removed = cc.added[:0], cc.removed[:0]
}

// endpointChains returns a local endpoint's chains, from the cache when
// neither the endpoint nor any policy that may select it changed.
func (c *compiler) endpointChains(ep *endpoint) (fw, tw Chain, extra []Chain) {
	cc := c.cache
	if cc == nil {
		fw, extra = c.fromWorkloadChain(ep)
		tw, twExtra := c.toWorkloadChain(ep)
		return fw, tw, append(extra, twExtra...)
	}
	e := cc.chains[ep.wep]
	if e != nil && cc.globalsSame && !cc.nsChanged[ep.namespace] {
		// Emit the policy chains it uses, in the order a fresh pass
		// would (their warnings come in that order).
		for _, r := range e.refs {
			if cc.emitted[r] {
				continue
			}
			cc.emitted[r] = true
			if r.g != nil {
				c.globalPolicyChain(r.g, r.dir)
			} else {
				c.networkPolicyChain(r.np, r.dir)
			}
		}
		cc.nextChains[ep.wep] = e
		return e.fw, e.tw, e.extra
	}
	var refs []policyRef
	c.refs = &refs
	fw, extra = c.fromWorkloadChain(ep)
	tw, twExtra := c.toWorkloadChain(ep)
	extra = append(extra, twExtra...)
	c.refs = nil
	if e != nil && fw.Equal(e.fw) && tw.Equal(e.tw) && slices.EqualFunc(extra, e.extra, Chain.Equal) {
		// A policy of its namespace changed, but not its chains: keep
		// sharing them, so that consumers skip them by identity.
		fw, tw, extra = e.fw, e.tw, e.extra
	}
	cc.nextChains[ep.wep] = &epChains{fw: fw, tw: tw, extra: extra, refs: refs}
	return fw, tw, extra
}

// policyChain emits a policy's cached chain, and the sets its rules use,
// when the policy did not change; it reports whether it did.
func (cc *Compiler) policyChain(c *compiler, ref policyRef, name string) bool {
	if cc == nil {
		return false
	}
	e := cc.nextPolicies[ref]
	if e == nil {
		e = cc.policies[ref]
	}
	if e == nil || e.chain.Name != name {
		return false
	}
	for _, r := range e.chain.Rules {
		for _, m := range r.Match {
			if m.Set == "" || c.sets[m.Set] != nil {
				continue
			}
			s := cc.sets[m.Set]
			if s == nil {
				return false
			}
			c.sets[m.Set] = s.set
		}
	}
	c.chains[name] = e.chain
	c.warnings = append(c.warnings, e.warnings...)
	cc.nextPolicies[ref] = e
	return true
}

func (cc *Compiler) storePolicyChain(ref policyRef, ch Chain, warnings []string) {
	if cc == nil {
		return
	}
	cc.nextPolicies[ref] = &policyEntry{chain: ch, warnings: slices.Clone(warnings)}
}

// liveSet registers the set name defined by def in c.sets, kept from the
// last pass or computed from every endpoint, and keeps it live. It reports
// false when there is no cache, or for a fixed set not yet computed (the
// caller computes it and calls storeFixedSet).
func (cc *Compiler) liveSet(c *compiler, name string, def setDef) bool {
	if cc == nil {
		return false
	}
	if s := cc.sets[name]; s != nil {
		c.sets[name] = s.set
		return true
	}
	if def.fixed {
		return false
	}
	s := &liveSet{def: def, ports: map[AddrPort]int{}}
	for _, e := range cc.eps { // an object listed twice counts once, as the changes see it
		s.count(e.ep(), 1)
	}
	for _, e := range cc.remote {
		s.count(e.ep(), 1)
	}
	s.build(name)
	s.touched, s.flipped = nil, false
	cc.sets[name] = s
	cc.setsVersion++
	c.sets[name] = s.set
	return true
}

func (cc *Compiler) storeFixedSet(s *Set) {
	if cc == nil {
		return
	}
	cc.sets[s.Name] = &liveSet{def: setDef{fixed: true}, set: s}
	cc.setsVersion++
}

// count adds (n = 1) or removes (n = -1) what ep contributes to the set,
// noting the members that came or went.
func (s *liveSet) count(ep *endpoint, n int) {
	if !s.def.sel.matches(ep) {
		return
	}
	if s.def.named {
		for _, m := range namedPortMembers(ep, s.def.fam, s.def.proto, s.def.port) {
			s.ports[m] += n
			switch s.ports[m] {
			case 0:
				delete(s.ports, m)
				s.flipped = true
			case n:
				s.flipped = true
			}
		}
		return
	}
	for _, a := range ep.addrs {
		if FamilyOf(a) != s.def.fam {
			continue
		}
		switch s.addrs.add(a, n) {
		case 0, n:
			s.touched = append(s.touched, a)
		}
	}
}

func (s *liveSet) update(removed []*endpoint, added []*epEntry) {
	if s.def.fixed {
		return
	}
	for _, ep := range removed {
		s.count(ep, -1)
	}
	for _, e := range added {
		s.count(e.ep(), 1)
	}
	switch {
	case s.def.named && s.flipped:
		s.build(s.set.Name)
	case len(s.touched) > 0:
		s.merge()
	}
	s.touched, s.flipped = s.touched[:0], false
}

// merge makes the set anew from the last one and the members that came
// or went (touched): a copy, not a sort. When no member came or went for
// good, the set stays the same object.
func (s *liveSet) merge() {
	slices.SortFunc(s.touched, netip.Addr.Compare)
	touched := slices.Compact(s.touched)
	old := s.set.Nets
	nets := make([]netip.Prefix, 0, len(old)+len(touched))
	i, changed := 0, false
	for _, a := range touched {
		p := netip.PrefixFrom(a, s.def.fam.Bits())
		j, found := slices.BinarySearchFunc(old[i:], p, netip.Prefix.Compare)
		nets = append(nets, old[i:i+j]...)
		i += j
		if found {
			i++
		}
		in := s.addrs.count(a) > 0
		if in {
			nets = append(nets, p)
		}
		changed = changed || found != in
	}
	if !changed {
		return
	}
	nets = append(nets, old[i:]...)
	if len(nets) == 0 {
		nets = nil // as addNetSet leaves it
	}
	s.set = &Set{Name: s.set.Name, Type: SetTypeNet, Family: s.def.fam, Nets: nets}
}

// build makes the set's members canonical, as addNetSet and namedPortSet
// do: sorted and unique.
func (s *liveSet) build(name string) {
	if s.def.named {
		s.set = &Set{Name: name, Type: SetTypeAddrPort, Family: s.def.fam, AddrPorts: slices.SortedFunc(maps.Keys(s.ports), AddrPort.Compare)}
		return
	}
	var nets []netip.Prefix // nil when empty, as addNetSet leaves it
	for _, a := range s.addrs.sorted() {
		nets = append(nets, netip.PrefixFrom(a, s.def.fam.Bits()))
	}
	s.set = &Set{Name: name, Type: SetTypeNet, Family: s.def.fam, Nets: nets}
}

// guardEntry is a guard's output: chains, jumps and sets.
type guardEntry struct {
	chains []Chain
	jumps  []Jump
	sets   []*Set
}

// guarded returns what make returns, from the last pass when the guards
// did not change (they are part of the input's other fields); names are
// the sets make adds.
func (cc *Compiler) guarded(c *compiler, e **guardEntry, names []string, make func() ([]Chain, []Jump)) ([]Chain, []Jump) {
	if cc == nil {
		return make()
	}
	if *e == nil {
		chains, jumps := make()
		g := &guardEntry{chains: chains, jumps: jumps}
		for _, n := range names {
			if s := c.sets[n]; s != nil {
				g.sets = append(g.sets, s)
			}
		}
		*e = g
	}
	for _, s := range (*e).sets {
		c.sets[s.Name] = s
	}
	return (*e).chains, slices.Clone((*e).jumps)
}

// nodeGuard is c.nodeGuardChain, kept while the guard does not change.
func (cc *Compiler) nodeGuard(c *compiler) Chain {
	var names []string
	for _, f := range Families {
		n, p := nodeGuardSetNames(f)
		names = append(names, n, p)
	}
	var e **guardEntry
	if cc != nil {
		e = &cc.guard
	}
	chains, _ := cc.guarded(c, e, names, func() ([]Chain, []Jump) { return []Chain{c.nodeGuardChain()}, nil })
	return chains[0]
}

// tunnelGuard is c.tunnelGuard, kept while the guard does not change.
func (cc *Compiler) tunnelGuard(c *compiler) ([]Chain, []Jump) {
	var names []string
	for _, f := range Families {
		names = append(names, tunnelSetName(f))
	}
	var e **guardEntry
	if cc != nil {
		e = &cc.tunnel
	}
	return cc.guarded(c, e, names, c.tunnelGuard)
}
