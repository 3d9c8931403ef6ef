package policy

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// This file interprets a compiled Ruleset the way the kernel would walk
// it, over the backend-neutral model, so that tests can ask "does this
// packet pass?" instead of comparing rule text. A match or verdict kind it
// does not know fails the test, so the interpreter cannot silently ignore
// one.

// packet is one packet crossing a node's FORWARD hook.
type packet struct {
	src, dst    netip.Addr
	proto       string // "tcp", "udp", "sctp", "icmp", "icmpv6"
	icmpType    uint8  // of an "icmpv6" packet
	sport       int
	dport       int
	in, out     string // interfaces
	established bool
}

type verdict int

const (
	vAccept verdict = iota
	vDrop
)

func (v verdict) String() string {
	if v == vAccept {
		return "ACCEPT"
	}
	return "DROP"
}

type sim struct {
	t    testing.TB
	rs   *Ruleset
	mark uint32
	hops int
	// table is the table the walk is in; "" is TableFilter.
	table string
}

// forward runs pkt through the filter table's FORWARD chain, whose policy
// is ACCEPT and whose only rule is Tabby's jump.
func forward(t testing.TB, rs *Ruleset, pkt packet) verdict {
	t.Helper()
	return hook(t, rs, "FORWARD", pkt)
}

// input runs pkt (to this node) through the filter table's INPUT chain,
// whose policy is ACCEPT and whose only rule is Tabby's jump.
func input(t testing.TB, rs *Ruleset, pkt packet) verdict {
	t.Helper()
	return hook(t, rs, "INPUT", pkt)
}

func hook(t testing.TB, rs *Ruleset, from string, pkt packet) verdict {
	t.Helper()
	return tableHook(t, rs, TableFilter, from, pkt)
}

// tableHook runs pkt through a base chain of table whose policy is ACCEPT
// and whose only rules are Tabby's jumps.
func tableHook(t testing.TB, rs *Ruleset, table, from string, pkt packet) verdict {
	t.Helper()
	s := &sim{t: t, rs: rs, table: table}
	for _, j := range rs.Jumps {
		if j.Table == table && j.From == from {
			if v, done := s.run(j.To, pkt); done {
				return v
			}
		}
	}
	return vAccept
}

// run walks chain; done reports a terminal verdict (else the chain
// returned).
func (s *sim) run(chain string, pkt packet) (verdict, bool) {
	s.hops++
	if s.hops > 1000 {
		s.t.Fatalf("rule walk does not end (at %s)", chain)
	}
	table := s.table
	if table == "" {
		table = TableFilter
	}
	ch, ok := s.rs.Chain(table, chain)
	if !ok {
		s.t.Fatalf("jump to missing chain %s", chain)
	}
	if d := ch.Dispatch; d != nil {
		if len(ch.Rules) > 0 {
			s.t.Fatalf("dispatch chain %s has rules", chain)
		}
		iface := pkt.in
		if d.Out {
			iface = pkt.out
		}
		i := slices.IndexFunc(d.Targets, func(t DispatchTarget) bool { return t.Iface == iface })
		if i < 0 {
			return vDrop, true
		}
		return s.run(d.Targets[i].Chain, pkt) // goto: a return ends this chain too
	}
	for _, r := range ch.Rules {
		if !s.matches(r, pkt) {
			continue
		}
		v := r.Verdict
		switch v.Kind {
		case VerdictAccept:
			return vAccept, true
		case VerdictDrop:
			return vDrop, true
		case VerdictReturn:
			return 0, false
		case VerdictSetMark:
			s.mark = s.mark&^v.Mask | v.Mark
		case VerdictJump, VerdictGoto:
			if res, done := s.run(v.Chain, pkt); done {
				return res, true
			}
			if v.Kind == VerdictGoto {
				return 0, false
			}
		default:
			s.t.Fatalf("chain %s: verdict %v in the filter path", chain, v)
		}
	}
	return 0, false
}

