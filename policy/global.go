package policy

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/tabbynet/tabby/api"
)

// globalPolicyChain emits (once) and names the chain of a global policy for
// one direction. Rules run in order: Allow sets the accept mark and returns
// at once, Deny drops; a packet no rule matches falls through to the next
// policy.
//
// A staged policy's chain (tiers.go) has the same matches, but every rule
// returns: it counts under its Origin and decides nothing.
func (c *compiler) globalPolicyChain(g *api.GlobalNetworkPolicy, dir direction) string {
	staged := c.staged[g]
	id, kind := "gnp/"+g.Metadata.Name, OriginGlobal
	if staged {
		id, kind = "sgnp/"+g.Metadata.Name, OriginStagedGlobal
	}
	name := c.policyChainName(id, dir)
	if _, ok := c.chains[name]; ok {
		return name
	}
	ref := policyRef{g: g, dir: dir}
	if c.cache.policyChain(c, ref, name) {
		return name
	}
	w0 := len(c.warnings)
	rules := g.Spec.Ingress
	if dir == egress {
		rules = g.Spec.Egress
	}
	ch := Chain{Table: TableFilter, Name: name}
	for i, r := range rules {
		origin := &Origin{Tier: g.TierName(), Kind: kind, Name: g.Metadata.Name, Direction: dir.String(), Index: i, Action: r.Action, Staged: staged}
		var action Verdict
		switch r.Action {
		case api.ActionAllow:
			action = actionAllow
		case api.ActionDeny:
			action = actionDrop
		case api.ActionPass:
			action = actionPass
		default:
			c.warnf("%s: rule %d: action %q is not Allow, Deny or Pass: skipped", id, i, r.Action)
			continue
		}
		if staged {
			action = Verdict{Kind: VerdictReturn}
		}
		rs, ok := c.globalRuleMatches(id, i, r, action, origin)
		if !ok {
			continue
		}
		ch.Rules = append(ch.Rules, rs...)
		switch {
		case staged:
		case r.Action == api.ActionAllow:
			ch.Rules = append(ch.Rules, ruleReturnIfOK)
		case r.Action == api.ActionPass:
			ch.Rules = append(ch.Rules, ruleReturnIfPass)
		}
	}
	c.chains[name] = ch
	c.cache.storePolicyChain(ref, ch, c.warnings[w0:])
	return name
}

// globalRuleMatches compiles rule i of policy id into one rule per
// combination of family and ports, each with the given verdict and origin.
// It returns false, after a warning, for a rule it skips; a rule whose nets
// are all of one family yields no rule in the other, and true.
func (c *compiler) globalRuleMatches(id string, i int, r api.Rule, action Verdict, origin *Origin) ([]Rule, bool) {
	var out []Rule
	proto := ""
	if r.Protocol != nil {
		proto = strings.ToLower(*r.Protocol)
	}
	if proto == "" && (len(r.Source.Ports) > 0 || len(r.Destination.Ports) > 0) {
		c.warnf("%s: rule %d: ports without a protocol: skipped", id, i)
		return nil, false
	}
	var nets [4][]netip.Prefix // source nets, notNets, destination nets, notNets
	ok := true
	for k, l := range [][]string{r.Source.Nets, r.Source.NotNets, r.Destination.Nets, r.Destination.NotNets} {
		if nets[k], ok = c.parseNets(id, i, l); !ok {
			break
		}
	}
	if !ok {
		return nil, false
	}
	srcNets, srcNot, dstNets, dstNot := nets[0], nets[1], nets[2], nets[3]
	// A rule about addresses is one rule per family, each with the
	// sets of its family; any other rule matches both families.
	fams := []Family{0}
	if addressed(r.Source) || addressed(r.Destination) {
		fams = Families
	}
	switch proto { // ICMP is IPv4's, ICMPv6 IPv6's
	case "icmp":
		fams = []Family{IPv4}
	case "icmpv6":
		fams = []Family{IPv6}
	}
	for _, f := range fams {
		var base []Match
		if proto != "" {
			base = []Match{protoMatch(proto)}
		}
		if f != 0 && ((len(srcNets) > 0 && len(ofFamily(srcNets, f)) == 0) || (len(dstNets) > 0 && len(ofFamily(dstNets, f)) == 0)) {
			// Nets only of the other family: the rule matches no
			// packet of this one. (Checked before any set is made:
			// every set Compile emits is used by a rule.)
			continue
		}
		src := c.entityMatch(r.Source, srcNets, srcNot, f, false)
		dst := c.entityMatch(r.Destination, dstNets, dstNot, f, true)
		base = append(base, src...)
		base = append(base, dst...)
		srcPorts := c.entityPorts(r.Source, proto, f, false)
		dstPorts := c.entityPorts(r.Destination, proto, f, true)
		for _, sp := range srcPorts {
			for _, dp := range dstPorts {
				m := append([]Match{}, base...)
				m = append(m, sp...)
				m = append(m, dp...)
				out = append(out, Rule{Match: withFamily(f, m), Verdict: action, Origin: origin})
			}
		}
	}
	return out, true
}

