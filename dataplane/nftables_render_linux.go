package dataplane

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/tabbynet/tabby/policy"
)

// This file renders the neutral model as nftables objects: expressions of
// rules, set types and element keys. It is pure; nftables_linux.go diffs
// and programs.

// NFTTable is the inet table Tabby owns entirely in the nftables backend.
const NFTTable = "tabby"

// nftBase describes the base chain a policy.Jump's From names.
type nftBase struct {
	name     string
	typ      nftables.ChainType
	hook     *nftables.ChainHook
	priority *nftables.ChainPriority
}

// nftBases maps the hook names of policy.Jump to Tabby's base chains: a
// filter chain at forward (priority filter) and a nat chain at postrouting
// (priority srcnat), both with policy accept.
var nftBases = map[string]nftBase{
	"FORWARD":     {"forward", nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter},
	"INPUT":       {"input", nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter},
	"POSTROUTING": {"postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource},
	// Host endpoints (policy/host.go): the node's own output, and preDNAT
	// policy at mangle priority (after conntrack, before DNAT).
	"OUTPUT":            {"output", nftables.ChainTypeFilter, nftables.ChainHookOutput, nftables.ChainPriorityFilter},
	"mangle/PREROUTING": {"mangle-prerouting", nftables.ChainTypeFilter, nftables.ChainHookPrerouting, nftables.ChainPriorityMangle},
}

// nftBaseKey is the nftBases key of a jump: "<table>/<hook>" where the
// table is not implied by the hook alone, else the hook.
func nftBaseKey(j policy.Jump) string {
	if k := j.Table + "/" + j.From; nftBases[k].name != "" {
		return k
	}
	return j.From
}

// nftMapName names the verdict map of a dispatch chain.
func nftMapName(chain string) string { return chain + "-map" }

// nftRuleHashes identifies each rule by a hash over the chain name, the
// previous rule's hash and the rule's text, kept in the rule's comment, so
// that equal hash lists mean equal chains.
func nftRuleHashes(chain string, texts []string) []string {
	out := make([]string, len(texts))
	prev := ""
	for i, t := range texts {
		h := sha256.New()
		fmt.Fprintf(h, "%s\x00%s\x00%s", chain, prev, t)
		prev = base64.RawURLEncoding.EncodeToString(h.Sum(nil))[:16]
		out[i] = prev
	}
	return out
}

// nftDispatchRules are the two rules of a dispatch chain: the verdict-map
// lookup of the interface, then drop for interfaces the map lacks.
func nftDispatchTexts(c policy.Chain) []string {
	key := "iifname"
	if c.Dispatch.Out {
		key = "oifname"
	}
	return []string{key + " vmap @" + nftMapName(c.Name), "drop"}
}

func nftDispatchExprs(c policy.Chain) [][]expr.Any {
	key := expr.MetaKeyIIFNAME
	if c.Dispatch.Out {
		key = expr.MetaKeyOIFNAME
	}
	return [][]expr.Any{
		{
			&expr.Meta{Key: key, Register: 1},
			&expr.Lookup{SourceRegister: 1, SetName: nftMapName(c.Name), IsDestRegSet: true, DestRegister: 0},
		},
		{&expr.Verdict{Kind: expr.VerdictDrop}},
	}
}

// nftAnonSet is an anonymous constant set a rule needs (a port list); it
// is created in the same batch as the rule.
type nftAnonSet struct {
	set   *nftables.Set
	elems []nftables.SetElement
}

// nftRuleExprs renders one rule. Anonymous sets it needs are returned to
// be added to the batch before the rule; their Lookup refers to them by
// the ID AddSet assigns, so call it once per batch.
//
// A rule with an Origin counts its packets and bytes, and logs them to
// NFLOG where fl says so, before its verdict.
func nftRuleExprs(table *nftables.Table, r policy.Rule, fl FlowLogRules) ([]expr.Any, []*nftAnonSet, error) {
	rr := &nftRuleRender{table: table}
	for _, m := range r.Match {
		if f := m.AddrFamily(); f != 0 {
			if err := rr.needFamily(f); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", m, err)
			}
		}
		if err := rr.match(m); err != nil {
			return nil, nil, err
		}
	}
	if r.Origin != nil {
		rr.add(&expr.Counter{})
		if fl.Logs(r) {
			rr.add(&expr.Log{Key: 1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX, Group: fl.Group, Data: []byte(FlowLogPrefix(r.Origin))})
		}
	}
	if err := rr.verdict(r.Verdict); err != nil {
		return nil, nil, err
	}
	return rr.ex, rr.anon, nil
}

