package api

import (
	"fmt"
	"strings"
)

// MaxFilterOperations and MaxASPathLen bound a rule's operations and its AS
// number lists (Calico's limits).
const (
	MaxFilterOperations = 10
	MaxASPathLen        = 10
)

// FilterCommunity is a community of a BGPFilter rule: standard (Large
// false, Standard set) or large.
type FilterCommunity struct {
	Standard  uint32
	LargeComm LargeCommunity
	Large     bool
}

// String renders c as GoBGP and BIRD read it ("65001:100", "65001:1:100").
func (c FilterCommunity) String() string {
	if c.Large {
		return c.LargeComm.String()
	}
	return fmt.Sprintf("%d:%d", c.Standard>>16, c.Standard&0xffff)
}

// ParseFilterCommunity parses "asn:value" (standard) or
// "asn:local1:local2" (large).
func ParseFilterCommunity(s string) (FilterCommunity, error) {
	if strings.Count(s, ":") == 2 {
		l, err := ParseLargeCommunity(s)
		return FilterCommunity{LargeComm: l, Large: true}, err
	}
	n, err := ParseCommunity(s)
	return FilterCommunity{Standard: n}, err
}

// filterMatch validates a rule's peerType, communities and asPathPrefix.
func (v *validator) filterMatch(path string, r BGPFilterRule) {
	switch r.PeerType {
	case "", FilterPeerEBGP, FilterPeerIBGP:
	default:
		v.add(path+".peerType", "%q is not one of %s, %s", r.PeerType, FilterPeerEBGP, FilterPeerIBGP)
	}
	if c := r.Communities; c != nil {
		switch len(c.Values) {
		case 0:
			v.add(path+".communities.values", "is required: one community, like \"65001:100\" or \"65001:1:100\"")
		case 1:
			if _, err := ParseFilterCommunity(c.Values[0]); err != nil {
				v.add(idx(path+".communities.values", 0), "%s", err)
			}
		default:
			v.add(path+".communities.values", "has %d values; a rule matches one community (write one rule per community)", len(c.Values))
		}
	}
	v.asNumbers(path+".asPathPrefix", r.ASPathPrefix, false)
}

// asNumbers validates a list of AS numbers; required says it must not be
// empty.
func (v *validator) asNumbers(path string, asns []uint32, required bool) {
	switch {
	case len(asns) == 0 && required:
		v.add(path, "is required: at least one AS number")
	case len(asns) > MaxASPathLen:
		v.add(path, "has %d AS numbers; at most %d", len(asns), MaxASPathLen)
	}
	for i, a := range asns {
		if a == 0 || a == 23456 {
			v.add(idx(path, i), "%d is not an AS number that may appear in an AS path", a)
		}
	}
}

// filterOperations validates a rule's operations: Accept only, exactly one
// field each, valid values.
func (v *validator) filterOperations(path string, r BGPFilterRule) {
	if len(r.Operations) == 0 {
		return
	}
	if r.Action != FilterActionAccept {
		v.add(path+".operations", "may only be used with action Accept (a rejected route is not changed)")
	}
	if len(r.Operations) > MaxFilterOperations {
		v.add(path+".operations", "has %d entries; at most %d", len(r.Operations), MaxFilterOperations)
	}
	prepends := 0
	for i, op := range r.Operations {
		p := idx(path+".operations", i)
		set := 0
		if c := op.AddCommunity; c != nil {
			set++
			if fc, err := ParseFilterCommunity(c.Value); err != nil {
				v.add(p+".addCommunity.value", "%s", err)
			} else if !fc.Large && wellKnownCommunities[fc.Standard] != "" {
				v.add(p+".addCommunity.value", "%q is the well-known community %s; Tabby uses it itself", c.Value, wellKnownCommunities[fc.Standard])
			}
		}
		if pp := op.PrependASPath; pp != nil {
			set++
			prepends++
			v.asNumbers(p+".prependASPath.prefix", pp.Prefix, true)
			if len(r.ASPathPrefix) > 0 && len(ASRuns(pp.Prefix)) > 1 {
				v.add(p+".prependASPath.prefix", "with asPathPrefix, prepend one AS number (repeated or not): more would change the path the rule matches before it accepts")
			}
		}
		if lp := op.SetLocalPreference; lp != nil {
			set++
		}
		if set != 1 {
			v.add(p, "must set exactly one of addCommunity, prependASPath, setLocalPreference (has %d)", set)
		}
	}
	if prepends > 1 {
		v.add(path+".operations", "has %d prependASPath entries; give one, with every AS number in its prefix", prepends)
	}
}

// ASRun is one AS number repeated.
type ASRun struct {
	ASN    uint32
	Repeat uint32
}

// ASRuns splits a prependASPath prefix into runs of one AS number, in the
// order the path will show them.
func ASRuns(asns []uint32) []ASRun {
	var out []ASRun
	for _, a := range asns {
		if n := len(out); n > 0 && out[n-1].ASN == a {
			out[n-1].Repeat++
			continue
		}
		out = append(out, ASRun{a, 1})
	}
	return out
}
