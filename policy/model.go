package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// This file is the backend-neutral rule model Compile emits. Package
// dataplane renders it for nftables (one inet table, verdict maps, interval
// sets) or for iptables and ipset; nothing here knows either syntax.

// Chain is one of Tabby's chains: Rules in order, or, for a dispatch
// chain, a Dispatch and no rules.
type Chain struct {
	// Table is TableFilter (the forward path) or TableNAT (postrouting).
	Table string
	Name  string
	Rules []Rule
	// Dispatch, when set, makes this a dispatch chain: a packet goes (goto)
	// to the chain of its interface, and a packet of an interface without
	// one is dropped.
	Dispatch *Dispatch
}

// Dispatch sends packets to per-interface chains.
type Dispatch struct {
	// Out matches the output interface; otherwise the input one.
	Out bool
	// Targets are sorted by interface and unique.
	Targets []DispatchTarget
}

// DispatchTarget is one interface and the chain its packets go to.
type DispatchTarget struct {
	Iface string
	Chain string
}

// Rule is a conjunction of matches and the verdict for a packet matching
// all of them.
type Rule struct {
	Match   []Match
	Verdict Verdict
	// Origin is the API rule this rule was compiled from, or the default
	// action it applies; nil for Tabby's own rules. Renderers keep it in
	// the rule's identity, so that equal matches of two policies stay two
	// rules with counters of their own.
	Origin *Origin
}

// MatchKind says which field of Match a term uses.
type MatchKind int

// Match kinds.
const (
	// MatchInIface, MatchOutIface: Iface is a name, or a prefix ending
	// in "+".
	MatchInIface MatchKind = iota + 1
	MatchOutIface
	// MatchSrcNet: the source address is in Net.
	MatchSrcNet
	// MatchProto: the layer-4 protocol is Proto ("tcp", "udp", "sctp").
	MatchProto
	// MatchSrcPorts, MatchDstPorts: the port is in one of Ports. The rule
	// matches MatchProto before. At most MaxPortsPerMatch entries (a range
	// counts twice) so that every backend can render it as one match.
	MatchSrcPorts
	MatchDstPorts
	// MatchSrcSet, MatchDstSet: the address is in the SetTypeNet set Set.
	MatchSrcSet
	MatchDstSet
	// MatchSrcAddrPortSet, MatchDstAddrPortSet: address, protocol and
	// port of the source (destination) are in the SetTypeAddrPort set Set.
	MatchSrcAddrPortSet
	MatchDstAddrPortSet
	// MatchEstablished: conntrack state ESTABLISHED or RELATED.
	MatchEstablished
	// MatchMark: packet mark & Mask == Mark.
	MatchMark
	// MatchFamily: the packet is of address family Family.
	MatchFamily
	// MatchICMPv6Types: the packet is ICMPv6 with a type in ICMPTypes.
	MatchICMPv6Types
)

// Family is an address family.
type Family uint8

// Address families.
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// Families are both address families, in the order the compiler emits
// per-family rules and sets.
var Families = []Family{IPv4, IPv6}

// FamilyOf is the family of an address (an IPv4-mapped IPv6 address is
// IPv6, as the kernel sees it).
func FamilyOf(a netip.Addr) Family {
	if a.Is4() {
		return IPv4
	}
	return IPv6
}

func (f Family) String() string {
	if f == IPv6 {
		return "ipv6"
	}
	return "ipv4"
}

// orIPv4 is f, or IPv4 for the zero value: a set or set match built
// without a family (as before IPv6) is IPv4.
func (f Family) orIPv4() Family {
	if f == 0 {
		return IPv4
	}
	return f
}

// Bits is the length of the family's addresses.
func (f Family) Bits() int {
	if f == IPv6 {
		return 128
	}
	return 32
}

// MaxPortsPerMatch is the most port entries one ports match holds (a range
// counts as two), iptables' multiport limit.
const MaxPortsPerMatch = 15