// nftRuleRender is one rule being rendered: its expressions so far, the
// anonymous sets they need, and the address family its terms chose.
type nftRuleRender struct {
	table *nftables.Table
	ex    []expr.Any
	anon  []*nftAnonSet
	fam   policy.Family
}

func (rr *nftRuleRender) add(e ...expr.Any) { rr.ex = append(rr.ex, e...) }

// needFamily checks, on the first address term, the packet's family; every
// later term must be of the same one.
func (rr *nftRuleRender) needFamily(f policy.Family) error {
	switch {
	case f != policy.IPv4 && f != policy.IPv6:
		return fmt.Errorf("address match without a family")
	case rr.fam == f:
		return nil
	case rr.fam != 0:
		return fmt.Errorf("rule mixes %v and %v terms", rr.fam, f)
	}
	proto := byte(unix.NFPROTO_IPV4)
	if f == policy.IPv6 {
		proto = unix.NFPROTO_IPV6
	}
	rr.add(&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}})
	rr.fam = f
	return nil
}

func cmpOp(neg bool) expr.CmpOp {
	if neg {
		return expr.CmpOpNeq
	}
	return expr.CmpOpEq
}

// anonLookup adds a lookup in a new anonymous set of elems.
func (rr *nftRuleRender) anonLookup(set *nftables.Set, elems []nftables.SetElement) {
	rr.anon = append(rr.anon, &nftAnonSet{set: set, elems: elems})
	rr.add(&expr.Lookup{SourceRegister: 1, SetName: "", SetID: 0}) // patched by the caller
}

// match renders one match term.
func (rr *nftRuleRender) match(m policy.Match) error {
	switch m.Kind {
	case policy.MatchInIface, policy.MatchOutIface:
		rr.iface(m)
	case policy.MatchSrcNet:
		p := m.Net.Masked()
		off, n := addrField(rr.fam, false)
		rr.add(&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n})
		if p.Bits() < int(n)*8 {
			rr.add(&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: prefixMask(p.Bits(), int(n)), Xor: make([]byte, n)})
		}
		rr.add(&expr.Cmp{Op: cmpOp(m.Negate), Register: 1, Data: p.Addr().AsSlice()})
	case policy.MatchFamily:
		// The family check is the whole match.
	case policy.MatchICMPv6Types:
		return rr.icmpv6Types(m)
	case policy.MatchProto:
		n, err := protoNumber(m.Proto)
		if err != nil {
			return err
		}
		rr.add(&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{n}})
	case policy.MatchSrcPorts, policy.MatchDstPorts:
		rr.ports(m)
	case policy.MatchSrcSet, policy.MatchDstSet:
		off, n := addrField(rr.fam, m.Kind == policy.MatchDstSet)
		rr.add(&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
			&expr.Lookup{SourceRegister: 1, SetName: m.Set, Invert: m.Negate})
	case policy.MatchSrcAddrPortSet, policy.MatchDstAddrPortSet:
		rr.addrPortSet(m)
	case policy.MatchEstablished:
		rr.add(&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
				Xor:  binaryutil.NativeEndian.PutUint32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)})
	case policy.MatchMark:
		rr.add(&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(m.Mask), Xor: binaryutil.NativeEndian.PutUint32(0)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(m.Mark)})
	default:
		return fmt.Errorf("unknown match kind %d", m.Kind)
	}
	return nil
}

