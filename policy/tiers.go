package policy

import (
	"cmp"
	"slices"
	"strconv"

	"github.com/tabbynet/tabby/api"
)

// This file compiles tiers (docs/policy.md, "Tiers and staged policies").
//
// An endpoint chain evaluates, after conntrack, the tiers that have at
// least one policy selecting the endpoint in that direction, in tier
// order. Within a tier the global policies come in order and, in tier
// default, the endpoint's Kubernetes NetworkPolicies after them (as before
// tiers: a GlobalNetworkPolicy Deny of tier default beats a NetworkPolicy
// Allow). A policy's Allow sets MarkAccept and the endpoint chain returns
// (allowed); Deny drops; Pass sets MarkPass and the rest of the tier is
// skipped. A packet reaching the end of a tier meets the tier's default
// action: Deny drops, Pass goes on to the next tier. A packet that leaves
// the last tier is allowed (no tier decided).
//
// Every tier but the endpoint's last is a chain of its own,
// "tabby-t<i|o><k>-<iface>", that the endpoint chain jumps to, so that
// "skip the rest of the tier" is a return. The last one is inline: with
// only tier default (every cluster without tiers) the endpoint chain is
// exactly what it was before tiers.
//
// Staged policies come first, each a chain whose rules all return: the
// first rule that matches counts the packet under its Origin (Staged) and
// nothing else happens.

// orderGlobals sorts the enforced and the staged global policies by tier,
// order and name, leaving out (with a warning) those of a tier that does
// not exist.
func (c *compiler) orderGlobals() {
	c.tiers = c.in.Tiers
	if c.tiers == nil {
		c.tiers = api.EffectiveTiers(nil)
	}
	c.tierIdx = make(map[string]int, len(c.tiers))
	for i, t := range c.tiers {
		c.tierIdx[t.Metadata.Name] = i
	}
	keep := func(g *api.GlobalNetworkPolicy, kind string) bool {
		if _, ok := c.tierIdx[g.TierName()]; !ok {
			c.warnf("%s %s: tier %q does not exist: policy ignored", kind, g.Metadata.Name, g.TierName())
			return false
		}
		return true
	}
	for _, g := range c.in.GlobalPolicies {
		if g != nil && keep(g, api.KindGlobalNetworkPolicy) {
			c.gnps = append(c.gnps, g)
		}
	}
	c.staged = map[*api.GlobalNetworkPolicy]bool{}
	for _, s := range c.in.StagedPolicies {
		if s == nil {
			continue
		}
		g := c.cache.asGlobal(s)
		if keep(g, api.KindStagedGlobalNetworkPolicy) {
			c.sgnps = append(c.sgnps, g)
			c.staged[g] = true
		}
	}
	byTier := func(x, y *api.GlobalNetworkPolicy) int {
		if r := cmp.Compare(c.tierIdx[x.TierName()], c.tierIdx[y.TierName()]); r != 0 {
			return r
		}
		switch {
		case x.Spec.Order == nil && y.Spec.Order != nil:
			return 1
		case x.Spec.Order != nil && y.Spec.Order == nil:
			return -1
		case x.Spec.Order != nil && y.Spec.Order != nil:
			if r := cmp.Compare(*x.Spec.Order, *y.Spec.Order); r != 0 {
				return r
			}
		}
		return cmp.Compare(x.Metadata.Name, y.Metadata.Name)
	}
	slices.SortStableFunc(c.gnps, byTier)
	slices.SortStableFunc(c.sgnps, byTier)
}

// asGlobal is the staged policy as a GlobalNetworkPolicy, the same object
// from pass to pass while s is.
func (cc *Compiler) asGlobal(s *api.StagedGlobalNetworkPolicy) *api.GlobalNetworkPolicy {
	if cc == nil {
		return s.AsGlobal()
	}
	if g := cc.staged[s]; g != nil {
		return g
	}
	g := s.AsGlobal()
	cc.staged[s] = g
	return g
}

// tierPlan is what one tier does to an endpoint in a direction: the
// chains of its policies that select it.
type tierPlan struct {
	tier       *api.Tier
	global     []planned
	namespaced []string
	pass       bool // some policy of it may Pass
}

type planned struct {
	chain string
	pass  bool
}

// selects reports whether the global policy g selects workload ep in dir.
func selects(g *api.GlobalNetworkPolicy, ep *endpoint, dir direction) bool {
	in, eg := g.AppliesTo()
	if (dir == ingress && !in) || (dir == egress && !eg) || g.Spec.PreDNAT || g.Spec.DoNotTrack {
		return false // preDNAT policy is for host endpoints only
	}
	if g.Spec.Selector != nil && !g.Spec.Selector.Matches(ep.labels) {
		return false
	}
	return g.Spec.NamespaceSelector == nil || g.Spec.NamespaceSelector.Matches(ep.nsLabels)
}

