package policy

import (
	"net/netip"
	"strconv"
	"strings"

	"github.com/tabbynet/tabby/api"
)

// globalPolicyChain emits (once) and names the chain of a global policy for
// one direction. Rules run in order: Allow sets the accept mark and returns
// at once, Deny drops; a packet no rule matches falls through to the next
// policy.
func (c *compiler) globalPolicyChain(g *api.GlobalNetworkPolicy, dir direction) string {
	id := "gnp/" + g.Metadata.Name
	name := policyChainName(id, dir)
	if _, ok := c.chains[name]; ok {
		return name
	}
	rules := g.Spec.Ingress
	if dir == egress {
		rules = g.Spec.Egress
	}
	ch := Chain{Table: TableFilter, Name: name}
	for i, r := range rules {
		var action []string
		switch r.Action {
		case api.ActionAllow:
			action = actionAllow
		case api.ActionDeny:
			action = ruleDrop
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
		var base []string
		if proto != "" {
			base = []string{"-p", proto}
		}
		src, srcOK := c.entityMatch(id, i, r.Source, "src")
		dst, dstOK := c.entityMatch(id, i, r.Destination, "dst")
		if !srcOK || !dstOK {
			continue
		}
		base = append(base, src...)
		base = append(base, dst...)
		srcPorts := c.entityPorts(r.Source, proto, "src")
		dstPorts := c.entityPorts(r.Destination, proto, "dst")
		for _, sp := range srcPorts {
			for _, dp := range dstPorts {
				args := append([]string{}, base...)
				args = append(args, sp...)
				args = append(args, dp...)
				ch.Rules = append(ch.Rules, append(Rule(args), action...))
			}
		}
		if r.Action == api.ActionAllow {
			ch.Rules = append(ch.Rules, ruleReturnIfOK)
		}
	}
	c.chains[name] = ch
	return name
}

// entityMatch matches the endpoints (selector, namespaceSelector) and
// addresses (nets, notNets) of a rule's source or destination; flag is
// "src" or "dst". ok is false when the entity cannot be compiled.
func (c *compiler) entityMatch(id string, rule int, e api.EntityRule, flag string) ([]string, bool) {
	var args []string
	if sel, ok := entitySelection(e); ok {
		args = append(args, "-m", "set", "--match-set", c.selectorSet(sel), flag)
	}
	nets, ok := c.parseNets(id, rule, e.Nets)
	if !ok {
		return nil, false
	}
	if len(nets) > 0 {
		args = append(args, "-m", "set", "--match-set", c.netSet(nets, nil), flag)
	}
	notNets, ok := c.parseNets(id, rule, e.NotNets)
	if !ok {
		return nil, false
	}
	if len(notNets) > 0 {
		args = append(args, "-m", "set", "!", "--match-set", c.netSet(notNets, nil), flag)
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
func (c *compiler) entityPorts(e api.EntityRule, proto, flag string) [][]string {
	if len(e.Ports) == 0 {
		return [][]string{nil}
	}
	single, multi := "--sport", "--sports"
	if flag == "dst" {
		single, multi = "--dport", "--dports"
	}
	var specs []portSpec
	var out [][]string
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
		out = append(out, []string{"-m", "set", "--match-set", set, flag + "," + flag})
	}
	var res [][]string
	for _, m := range multiportMatches(specs, single, multi) {
		// The protocol is already matched by the rule.
		res = append(res, m.args[2:])
	}
	return append(res, out...)
}

func parseRange(s string) (lo, hi int, ok bool) {
	a, b, found := strings.Cut(s, ":")
	if !found {
		return 0, 0, false
	}
	lo, err1 := strconv.Atoi(a)
	hi, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil || lo < 1 || hi > 65535 || lo > hi {
		return 0, 0, false
	}
	return lo, hi, true
}