// iface matches the input or output interface: a name, or a prefix for a
// wildcard.
func (rr *nftRuleRender) iface(m policy.Match) {
	key := expr.MetaKeyIIFNAME
	if m.Kind == policy.MatchOutIface {
		key = expr.MetaKeyOIFNAME
	}
	rr.add(&expr.Meta{Key: key, Register: 1})
	if p, ok := cutWildcard(m.Iface); ok {
		rr.add(&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(p)})
	} else {
		rr.add(&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameKey(m.Iface)})
	}
}

// icmpv6Types matches ICMPv6 with one of the types.
func (rr *nftRuleRender) icmpv6Types(m policy.Match) error {
	if len(m.ICMPTypes) == 0 {
		return fmt.Errorf("%s: no types", m)
	}
	rr.add(&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1})
	if len(m.ICMPTypes) == 1 {
		rr.add(&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{m.ICMPTypes[0]}})
		return nil
	}
	var elems []nftables.SetElement
	for _, t := range m.ICMPTypes {
		elems = append(elems, nftables.SetElement{Key: []byte{t}})
	}
	rr.anonLookup(&nftables.Set{Table: rr.table, Anonymous: true, Constant: true, KeyType: nftables.TypeICMP6Type}, elems)
	return nil
}

// ports matches the source or destination port: one, a range, or a set of
// ranges.
func (rr *nftRuleRender) ports(m policy.Match) {
	off := uint32(2)
	if m.Kind == policy.MatchSrcPorts {
		off = 0
	}
	rr.add(&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: off, Len: 2})
	if len(m.Ports) == 1 && m.Ports[0].Lo == m.Ports[0].Hi {
		rr.add(&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(m.Ports[0].Lo)})
		return
	}
	if len(m.Ports) == 1 {
		rr.add(&expr.Range{Op: expr.CmpOpEq, Register: 1,
			FromData: binaryutil.BigEndian.PutUint16(m.Ports[0].Lo), ToData: binaryutil.BigEndian.PutUint16(m.Ports[0].Hi)})
		return
	}
	rr.anonLookup(&nftables.Set{Table: rr.table, Anonymous: true, Constant: true, Interval: true, KeyType: nftables.TypeInetService},
		portElements(m.Ports))
}

// addrPortSet looks the (address, protocol, port) of the source or
// destination up in a named set.
func (rr *nftRuleRender) addrPortSet(m policy.Match) {
	aoff, n := addrField(rr.fam, m.Kind == policy.MatchDstAddrPortSet)
	poff := uint32(2)
	if m.Kind == policy.MatchSrcAddrPortSet {
		poff = 0
	}
	// Concatenated key in 32-bit registers from 8 (the 128-bit register
	// 1): the address (one register for IPv4, four for IPv6), then the
	// protocol, then the port.
	next := uint32(8 + n/4)
	rr.add(
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: aoff, Len: n},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: next},
		&expr.Payload{DestRegister: next + 1, Base: expr.PayloadBaseTransportHeader, Offset: poff, Len: 2},
		&expr.Lookup{SourceRegister: 1, SetName: m.Set, Invert: m.Negate})
}

// verdict renders the rule's verdict.
func (rr *nftRuleRender) verdict(v policy.Verdict) error {
	switch v.Kind {
	case policy.VerdictAccept:
		rr.add(&expr.Verdict{Kind: expr.VerdictAccept})
	case policy.VerdictDrop:
		rr.add(&expr.Verdict{Kind: expr.VerdictDrop})
	case policy.VerdictReturn:
		rr.add(&expr.Verdict{Kind: expr.VerdictReturn})
	case policy.VerdictJump:
		rr.add(&expr.Verdict{Kind: expr.VerdictJump, Chain: v.Chain})
	case policy.VerdictGoto:
		rr.add(&expr.Verdict{Kind: expr.VerdictGoto, Chain: v.Chain})
	case policy.VerdictSetMark:
		rr.add(&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(^v.Mask), Xor: binaryutil.NativeEndian.PutUint32(v.Mark)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1})
	case policy.VerdictMasquerade:
		rr.add(&expr.Masq{})
	default:
		return fmt.Errorf("unknown verdict kind %d", v.Kind)
	}
	return nil
}

