package policy

import (
	"strconv"
	"strings"
)

// Origin says which API rule a compiled rule came from, so counters, flow
// records and `tabbyctl explain packet` can name the rule that decided.
//
// Rules Tabby adds on its own (anti-spoofing, conntrack, dispatch, node
// guard, failsafes, NAT, the mark checks between policies) have none.
type Origin struct {
	Tier string // tier name; "" before tiers exist
	// Kind is OriginGlobal, OriginNamespaced, OriginStagedGlobal…; "" for
	// the end-of-list default.
	Kind      string
	Namespace string // for namespaced kinds
	Name      string // policy name
	Direction string // DirIngress or DirEgress
	// Index is the rule's index in the policy's ingress or egress list; -1
	// for a default action (the end of a tier or of the policy list).
	Index  int
	Action string // "Allow", "Deny", "Pass", "Log" (the API's word)
	Staged bool   // the rule only counts, never decides
}

// Origin kinds and directions.
const (
	OriginGlobal       = "GlobalNetworkPolicy"
	OriginNamespaced   = "NetworkPolicy"
	OriginStagedGlobal = "StagedGlobalNetworkPolicy"
	DirIngress         = "ingress"
	DirEgress          = "egress"
)

// String is the origin as "tier/kind/ns/name/direction/index/action"
// ("/GlobalNetworkPolicy//allow-dns/egress/0/Allow",
// "////ingress/-1/Deny" for a default deny), with "/staged" appended for a
// staged rule. It is stable: metric labels and flow records use it. Empty
// for nil.
func (o *Origin) String() string {
	if o == nil {
		return ""
	}
	s := strings.Join([]string{o.Tier, o.Kind, o.Namespace, o.Name, o.Direction, strconv.Itoa(o.Index), o.Action}, "/")
	if o.Staged {
		s += "/staged"
	}
	return s
}

// Policy names the policy: "ns/name" for a namespaced kind, "name" for a
// global one, "" for a default action.
func (o *Origin) Policy() string {
	if o == nil || o.Name == "" {
		return ""
	}
	if o.Namespace != "" {
		return o.Namespace + "/" + o.Name
	}
	return o.Name
}

// Default reports whether the origin is a default action rather than a
// policy's rule.
func (o *Origin) Default() bool { return o != nil && o.Index < 0 }

// ID is a short stable identifier of the origin (12 base32 characters of a
// hash of String), small enough for a kernel log prefix; "" for nil.
func (o *Origin) ID() string {
	if o == nil {
		return ""
	}
	return shortHash(o.String(), 12)
}

// ParseOrigin parses String's output.
func ParseOrigin(s string) (*Origin, bool) {
	f := strings.Split(s, "/")
	if len(f) != 7 && !(len(f) == 8 && f[7] == "staged") {
		return nil, false
	}
	i, err := strconv.Atoi(f[5])
	if err != nil {
		return nil, false
	}
	return &Origin{Tier: f[0], Kind: f[1], Namespace: f[2], Name: f[3], Direction: f[4], Index: i, Action: f[6], Staged: len(f) == 8}, true
}

// Equal reports whether two origins are the same (both nil included).
func (o *Origin) Equal(p *Origin) bool {
	if o == nil || p == nil {
		return o == p
	}
	return *o == *p
}

func (d direction) String() string {
	if d == egress {
		return DirEgress
	}
	return DirIngress
}

// defaultDeny is the origin of the drop at the end of a direction's policy
// list.
func defaultDeny(dir direction) *Origin {
	return &Origin{Direction: dir.String(), Index: -1, Action: "Deny"}
}

// withOrigin is r with origin o.
func withOrigin(r Rule, o *Origin) Rule {
	r.Origin = o
	return r
}
