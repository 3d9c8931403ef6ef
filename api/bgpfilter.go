package api

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// ---------------------------------------------------------------- BGPFilter

// BGPFilter is a named, ordered list of import and export rules that
// BGPPeers attach by name (spec.filters), as Calico's BGPFilter. Within a
// list the first rule that matches a prefix decides; a prefix no rule
// matches gets the peer's default (docs/bgp.md: import rejects what the
// safe defaults do not allow, export sends).
type BGPFilter struct {
	TypeMeta `json:",inline"`
	Metadata ObjectMeta    `json:"metadata"`
	Spec     BGPFilterSpec `json:"spec"`
}

// BGPFilterSpec holds the rules per direction and address family: the V4
// lists take IPv4 CIDRs and touch IPv4 routes only, the V6 lists IPv6 ones
// (routes carried over MP-BGP, docs/bgp.md).
type BGPFilterSpec struct {
	ImportV4 []BGPFilterRule `json:"importV4,omitempty"`
	ExportV4 []BGPFilterRule `json:"exportV4,omitempty"`
	ImportV6 []BGPFilterRule `json:"importV6,omitempty"`
	ExportV6 []BGPFilterRule `json:"exportV6,omitempty"`
}

// Match operators of BGPFilterRule.MatchOperator.
const (
	MatchOperatorEqual = "Equal" // the prefix is cidr
	MatchOperatorIn    = "In"    // the prefix is cidr or inside it
	MatchOperatorNotIn = "NotIn" // the prefix is not inside cidr
)

// Actions of BGPFilterRule.Action.
const (
	FilterActionAccept = "Accept"
	FilterActionReject = "Reject"
)

// BGPFilterRule is one rule. Without cidr (and matchOperator) it matches
// every prefix. PrefixLength narrows In and NotIn to prefixes of those
// lengths.
type BGPFilterRule struct {
	CIDR          string                 `json:"cidr,omitempty"`
	MatchOperator string                 `json:"matchOperator,omitempty"`
	PrefixLength  *BGPFilterPrefixLength `json:"prefixLength,omitempty"`
	// PeerType narrows the rule to the peer's sessions of one kind:
	// eBGP (the peer's AS differs from the one this node speaks as on
	// the session) or iBGP (Calico 3.32's field).
	PeerType string `json:"peerType,omitempty"`
	// Communities narrows the rule to routes carrying a community
	// (standard "65001:100" or large "65001:1:100"; one value, as Calico).
	Communities *BGPFilterCommunityMatch `json:"communities,omitempty"`
	// ASPathPrefix narrows the rule to routes whose AS path begins with
	// these AS numbers, in order.
	ASPathPrefix []uint32 `json:"asPathPrefix,omitempty"`
	Action       string   `json:"action"`
	// Operations change a route the rule accepts, in order (Accept only).
	Operations []BGPFilterOperation `json:"operations,omitempty"`
}

// Values of BGPFilterRule.PeerType (Calico's).
const (
	FilterPeerEBGP = "eBGP"
	FilterPeerIBGP = "iBGP"
)

// BGPFilterCommunityMatch is the community a rule matches.
type BGPFilterCommunityMatch struct {
	Values []string `json:"values"`
}

// BGPFilterOperation is one change to an accepted route; exactly one field
// is set. AddCommunity and PrependASPath are Calico 3.32's;
// SetLocalPreference is Tabby's (Calico's setPriority sets a kernel route
// metric, which Tabby's learned routes do not carry).
type BGPFilterOperation struct {
	AddCommunity       *BGPFilterAddCommunity       `json:"addCommunity,omitempty"`
	PrependASPath      *BGPFilterPrependASPath      `json:"prependASPath,omitempty"`
	SetLocalPreference *BGPFilterSetLocalPreference `json:"setLocalPreference,omitempty"`
}

// BGPFilterAddCommunity adds a standard or large community.
type BGPFilterAddCommunity struct {
	Value string `json:"value"`
}

// BGPFilterPrependASPath prepends AS numbers: the path then begins with
// Prefix in the order listed.
type BGPFilterPrependASPath struct {
	Prefix []uint32 `json:"prefix"`
}

// BGPFilterSetLocalPreference sets LOCAL_PREF (import: this node's choice
// among paths; export: what iBGP peers get).
type BGPFilterSetLocalPreference struct {
	Value uint32 `json:"value"`
}

// BGPFilterPrefixLength bounds the prefix lengths a rule matches, both
// inclusive; an unset min means the cidr's own length, an unset max 32 (128
// in an IPv6 rule).
type BGPFilterPrefixLength struct {
	Min *int32 `json:"min,omitempty"`
	Max *int32 `json:"max,omitempty"`
}