// Match is one term of a rule. Negate inverts it (MatchSrcNet and the set
// matches only).
//
// A term about addresses (MatchSrcNet, the set matches, MatchFamily,
// MatchICMPv6Types) only ever matches packets of its family (Net's, or
// Family), negated or not: "saddr != 10.0.0.1" does not match an IPv6
// packet, as in nftables. A rule's terms never mix families.
type Match struct {
	Kind   MatchKind
	Negate bool
	Iface  string
	Net    netip.Prefix
	Proto  string
	Ports  []PortRange
	Set    string
	Mark   uint32
	Mask   uint32
	// Family is the family of MatchFamily and of the set of a set match
	// (the set's Family); the zero value is IPv4.
	Family Family
	// ICMPTypes are MatchICMPv6Types' types, sorted.
	ICMPTypes []uint8
}

// AddrFamily is the family a term restricts packets to, 0 for a term that
// is not about addresses.
func (m Match) AddrFamily() Family {
	switch m.Kind {
	case MatchSrcNet:
		return FamilyOf(m.Net.Addr())
	case MatchSrcSet, MatchDstSet, MatchSrcAddrPortSet, MatchDstAddrPortSet, MatchFamily:
		return m.Family.orIPv4()
	case MatchICMPv6Types:
		return IPv6
	}
	return 0
}

// Family is the family a rule's terms restrict packets to, 0 for a rule
// that matches both.
func (r Rule) Family() Family {
	for _, m := range r.Match {
		if f := m.AddrFamily(); f != 0 {
			return f
		}
	}
	return 0
}

// PortRange is an inclusive port range; a single port has Lo == Hi.
type PortRange struct{ Lo, Hi uint16 }

func (p PortRange) String() string {
	if p.Lo == p.Hi {
		return strconv.Itoa(int(p.Lo))
	}
	return fmt.Sprintf("%d-%d", p.Lo, p.Hi)
}

// Contains reports whether port is in the range.
func (p PortRange) Contains(port uint16) bool { return port >= p.Lo && port <= p.Hi }

// VerdictKind says what a matching packet meets.
type VerdictKind int

// Verdicts.
const (
	// VerdictAccept ends the hook's evaluation for this table: the packet
	// passes.
	VerdictAccept VerdictKind = iota + 1
	VerdictDrop
	// VerdictReturn continues in the calling chain after the jump.
	VerdictReturn
	// VerdictJump evaluates Chain and, if it returns, continues here.
	VerdictJump
	// VerdictGoto evaluates Chain; if it returns, the caller of this
	// chain continues.
	VerdictGoto
	// VerdictSetMark sets mark = mark &^ Mask | Mark and continues.
	VerdictSetMark
	// VerdictMasquerade source-NATs to the outgoing interface's address
	// (TableNAT only).
	VerdictMasquerade
)

// Verdict is a rule's action.
type Verdict struct {
	Kind  VerdictKind
	Chain string // VerdictJump, VerdictGoto
	Mark  uint32 // VerdictSetMark
	Mask  uint32 // VerdictSetMark
}

// Jump hooks one of Tabby's chains (To) into the kernel's packet path at
// From ("FORWARD" of TableFilter, "POSTROUTING" of TableNAT): every packet
// there is evaluated by To first.
type Jump struct {
	Table string
	From  string
	To    string
}

// SetType is the kind of a set's members.
type SetType string

// Set types.
const (
	// SetTypeNet holds address prefixes (Set.Nets).
	SetTypeNet SetType = "net"
	// SetTypeAddrPort holds address, protocol and port triples
	// (Set.AddrPorts).
	SetTypeAddrPort SetType = "addr-port"
)