// matches evaluates every term of a rule.
func (s *sim) matches(r Rule, pkt packet) bool {
	for _, m := range r.Match {
		// A term about addresses never matches a packet of the other
		// family, negated or not (nftables adds "meta nfproto").
		if f := m.AddrFamily(); f != 0 && f != FamilyOf(pkt.src) {
			return false
		}
		if pkt.src.Is4() != pkt.dst.Is4() {
			s.t.Fatalf("packet %v mixes families", pkt)
		}
		ok := s.term(r, m, pkt)
		if m.Negate {
			switch m.Kind {
			case MatchSrcNet, MatchSrcSet, MatchDstSet:
			default:
				s.t.Fatalf("rule %v: negated %v", r, m)
			}
			ok = !ok
		}
		if !ok {
			return false
		}
	}
	return true
}

func (s *sim) term(r Rule, m Match, pkt packet) bool {
	switch m.Kind {
	case MatchInIface:
		return ifaceMatch(m.Iface, pkt.in)
	case MatchOutIface:
		return ifaceMatch(m.Iface, pkt.out)
	case MatchSrcNet:
		return m.Net.Contains(pkt.src)
	case MatchProto:
		return m.Proto == pkt.proto
	case MatchSrcPorts, MatchDstPorts:
		if !slices.ContainsFunc(r.Match, func(x Match) bool { return x.Kind == MatchProto }) {
			s.t.Fatalf("rule %v: ports without a protocol", r)
		}
		port := pkt.sport
		if m.Kind == MatchDstPorts {
			port = pkt.dport
		}
		return slices.ContainsFunc(m.Ports, func(p PortRange) bool { return p.Contains(uint16(port)) })
	case MatchFamily:
		return true // checked by the caller
	case MatchICMPv6Types:
		return pkt.proto == "icmpv6" && slices.Contains(m.ICMPTypes, pkt.icmpType)
	case MatchSrcSet, MatchDstSet:
		set := s.set(m, SetTypeNet)
		a := pkt.src
		if m.Kind == MatchDstSet {
			a = pkt.dst
		}
		return slices.ContainsFunc(set.Nets, func(p netip.Prefix) bool { return p.Contains(a) })
	case MatchSrcAddrPortSet, MatchDstAddrPortSet:
		set := s.set(m, SetTypeAddrPort)
		k := AddrPort{Addr: pkt.src, Proto: pkt.proto, Port: uint16(pkt.sport)}
		if m.Kind == MatchDstAddrPortSet {
			k = AddrPort{Addr: pkt.dst, Proto: pkt.proto, Port: uint16(pkt.dport)}
		}
		return slices.Contains(set.AddrPorts, k)
	case MatchEstablished:
		return pkt.established
	case MatchMark:
		return s.mark&m.Mask == m.Mark
	}
	s.t.Fatalf("rule %v: unknown match kind %d", r, m.Kind)
	return false
}

func ifaceMatch(pattern, iface string) bool {
	if p, ok := strings.CutSuffix(pattern, "+"); ok {
		return strings.HasPrefix(iface, p)
	}
	return pattern == iface
}

func (s *sim) set(m Match, typ SetType) Set {
	name := m.Set
	set, ok := s.rs.Set(name)
	if !ok {
		s.t.Fatalf("rule references missing set %s", name)
	}
	if set.Type != typ {
		s.t.Fatalf("set %s of type %s matched as %s", name, set.Type, typ)
	}
	if set.Family != m.Family || (set.Family != IPv4 && set.Family != IPv6) { // the compiler always names it
		s.t.Fatalf("set %s of family %d matched as family %d", name, set.Family, m.Family)
	}
	for _, n := range set.Nets {
		if FamilyOf(n.Addr()) != set.Family {
			s.t.Fatalf("set %s of family %v holds %s", name, set.Family, n)
		}
	}
	for _, a := range set.AddrPorts {
		if FamilyOf(a.Addr) != set.Family {
			s.t.Fatalf("set %s of family %v holds %s", name, set.Family, a)
		}
	}
	return set
}