// addrField is the offset and length of the source (or dst destination)
// address in a network header of family f.
func addrField(f policy.Family, dst bool) (off, n uint32) {
	if f == policy.IPv6 {
		if dst {
			return 24, 16
		}
		return 8, 16
	}
	if dst {
		return 16, 4
	}
	return 12, 4
}

// prefixMask is an n-byte mask with the first bits bits set.
func prefixMask(bits, n int) []byte {
	m := make([]byte, n)
	for i := 0; i < bits; i++ {
		m[i/8] |= 0x80 >> (i % 8)
	}
	return m
}

func cutWildcard(iface string) (string, bool) {
	if len(iface) > 0 && iface[len(iface)-1] == '+' {
		return iface[:len(iface)-1], true
	}
	return "", false
}

// ifnameKey is an interface name as the kernel compares it: IFNAMSIZ
// bytes, NUL padded.
func ifnameKey(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

func protoNumber(p string) (byte, error) {
	switch p {
	case "tcp":
		return unix.IPPROTO_TCP, nil
	case "udp":
		return unix.IPPROTO_UDP, nil
	case "sctp":
		return unix.IPPROTO_SCTP, nil
	case "icmp":
		return unix.IPPROTO_ICMP, nil
	case "icmpv6":
		return unix.IPPROTO_ICMPV6, nil
	}
	return 0, fmt.Errorf("protocol %q: not tcp, udp, sctp, icmp or icmpv6", p)
}

// portElements are the interval elements of port ranges: a start, and an
// end one past the range unless it reaches 65535.
func portElements(ports []policy.PortRange) []nftables.SetElement {
	var out []nftables.SetElement
	for _, p := range ports {
		out = append(out, nftables.SetElement{Key: binaryutil.BigEndian.PutUint16(p.Lo)})
		if p.Hi < 65535 {
			out = append(out, nftables.SetElement{Key: binaryutil.BigEndian.PutUint16(p.Hi + 1), IntervalEnd: true})
		}
	}
	return out
}

// addrRange is an interval [lo, end) of addresses of one family as an
// interval set holds it; open means it runs to the family's last address
// (the set has no end element).
type addrRange struct {
	lo, end netip.Addr
	open    bool
}

func (r addrRange) key() string {
	if r.open {
		return r.lo.String() + "-"
	}
	return r.lo.String() + "-" + r.end.String()
}

func prefixRange(p netip.Prefix) addrRange {
	p = p.Masked()
	last := p.Addr().AsSlice()
	for i := p.Bits(); i < len(last)*8; i++ {
		last[i/8] |= 0x80 >> (i % 8)
	}
	l, _ := netip.AddrFromSlice(last)
	end := l.Next()
	if !end.IsValid() {
		return addrRange{lo: p.Addr(), open: true}
	}
	return addrRange{lo: p.Addr(), end: end}
}

func (r addrRange) elements() []nftables.SetElement {
	out := []nftables.SetElement{{Key: r.lo.AsSlice()}}
	if !r.open {
		out = append(out, nftables.SetElement{Key: r.end.AsSlice(), IntervalEnd: true})
	}
	return out
}

// rangesOf pairs the elements of an interval set read from the kernel into
// ranges: each start with the end element that follows it.
func rangesOf(elems []nftables.SetElement) []addrRange {
	type point struct {
		a   netip.Addr
		end bool
	}
	var pts []point
	for _, e := range elems {
		if len(e.Key) != 4 && len(e.Key) != 16 {
			continue
		}
		a, _ := netip.AddrFromSlice(e.Key)
		pts = append(pts, point{a, e.IntervalEnd})
	}
	// Sorted by address, an end before a start at the same address.
	slices.SortFunc(pts, func(x, y point) int {
		if c := x.a.Compare(y.a); c != 0 {
			return c
		}
		switch {
		case x.end && !y.end:
			return -1
		case !x.end && y.end:
			return 1
		}
		return 0
	})
	var out []addrRange
	var open *netip.Addr
	for _, p := range pts {
		switch {
		case !p.end:
			if open != nil { // two starts: the first runs up to the second
				out = append(out, addrRange{lo: *open, end: p.a})
			}
			a := p.a
			open = &a
		case open != nil:
			out = append(out, addrRange{lo: *open, end: p.a})
			open = nil
		}
	}
	if open != nil {
		out = append(out, addrRange{lo: *open, open: true})
	}
	return out
}

// addrPortKey is the concatenated key of an address, protocol and port:
// each field padded to a multiple of 4 bytes.
func addrPortKey(a policy.AddrPort) ([]byte, error) {
	n, err := protoNumber(a.Proto)
	if err != nil {
		return nil, err
	}
	ip := a.Addr.AsSlice()
	if a.Addr.Is4In6() || len(ip) == 0 {
		return nil, fmt.Errorf("%s: not an IPv4 or IPv6 address", a)
	}
	k := make([]byte, len(ip)+8)
	copy(k, ip)
	k[len(ip)] = n
	binary.BigEndian.PutUint16(k[len(ip)+4:], a.Port)
	return k, nil
}

// nftSetKind is what a Tabby set in the nftables table holds.
type nftSetKind int

const (
	nftSetNet       nftSetKind = iota + 1 // interval set of ipv4_addr
	nftSetAddrPort                        // ipv4_addr . inet_proto . inet_service
	nftSetVmap                            // ifname : verdict
	nftSetNet6                            // interval set of ipv6_addr
	nftSetAddrPort6                       // ipv6_addr . inet_proto . inet_service
)

var (
	addrPortType  = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)
	addrPortType6 = nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetProto, nftables.TypeInetService)
)