// GetTypeMeta implements Object.
func (f *BGPFilter) GetTypeMeta() *TypeMeta { return &f.TypeMeta }

// GetMeta implements Object.
func (f *BGPFilter) GetMeta() *ObjectMeta { return &f.Metadata }

// SetDefaults implements Object: a rule with a cidr and no matchOperator
// gets In (Calico's usual intent: the cidr and what is inside it).
func (f *BGPFilter) SetDefaults() {
	setTypeMeta(&f.TypeMeta, KindBGPFilter)
	for _, rules := range [][]BGPFilterRule{f.Spec.ImportV4, f.Spec.ExportV4, f.Spec.ImportV6, f.Spec.ExportV6} {
		for i := range rules {
			if rules[i].CIDR != "" && rules[i].MatchOperator == "" {
				rules[i].MatchOperator = MatchOperatorIn
			}
		}
	}
}

// Validate implements Object.
func (f *BGPFilter) Validate() error {
	var v validator
	v.typeMeta(&f.TypeMeta, KindBGPFilter)
	v.meta(&f.Metadata, kindInfoOf(f))
	for i, r := range f.Spec.ImportV4 {
		v.filterRule(idx("spec.importV4", i), r, false)
	}
	for i, r := range f.Spec.ExportV4 {
		v.filterRule(idx("spec.exportV4", i), r, false)
	}
	for i, r := range f.Spec.ImportV6 {
		v.filterRule(idx("spec.importV6", i), r, true)
	}
	for i, r := range f.Spec.ExportV6 {
		v.filterRule(idx("spec.exportV6", i), r, true)
	}
	return v.err()
}

// filterRule validates a rule of an IPv4 list, or with v6 of an IPv6 one:
// its cidr is of that family and prefix lengths go up to 32, respectively
// 128.
func (v *validator) filterRule(path string, r BGPFilterRule, v6 bool) {
	v.filterMatch(path, r)
	v.filterOperations(path, r)
	switch r.Action {
	case FilterActionAccept, FilterActionReject:
	case "":
		v.add(path+".action", "is required (Accept or Reject)")
	default:
		v.add(path+".action", "%q is not one of Accept, Reject", r.Action)
	}
	var cidr netip.Prefix
	cidrOK := false
	switch {
	case r.CIDR == "":
	case !v6:
		cidr, cidrOK = v.cidr4(path+".cidr", r.CIDR)
	default:
		if cidr, cidrOK = v.cidr(path+".cidr", r.CIDR); cidrOK && !cidr.Addr().Is6() {
			v.add(path+".cidr", "%q is not an IPv6 CIDR (IPv4 rules go to the V4 list)", r.CIDR)
			cidrOK = false
		}
	}
	maxLen := int32(32)
	if v6 {
		maxLen = 128
	}
	switch r.MatchOperator {
	case "":
	case MatchOperatorEqual, MatchOperatorIn, MatchOperatorNotIn:
		if r.CIDR == "" {
			v.add(path+".cidr", "is required with matchOperator %s", r.MatchOperator)
		}
	default:
		v.add(path+".matchOperator", "%q is not one of Equal, In, NotIn", r.MatchOperator)
	}
	pl := r.PrefixLength
	if pl == nil {
		return
	}
	if r.CIDR == "" {
		v.add(path+".prefixLength", "requires cidr")
		return
	}
	if r.MatchOperator == MatchOperatorEqual {
		v.add(path+".prefixLength", "cannot be used with matchOperator Equal (it matches the cidr only)")
		return
	}
	check := func(field string, n *int32) bool {
		if n == nil {
			return false
		}
		if *n < 0 || *n > maxLen {
			v.add(path+".prefixLength."+field, "%d must be between 0 and %d", *n, maxLen)
			return false
		}
		if cidrOK && int(*n) < cidr.Bits() {
			v.add(path+".prefixLength."+field, "%d is shorter than the cidr %s: no prefix inside it is that short", *n, cidr)
			return false
		}
		return true
	}
	minOK, maxOK := check("min", pl.Min), check("max", pl.Max)
	if minOK && maxOK && *pl.Min > *pl.Max {
		v.add(path+".prefixLength.min", "%d must not be greater than max %d", *pl.Min, *pl.Max)
	}
}

// ---------------------------------------------------------------- BGPPeer BFD

// Defaults of BGPPeerBFD.
const (
	DefaultBFDInterval   = 300 * time.Millisecond
	DefaultBFDMultiplier = 3
	MinBFDInterval       = 10 * time.Millisecond
	MaxBFDInterval       = 60 * time.Second
)

