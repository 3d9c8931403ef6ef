package policy

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/tabbynet/tabby/api"
)

// peerMatch is one alternative source (ingress) or destination (egress) of
// a NetworkPolicy rule.
type peerMatch struct {
	match []Match
	// sel is the endpoints the peer picks; nil for "any address" and for
	// ipBlocks, which match addresses rather than endpoints.
	sel *selection
	// family is the family match restricts packets to; 0 for "any
	// address". A selector is one peer per family (sets are typed).
	family Family
}

// portMatch is one alternative port of a rule.
type portMatch struct {
	proto string // lowercase; "" = any protocol
	match []Match
	named string // a named port, resolved by the caller per endpoint
}

// networkPolicyChain emits (once) and names the chain of a namespaced
// policy for one direction. Every rule that matches sets the accept mark:
// Kubernetes policies only allow, and a packet passes if any rule of any
// selecting policy allows it.
func (c *compiler) networkPolicyChain(p *api.NetworkPolicy, dir direction) string {
	ns := npNamespace(p)
	id := "np/" + ns + "/" + p.Metadata.Name
	name := c.policyChainName(id, dir)
	if _, ok := c.chains[name]; ok {
		return name
	}
	ref := policyRef{np: p, dir: dir}
	if c.cache.policyChain(c, ref, name) {
		return name
	}
	w0 := len(c.warnings)
	ch := Chain{Table: TableFilter, Name: name}
	// The policy's own endpoints: the destination of ingress traffic, whose
	// named ports ingress rules resolve.
	self := selection{namespace: ns, pods: &p.Spec.PodSelector}
	type npRule struct {
		peers []api.NetworkPolicyPeer
		ports []api.NetworkPolicyPort
	}
	var rules []npRule
	if dir == ingress {
		for _, r := range p.Spec.Ingress {
			rules = append(rules, npRule{r.From, r.Ports})
		}
	} else {
		for _, r := range p.Spec.Egress {
			rules = append(rules, npRule{r.To, r.Ports})
		}
	}
	for i, r := range rules {
		origin := &Origin{Tier: api.TierDefault, Kind: OriginNamespaced, Namespace: ns, Name: p.Metadata.Name, Direction: dir.String(), Index: i, Action: "Allow"}
		peers := c.npPeers(id, ns, r.peers, dir)
		ports := c.npPorts(id, i, r.ports)
		for _, peer := range peers {
			for _, port := range ports {
				m := append([]Match{}, peer.match...)
				m = append(m, port.match...)
				if port.named == "" {
					ch.Rules = append(ch.Rules, Rule{Match: m, Verdict: actionAllow, Origin: origin})
					continue
				}
				// The destination's port: the policy's own endpoints
				// for ingress, the peer's for egress (any endpoint when
				// the peer is an address block or anything), in a set
				// of the peer's family, or one per family for any peer.
				target := self
				if dir == egress {
					target = selection{}
					if peer.sel != nil {
						target = *peer.sel
					}
				}
				fams := Families
				if peer.family != 0 {
					fams = []Family{peer.family}
				}
				for _, f := range fams {
					set := c.namedPortSet(target, f, port.proto, port.named)
					ch.Rules = append(ch.Rules, Rule{Match: append(slices.Clone(m), addrPortSetMatch(set, f, true)), Verdict: actionAllow, Origin: origin})
				}
			}
		}
		if len(peers) > 0 && len(ports) > 0 {
			ch.Rules = append(ch.Rules, ruleReturnIfOK)
		}
	}
	c.chains[name] = ch
	c.cache.storePolicyChain(ref, ch, c.warnings[w0:])
	return name
}