// Set is a named set of Tabby's. Members are canonical: prefixes masked,
// sorted, unique and not overlapping; triples sorted and unique. Every
// member is of the set's Family (sets are typed in the kernel, so a
// selector or address block of both families is two sets).
type Set struct {
	Name string
	Type SetType
	// Family of the members; the zero value is IPv4 (AddrFamily).
	Family    Family
	Nets      []netip.Prefix
	AddrPorts []AddrPort
}

// AddrPort is a member of a SetTypeAddrPort set.
type AddrPort struct {
	Addr  netip.Addr
	Proto string // lowercase
	Port  uint16
}

func (a AddrPort) String() string { return fmt.Sprintf("%s,%s:%d", a.Addr, a.Proto, a.Port) }

// Compare orders triples by address, protocol, port.
func (a AddrPort) Compare(b AddrPort) int {
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c
	}
	if c := strings.Compare(a.Proto, b.Proto); c != 0 {
		return c
	}
	return int(a.Port) - int(b.Port)
}

// Members renders the members as text ("10.244.0.0/16",
// "10.244.1.5,tcp:8080"), for tests and messages.
func (s Set) Members() []string {
	out := []string{}
	for _, n := range s.Nets {
		out = append(out, n.String())
	}
	for _, a := range s.AddrPorts {
		out = append(out, a.String())
	}
	return out
}

// AddrFamily is the family of the set's members: Family, IPv4 when unset.
func (s Set) AddrFamily() Family { return s.Family.orIPv4() }

// Len is the number of members.
func (s Set) Len() int { return len(s.Nets) + len(s.AddrPorts) }

// Constructors of match terms, for the compiler and tests.

func inIface(name string) Match  { return Match{Kind: MatchInIface, Iface: name} }
func outIface(name string) Match { return Match{Kind: MatchOutIface, Iface: name} }
func protoMatch(p string) Match  { return Match{Kind: MatchProto, Proto: p} }

func setMatch(name string, f Family, dst, negate bool) Match {
	k := MatchSrcSet
	if dst {
		k = MatchDstSet
	}
	return Match{Kind: k, Set: name, Family: f, Negate: negate}
}

func addrPortSetMatch(name string, f Family, dst bool) Match {
	k := MatchSrcAddrPortSet
	if dst {
		k = MatchDstAddrPortSet
	}
	return Match{Kind: k, Set: name, Family: f}
}

func familyMatch(f Family) Match { return Match{Kind: MatchFamily, Family: f} }

// String renders the term in an nft-like notation, for tests and messages.
func (m Match) String() string {
	neg := ""
	if m.Negate {
		neg = "!= "
	}
	ports := func() string {
		var s []string
		for _, p := range m.Ports {
			s = append(s, p.String())
		}
		if len(s) == 1 {
			return s[0]
		}
		return "{ " + strings.Join(s, ", ") + " }"
	}
	ip := "" // IPv4 terms print as they did before IPv6
	if m.AddrFamily() == IPv6 {
		ip = "ip6 "
	}
	switch m.Kind {
	case MatchInIface:
		return "iifname " + ifacePattern(m.Iface)
	case MatchOutIface:
		return "oifname " + ifacePattern(m.Iface)
	case MatchSrcNet:
		return ip + "saddr " + neg + m.Net.String()
	case MatchProto:
		return "l4proto " + m.Proto
	case MatchSrcPorts:
		return "sport " + ports()
	case MatchDstPorts:
		return "dport " + ports()
	case MatchSrcSet:
		return ip + "saddr " + neg + "@" + m.Set
	case MatchDstSet:
		return ip + "daddr " + neg + "@" + m.Set
	case MatchSrcAddrPortSet:
		return ip + "saddr . l4proto . sport " + neg + "@" + m.Set
	case MatchDstAddrPortSet:
		return ip + "daddr . l4proto . dport " + neg + "@" + m.Set
	case MatchEstablished:
		return "ct state established,related"
	case MatchMark:
		return fmt.Sprintf("mark & %#x == %#x", m.Mask, m.Mark)
	case MatchFamily:
		return "meta nfproto " + m.Family.String()
	case MatchICMPv6Types:
		var s []string
		for _, t := range m.ICMPTypes {
			s = append(s, strconv.Itoa(int(t)))
		}
		return "icmpv6 type { " + strings.Join(s, ", ") + " }"
	}
	return fmt.Sprintf("match(%d)", m.Kind)
}