// entityMatch matches the endpoints (selector, namespaceSelector) and
// addresses (nets, notNets, parsed) of a rule's source or (dst)
// destination, with the sets of family f (0: the entity has no address
// term). The caller made sure nets has some of family f, if any.
func (c *compiler) entityMatch(e api.EntityRule, nets, notNets []netip.Prefix, f Family, dst bool) []Match {
	var args []Match
	if sel, ok := entitySelection(e); ok {
		args = append(args, setMatch(c.selectorSet(sel, f), f, dst, false))
	}
	if of := ofFamily(nets, f); len(of) > 0 {
		args = append(args, setMatch(c.netSet(f, of, nil), f, dst, false))
	}
	if of := ofFamily(notNets, f); len(of) > 0 {
		args = append(args, setMatch(c.netSet(f, of, nil), f, dst, true))
	}
	return args
}

// addressed reports whether an entity matches addresses (selectors, nets,
// notNets, named ports), which makes its rule one rule per family.
func addressed(e api.EntityRule) bool {
	if _, ok := entitySelection(e); ok || len(e.Nets) > 0 || len(e.NotNets) > 0 {
		return true
	}
	for _, p := range e.Ports {
		if _, _, ok := parseRange(p.StrVal); p.IsString && !ok {
			return true
		}
	}
	return false
}

// ofFamily are the prefixes of family f.
func ofFamily(nets []netip.Prefix, f Family) []netip.Prefix {
	var out []netip.Prefix
	for _, n := range nets {
		if FamilyOf(n.Addr()) == f {
			out = append(out, n)
		}
	}
	return out
}

// withFamily restricts a rule of family f whose terms do not already
// restrict it (a rule made only of notNets of the other family, of
// protocol and ports) to f, so that it does not match the other family's
// packets too.
func withFamily(f Family, m []Match) []Match {
	if f == 0 || slices.ContainsFunc(m, func(x Match) bool { return x.AddrFamily() != 0 }) {
		return m
	}
	return append([]Match{familyMatch(f)}, m...)
}

// entitySelection is the endpoints an entity's selectors pick; ok is false
// when it has none (it then matches any address).
func entitySelection(e api.EntityRule) (selection, bool) {
	if e.Selector == nil && e.NamespaceSelector == nil {
		return selection{}, false
	}
	return selection{pods: e.Selector, namespaces: e.NamespaceSelector}, true
}

func (c *compiler) parseNets(id string, rule int, nets []string) ([]netip.Prefix, bool) {
	var out []netip.Prefix
	for _, n := range nets {
		p, err := netip.ParsePrefix(n)
		if err != nil || p.Addr().Is4In6() {
			// Skipping one net would widen or narrow the rule silently.
			c.warnf("%s: rule %d: %q is not a CIDR: rule skipped", id, rule, n)
			return nil, false
		}
		out = append(out, p)
	}
	return out, true
}

// entityPorts returns the port alternatives of an entity: numbers and
// "lo:hi" ranges in multiport matches, named ports through the named-port
// set of the entity's endpoints. No ports: one empty alternative.
func (c *compiler) entityPorts(e api.EntityRule, proto string, f Family, dst bool) [][]Match {
	if len(e.Ports) == 0 {
		return [][]Match{nil}
	}
	var specs []portSpec
	var out [][]Match
	for _, p := range e.Ports {
		if !p.IsString {
			specs = append(specs, portSpec{proto, int(p.IntVal), int(p.IntVal)})
			continue
		}
		if lo, hi, ok := parseRange(p.StrVal); ok {
			specs = append(specs, portSpec{proto, lo, hi})
			continue
		}
		sel, _ := entitySelection(e)
		set := c.namedPortSet(sel, f, proto, p.StrVal)
		out = append(out, []Match{addrPortSetMatch(set, f, dst)})
	}
	var res [][]Match
	for _, m := range multiportMatches(specs, dst) {
		// The protocol is already matched by the rule.
		res = append(res, m.match[1:])
	}
	return append(res, out...)
}

// parseRange is a valid "lo:hi" port range. Anything else, an invalid
// range included (validation refuses those), is taken for a named port,
// which no endpoint defines: the alternative matches nothing rather than
// every port.
func parseRange(s string) (lo, hi int, ok bool) {
	lo, hi, ok = api.ParsePortRange(s)
	if !ok || lo < 1 || hi > 65535 || lo > hi {
		return 0, 0, false
	}
	return lo, hi, true
}