// policiesFor returns the tiers whose policies select ep in dir, in
// order, and the chains of the staged policies that do. It emits each
// policy chain the first time it is needed.
func (c *compiler) policiesFor(ep *endpoint, dir direction) (plans []tierPlan, staged []string) {
	for _, g := range c.sgnps {
		if selects(g, ep, dir) {
			staged = append(staged, c.globalPolicyChain(g, dir))
			c.ref(policyRef{g: g, dir: dir})
		}
	}
	plan := func(name string) *tierPlan {
		if n := len(plans); n > 0 && plans[n-1].tier.Metadata.Name == name {
			return &plans[n-1]
		}
		plans = append(plans, tierPlan{tier: c.tiers[c.tierIdx[name]]})
		return &plans[len(plans)-1]
	}
	npsDone := false
	addNPs := func() {
		npsDone = true
		var chains []string
		for _, p := range c.npsByNs[ep.namespace] {
			in, eg := p.AppliesTo()
			if (dir == ingress && !in) || (dir == egress && !eg) || !p.Spec.PodSelector.Matches(ep.labels) {
				continue
			}
			chains = append(chains, c.networkPolicyChain(p, dir))
			c.ref(policyRef{np: p, dir: dir})
		}
		if len(chains) > 0 {
			p := plan(api.TierDefault)
			p.namespaced = chains
		}
	}
	defaultIdx := c.tierIdx[api.TierDefault]
	for _, g := range c.gnps {
		if !npsDone && c.tierIdx[g.TierName()] > defaultIdx {
			addNPs()
		}
		if !selects(g, ep, dir) {
			continue
		}
		pass := g.Spec.HasPass()
		p := plan(g.TierName())
		p.global = append(p.global, planned{c.globalPolicyChain(g, dir), pass})
		p.pass = p.pass || pass
		c.ref(policyRef{g: g, dir: dir})
	}
	if !npsDone {
		addNPs()
	}
	return plans, staged
}

func (c *compiler) ref(r policyRef) {
	if c.refs != nil {
		*c.refs = append(*c.refs, r)
	}
}

var (
	ruleReturnIfPass = Rule{Match: []Match{{Kind: MatchMark, Mark: MarkPass, Mask: MarkPass}}, Verdict: Verdict{Kind: VerdictReturn}}
	ruleClearPass    = Rule{Verdict: Verdict{Kind: VerdictSetMark, Mark: 0, Mask: MarkPass}}
	actionPass       = Verdict{Kind: VerdictSetMark, Mark: MarkPass, Mask: MarkPass}
)

// tieredRules are the policy rules of ep's chain in dir, and the tier
// chains they jump to. Without any selecting policy the chain falls
// through (default allow).
func (c *compiler) tieredRules(ep *endpoint, dir direction) ([]Rule, []Chain) {
	plans, staged := c.policiesFor(ep, dir)
	var rules []Rule
	for _, s := range staged {
		rules = append(rules, jumpTo(s))
	}
	if len(plans) == 0 {
		return rules, nil
	}
	clear := ruleClearMark
	for _, p := range plans {
		if p.pass {
			clear.Verdict.Mask |= MarkPass
		}
	}
	rules = append(rules, clear)
	var extra []Chain
	d := "i"
	if dir == egress {
		d = "o"
	}
	for k, p := range plans {
		body := tierBody(p, dir)
		if k == len(plans)-1 {
			rules = append(rules, body...)
			break
		}
		name := Prefix + "t" + d + strconv.Itoa(k) + "-" + ep.iface()
		extra = append(extra, Chain{Table: TableFilter, Name: name, Rules: body})
		rules = append(rules, jumpTo(name), ruleReturnIfOK)
		if p.pass {
			rules = append(rules, ruleClearPass)
		}
	}
	return rules, extra
}

// tierBody evaluates one tier's policies: the first Allow returns with
// MarkAccept, a Pass returns with MarkPass, and the end applies the tier's
// default action (Deny: drop; Pass: nothing, the caller goes on).
func tierBody(p tierPlan, dir direction) []Rule {
	var rules []Rule
	for _, g := range p.global {
		rules = append(rules, jumpTo(g.chain), ruleReturnIfOK)
		if g.pass {
			rules = append(rules, ruleReturnIfPass)
		}
	}
	for _, n := range p.namespaced {
		rules = append(rules, jumpTo(n))
	}
	if len(p.namespaced) > 0 {
		rules = append(rules, ruleReturnIfOK)
	}
	if p.tier.DefaultAction() == api.ActionDeny {
		o := defaultDeny(dir)
		o.Tier = p.tier.Metadata.Name
		rules = append(rules, withOrigin(ruleDrop, o))
	}
	return rules
}