func ifacePattern(p string) string {
	if s, ok := strings.CutSuffix(p, "+"); ok {
		return `"` + s + `*"`
	}
	return `"` + p + `"`
}

func (v Verdict) String() string {
	switch v.Kind {
	case VerdictAccept:
		return "accept"
	case VerdictDrop:
		return "drop"
	case VerdictReturn:
		return "return"
	case VerdictJump:
		return "jump " + v.Chain
	case VerdictGoto:
		return "goto " + v.Chain
	case VerdictSetMark:
		return fmt.Sprintf("mark set mark & %#x | %#x", ^v.Mask, v.Mark)
	case VerdictMasquerade:
		return "masquerade"
	}
	return fmt.Sprintf("verdict(%d)", v.Kind)
}

func (r Rule) String() string {
	var parts []string
	for _, m := range r.Match {
		parts = append(parts, m.String())
	}
	return strings.Join(append(parts, r.Verdict.String()), " ")
}

// Equal reports whether two rulesets are the same. Chains, rules and set
// members a Compiler carried over from an earlier pass are shared, so that
// comparing two successive passes costs little more than a look at what
// changed.
func (r *Ruleset) Equal(o *Ruleset) bool {
	if r == o {
		return true
	}
	if r == nil || o == nil {
		return false
	}
	return slices.EqualFunc(r.Chains, o.Chains, Chain.Equal) && slices.Equal(r.Jumps, o.Jumps) &&
		slices.EqualFunc(r.Sets, o.Sets, Set.Equal) && slices.Equal(r.Warnings, o.Warnings)
}

// Equal reports whether two chains are the same.
func (c Chain) Equal(o Chain) bool {
	if c.Table != o.Table || c.Name != o.Name || (c.Dispatch == nil) != (o.Dispatch == nil) {
		return false
	}
	if c.Dispatch != nil && (c.Dispatch.Out != o.Dispatch.Out || !slices.Equal(c.Dispatch.Targets, o.Dispatch.Targets)) {
		return false
	}
	return SameSlice(c.Rules, o.Rules) || slices.EqualFunc(c.Rules, o.Rules, Rule.Equal)
}

// Equal reports whether two rules are the same.
func (r Rule) Equal(o Rule) bool {
	return r.Verdict == o.Verdict && r.Origin.Equal(o.Origin) && slices.EqualFunc(r.Match, o.Match, Match.Equal)
}

// Equal reports whether two match terms are the same.
func (m Match) Equal(o Match) bool {
	return m.Kind == o.Kind && m.Negate == o.Negate && m.Iface == o.Iface && m.Net == o.Net && m.Proto == o.Proto &&
		m.Set == o.Set && m.Mark == o.Mark && m.Mask == o.Mask && m.Family == o.Family &&
		slices.Equal(m.Ports, o.Ports) && slices.Equal(m.ICMPTypes, o.ICMPTypes)
}

// Equal reports whether two sets are the same.
func (s Set) Equal(o Set) bool {
	return s.Name == o.Name && s.Type == o.Type && s.Family == o.Family &&
		(SameSlice(s.Nets, o.Nets) || slices.Equal(s.Nets, o.Nets)) &&
		(SameSlice(s.AddrPorts, o.AddrPorts) || slices.Equal(s.AddrPorts, o.AddrPorts))
}

// SameSlice reports whether a and b are the same slice: same length and,
// unless empty, the same first element in memory. A slice that is shared
// (and, by the contract of Compiler, never modified) is equal to itself
// without looking at its elements.
func SameSlice[E any](a, b []E) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}