// npPeers turns a rule's from/to list into matches; an empty list matches
// any address.
func (c *compiler) npPeers(id, ns string, peers []api.NetworkPolicyPeer, dir direction) []peerMatch {
	if len(peers) == 0 {
		return []peerMatch{{}}
	}
	dst := dir == egress
	var out []peerMatch
	for _, p := range peers {
		switch {
		case p.IPBlock != nil:
			cidr, err := netip.ParsePrefix(p.IPBlock.CIDR)
			if err != nil || cidr.Addr().Is4In6() {
				c.warnf("%s: ipBlock cidr %q is not a CIDR: peer skipped", id, p.IPBlock.CIDR)
				continue
			}
			f := FamilyOf(cidr.Addr())
			var except []netip.Prefix
			for _, e := range p.IPBlock.Except {
				ep, err := netip.ParsePrefix(e)
				if err != nil || FamilyOf(ep.Addr()) != f || ep.Addr().Is4In6() {
					c.warnf("%s: ipBlock except %q is not a CIDR of the block's family: ignored", id, e)
					continue
				}
				except = append(except, ep)
			}
			set := c.netSet(f, []netip.Prefix{cidr}, except)
			out = append(out, peerMatch{match: []Match{setMatch(set, f, dst, false)}, family: f})
		case p.PodSelector != nil || p.NamespaceSelector != nil:
			// podSelector alone: pods of the policy's namespace.
			// namespaceSelector (alone or with podSelector): pods in the
			// namespaces it picks, of any namespace.
			sel := selection{pods: p.PodSelector, namespaces: p.NamespaceSelector}
			if p.NamespaceSelector == nil {
				sel.namespace = ns
			}
			for _, f := range Families {
				set := c.selectorSet(sel, f)
				out = append(out, peerMatch{match: []Match{setMatch(set, f, dst, false)}, sel: &sel, family: f})
			}
		default:
			c.warnf("%s: a peer without podSelector, namespaceSelector or ipBlock: skipped", id)
		}
	}
	return out
}

// npPorts turns a rule's ports into matches; an empty list matches every
// port of every protocol. Numeric ports and endPort ranges of a protocol
// share multiport matches; each named port is a match of its own.
func (c *compiler) npPorts(id string, rule int, ports []api.NetworkPolicyPort) []portMatch {
	if len(ports) == 0 {
		return []portMatch{{}}
	}
	var specs []portSpec
	var out []portMatch
	for _, p := range ports {
		proto := api.ProtocolTCP
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		proto = strings.ToLower(proto)
		switch {
		case p.Port == nil:
			out = append(out, portMatch{proto: proto, match: []Match{protoMatch(proto)}})
		case p.Port.IsString:
			out = append(out, portMatch{proto: proto, match: []Match{protoMatch(proto)}, named: p.Port.StrVal})
		default:
			lo, hi := int(p.Port.IntVal), int(p.Port.IntVal)
			if p.EndPort != nil {
				hi = int(*p.EndPort)
			}
			if lo < 1 || lo > 65535 || hi < lo || hi > 65535 {
				c.warnf("%s: rule %d: port %d-%d out of range: skipped", id, rule, lo, hi)
				continue
			}
			specs = append(specs, portSpec{proto, lo, hi})
		}
	}
	return append(multiportMatches(specs, true), out...)
}

type portSpec struct {
	proto  string
	lo, hi int
}

// multiportMatches groups numeric ports by protocol, in order of first
// appearance, into matches of at most MaxPortsPerMatch ports each, each
// after a match of its protocol.
func multiportMatches(specs []portSpec, dst bool) []portMatch {
	kind := MatchSrcPorts
	if dst {
		kind = MatchDstPorts
	}
	var order []string
	byProto := map[string][]portSpec{}
	for _, s := range specs {
		if _, ok := byProto[s.proto]; !ok {
			order = append(order, s.proto)
		}
		byProto[s.proto] = append(byProto[s.proto], s)
	}
	var out []portMatch
	for _, proto := range order {
		var chunk []PortRange
		used := 0
		flush := func() {
			if len(chunk) > 0 {
				out = append(out, portMatch{proto: proto, match: []Match{protoMatch(proto), {Kind: kind, Ports: chunk}}})
			}
			chunk, used = nil, 0
		}
		for _, s := range byProto[proto] {
			w := 1
			if s.hi != s.lo {
				w = 2
			}
			if used+w > MaxPortsPerMatch {
				flush()
			}
			chunk = append(chunk, PortRange{uint16(s.lo), uint16(s.hi)})
			used += w
		}
		flush()
	}
	return out
}