// BGPPeerBFD runs BFD (RFC 5880/5881, single hop) on a peering: the session
// is torn down, and the peer's routes withdrawn, once multiplier × interval
// passes without a BFD packet from the peer, instead of after the hold
// time.
type BGPPeerBFD struct {
	Enabled bool `json:"enabled"`
	// Interval is both the desired transmit and the required receive
	// interval (default 300ms).
	Interval *Duration `json:"interval,omitempty"`
	// Multiplier is how many intervals without a packet take the session
	// down (default 3).
	Multiplier *uint32 `json:"multiplier,omitempty"`
}

// EffectiveInterval returns the BFD interval, the default when unset.
func (b *BGPPeerBFD) EffectiveInterval() time.Duration {
	if b == nil || b.Interval == nil {
		return DefaultBFDInterval
	}
	return b.Interval.Duration
}

// EffectiveMultiplier returns the BFD detection multiplier, the default
// when unset.
func (b *BGPPeerBFD) EffectiveMultiplier() uint32 {
	if b == nil || b.Multiplier == nil {
		return DefaultBFDMultiplier
	}
	return *b.Multiplier
}

func (v *validator) bfd(path string, b *BGPPeerBFD) {
	if b == nil {
		return
	}
	if d := b.Interval; d != nil {
		switch {
		case d.Duration < MinBFDInterval || d.Duration > MaxBFDInterval:
			v.add(path+".interval", "%s must be between %s and %s", d.Duration, MinBFDInterval, MaxBFDInterval)
		case d.Duration%time.Millisecond != 0:
			v.add(path+".interval", "%s must be a whole number of milliseconds", d.Duration)
		}
	}
	if m := b.Multiplier; m != nil && (*m < 1 || *m > 255) {
		v.add(path+".multiplier", "%d must be between 1 and 255", *m)
	}
}

// ---------------------------------------------------------------- communities

// ParseCommunity parses a standard BGP community (RFC 1997) written as
// "asn:value" with both halves in 0..65535.
func ParseCommunity(s string) (uint32, error) {
	hi, lo, ok := strings.Cut(s, ":")
	if !ok {
		return 0, fmt.Errorf("%q is not a community: want \"asn:value\", like \"65001:100\"", s)
	}
	a, err1 := strconv.ParseUint(hi, 10, 16)
	b, err2 := strconv.ParseUint(lo, 10, 16)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("%q is not a community: both halves of \"asn:value\" must be numbers from 0 to 65535", s)
	}
	return uint32(a)<<16 | uint32(b), nil
}

// wellKnownCommunities are the RFC 1997 communities that change how peers
// propagate a route; a pool must not tag its prefixes with them (Tabby
// uses NO_ADVERTISE itself to mark routes learned from external peers).
var wellKnownCommunities = map[uint32]string{
	0xFFFFFF01: "NO_EXPORT", 0xFFFFFF02: "NO_ADVERTISE", 0xFFFFFF03: "NO_EXPORT_SUBCONFED",
}

func (v *validator) communities(path string, cs []string) {
	seen := map[uint32]bool{}
	for i, c := range cs {
		n, err := ParseCommunity(c)
		switch {
		case err != nil:
			v.add(idx(path, i), "%s", err)
		case wellKnownCommunities[n] != "":
			v.add(idx(path, i), "%q is the well-known community %s, which would stop the prefixes from being propagated", c, wellKnownCommunities[n])
		case seen[n]:
			v.add(idx(path, i), "%q is listed twice", c)
		}
		seen[n] = true
	}
}

// LargeCommunity is an RFC 8092 large community: global administrator (an
// AS number), and two local data parts.
type LargeCommunity struct{ ASN, Local1, Local2 uint32 }

// String renders c as "asn:local1:local2".
func (c LargeCommunity) String() string { return fmt.Sprintf("%d:%d:%d", c.ASN, c.Local1, c.Local2) }

// ParseLargeCommunity parses "asn:local1:local2", each a number from 0 to
// 4294967295.
func ParseLargeCommunity(s string) (LargeCommunity, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return LargeCommunity{}, fmt.Errorf("%q is not a large community: want \"asn:local1:local2\", like \"65001:1:100\"", s)
	}
	var n [3]uint32
	for i, p := range parts {
		v, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return LargeCommunity{}, fmt.Errorf("%q is not a large community: each part of \"asn:local1:local2\" must be a number from 0 to 4294967295", s)
		}
		n[i] = uint32(v)
	}
	return LargeCommunity{n[0], n[1], n[2]}, nil
}

func (v *validator) largeCommunities(path string, cs []string) {
	seen := map[LargeCommunity]bool{}
	for i, c := range cs {
		n, err := ParseLargeCommunity(c)
		switch {
		case err != nil:
			v.add(idx(path, i), "%s", err)
		case seen[n]:
			v.add(idx(path, i), "%q is listed twice", c)
		}
		seen[n] = true
	}
}