// nftSetKindOf is the kind of set a neutral set renders as.
func nftSetKindOf(s policy.Set) (nftSetKind, error) {
	f := s.AddrFamily()
	switch {
	case s.Type == policy.SetTypeNet && f == policy.IPv4:
		return nftSetNet, nil
	case s.Type == policy.SetTypeNet && f == policy.IPv6:
		return nftSetNet6, nil
	case s.Type == policy.SetTypeAddrPort && f == policy.IPv4:
		return nftSetAddrPort, nil
	case s.Type == policy.SetTypeAddrPort && f == policy.IPv6:
		return nftSetAddrPort6, nil
	}
	return 0, fmt.Errorf("set %s: unknown type %q of family %d", s.Name, s.Type, s.Family)
}

// nftSetTemplate is the set object of a kind, for AddSet.
func nftSetTemplate(table *nftables.Table, name string, kind nftSetKind) *nftables.Set {
	s := &nftables.Set{Table: table, Name: name}
	switch kind {
	case nftSetNet:
		s.KeyType, s.Interval = nftables.TypeIPAddr, true
	case nftSetNet6:
		s.KeyType, s.Interval = nftables.TypeIP6Addr, true
	case nftSetAddrPort:
		s.KeyType, s.Concatenation = addrPortType, true
	case nftSetAddrPort6:
		s.KeyType, s.Concatenation = addrPortType6, true
	case nftSetVmap:
		s.KeyType, s.DataType, s.IsMap = nftables.TypeIFName, nftables.TypeVerdict, true
		s.KeyByteOrder = binaryutil.NativeEndian // a string, as nft writes it
	}
	return s
}

// kindOf tells a kernel set's kind from its key type.
func kindOf(s *nftables.Set) nftSetKind {
	switch {
	case s.IsMap:
		// (google/nftables v0.3.0 reads a verdict map's key and data types
		// swapped; Tabby's only maps are the dispatch ones.)
		return nftSetVmap
	case s.KeyType.Bytes == 12:
		return nftSetAddrPort
	case s.KeyType.Bytes == 24:
		return nftSetAddrPort6
	case s.Interval && s.KeyType.Bytes == 4:
		return nftSetNet
	case s.Interval && s.KeyType.Bytes == 16:
		return nftSetNet6
	}
	return 0
}
