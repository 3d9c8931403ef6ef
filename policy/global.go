package policy

import (
	"net/netip"
	"strings"

	"github.com/tabbynet/tabby/api"
)

// globalPolicyChain emits (once) and names the chain of a global policy for
// one direction. Rules run in order: Allow sets the accept mark and returns
// at once, Deny drops; a packet no rule matches falls through to the next
// policy.
func (c *compiler) globalPolicyChain(g *api.GlobalNetworkPolicy, dir direction) string {
	id := "gnp/" + g.Metadata.Name
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
		var action Verdict
		switch r.Action {
		case api.ActionAllow:
			action = actionAllow
		case api.ActionDeny:
			action = actionDrop
		default:
			c.warnf("%s: rule %d: action %q is not Allow or Deny: skipped", id, i, r.Action)
			continue
		}
		proto := ""
		if r.Protocol != nil {
			proto = strings.ToLower(*r.Protocol)
		}
		if proto == "" && (len(r.Source.Ports) > 0 || len(r.Destination.Ports) > 0) {
			c.warnf("%s: rule %d: ports without a protocol: skipped", id, i)
			continue
		}
		var base []Match
		if proto != "" {
			base = []Match{protoMatch(proto)}
		}
		src, srcOK := c.entityMatch(id, i, r.Source, false)
		dst, dstOK := c.entityMatch(id, i, r.Destination, true)
		if !srcOK || !dstOK {
			continue
		}
		base = append(base, src...)
		base = append(base, dst...)
		srcPorts := c.entityPorts(r.Source, proto, false)
		dstPorts := c.entityPorts(r.Destination, proto, true)
		for _, sp := range srcPorts {
			for _, dp := range dstPorts {
				m := append([]Match{}, base...)
				m = append(m, sp...)
				m = append(m, dp...)
				ch.Rules = append(ch.Rules, Rule{Match: m, Verdict: action})
			}
		}
		if r.Action == api.ActionAllow {
			ch.Rules = append(ch.Rules, ruleReturnIfOK)
		}
	}
	c.chains[name] = ch
	c.cache.storePolicyChain(ref, ch, c.warnings[w0:])
	return name
}

// entityMatch matches the endpoints (selector, namespaceSelector) and
// addresses (nets, notNets) of a rule's source or (dst) destination. ok is
// false when the entity cannot be compiled.
func (c *compiler) entityMatch(id string, rule int, e api.EntityRule, dst bool) ([]Match, bool) {
	var args []Match
	if sel, ok := entitySelection(e); ok {
		args = append(args, setMatch(c.selectorSet(sel), dst, false))
	}
	nets, ok := c.parseNets(id, rule, e.Nets)
	if !ok {
		return nil, false
	}
	if len(nets) > 0 {
		args = append(args, setMatch(c.netSet(nets, nil), dst, false))
	}
	notNets, ok := c.parseNets(id, rule, e.NotNets)
	if !ok {
		return nil, false
	}
	if len(notNets) > 0 {
		args = append(args, setMatch(c.netSet(notNets, nil), dst, true))
	}
	return args, true
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
		if err != nil || !p.Addr().Is4() {
			// Skipping one net would widen or narrow the rule silently.
			c.warnf("%s: rule %d: %q is not an IPv4 CIDR: rule skipped", id, rule, n)
			return nil, false
		}
		out = append(out, p)
	}
	return out, true
}

// entityPorts returns the port alternatives of an entity: numbers and
// "lo:hi" ranges in multiport matches, named ports through the named-port
// set of the entity's endpoints. No ports: one empty alternative.
func (c *compiler) entityPorts(e api.EntityRule, proto string, dst bool) [][]Match {
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
		set := c.namedPortSet(sel, proto, p.StrVal)
		out = append(out, []Match{addrPortSetMatch(set, dst)})
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
