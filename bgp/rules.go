package bgp

import (
	"fmt"
	"strconv"
	"strings"

	gobgpapi "github.com/osrg/gobgp/v4/api"
	"google.golang.org/protobuf/proto"
)

// BGPFilter rules and per-peer next hops as GoBGP statements.
//
// A rule is one statement (or a few, see ruleStatements) whose conditions
// are the peer's neighbor set, the rule's prefix set, and, when the rule
// has them, a community set (standard or large) and an AS-path set; an
// Accept rule's statement carries its operations (community additions, an
// AS-path prepend, LOCAL_PREF) with the accept.

// exportPathHead is what GoBGP has already put in front of a path's AS
// path when the export policy looks at a path sent to p: this node's AS
// towards an eBGP peer (GoBGP prepends before the export policy runs),
// nothing towards an iBGP one.
func (in policyInput) exportPathHead(p Peer) []uint32 {
	local := in.asn
	if p.LocalASN != 0 {
		local = p.LocalASN
	}
	if local == 0 || p.ASN == local {
		return nil
	}
	return []uint32{local}
}

// asPathRegexp is a GoBGP AS-path set entry matching paths that begin with
// asns ("_" is GoBGP's delimiter: a space, a set's brace, the start or the
// end).
func asPathRegexp(asns []uint32) string {
	parts := make([]string, len(asns))
	for i, a := range asns {
		parts[i] = strconv.FormatUint(uint64(a), 10)
	}
	return "^" + strings.Join(parts, "_") + "_"
}

// ruleStatements returns the statements of rule i of the peer that peerSet
// names, and adds the rule's sets to req. accept is the action of an
// Accept rule (the import one also tags the route); a Reject rule rejects.
// head is what GoBGP put in front of the AS path already (exportPathHead;
// nil on import): an asPathPrefix matches after it.
//
// GoBGP takes one AS-path prepend per statement. A prepend of several
// runs (65001 65002) is one statement per run, last run first, each with
// the rule's conditions and no route action, then the final one with the
// first run, the other operations and the accept. The conditions still
// hold after a prepend: validation refuses a rule with asPathPrefix and
// several runs, and adding a community never unmatches one.
func ruleStatements(req *gobgpapi.SetPoliciesRequest, policy, peerSet string, i int, r FilterRule, accept *gobgpapi.Actions, head []uint32) []*gobgpapi.Statement {
	name := fmt.Sprintf("%s-rule%d", peerSet, i)
	match := gobgpapi.MatchSet_TYPE_ANY
	if r.Operator == MatchNotIn {
		match = gobgpapi.MatchSet_TYPE_INVERT
	}
	req.DefinedSets = append(req.DefinedSets, &gobgpapi.DefinedSet{DefinedType: gobgpapi.DefinedType_DEFINED_TYPE_PREFIX, Name: name, Prefixes: []*gobgpapi.Prefix{rulePrefix(r)}})
	cond := func() *gobgpapi.Conditions {
		return &gobgpapi.Conditions{
			NeighborSet: &gobgpapi.MatchSet{Type: gobgpapi.MatchSet_TYPE_ANY, Name: peerSet},
			PrefixSet:   &gobgpapi.MatchSet{Type: match, Name: name},
		}
	}
	c := cond()
	if cm := r.Community; cm != nil {
		set := &gobgpapi.DefinedSet{DefinedType: gobgpapi.DefinedType_DEFINED_TYPE_COMMUNITY, Name: name + "-community", List: []string{"^" + cm.String() + "$"}}
		c.CommunitySet = &gobgpapi.MatchSet{Type: gobgpapi.MatchSet_TYPE_ANY, Name: set.Name}
		if cm.Large {
			set.DefinedType = gobgpapi.DefinedType_DEFINED_TYPE_LARGE_COMMUNITY
			c.CommunitySet, c.LargeCommunitySet = nil, c.CommunitySet
		}
		req.DefinedSets = append(req.DefinedSets, set)
	}
	if len(r.ASPathPrefix) > 0 {
		path := append(append([]uint32{}, head...), r.ASPathPrefix...)
		set := &gobgpapi.DefinedSet{DefinedType: gobgpapi.DefinedType_DEFINED_TYPE_AS_PATH, Name: name + "-aspath", List: []string{asPathRegexp(path)}}
		req.DefinedSets = append(req.DefinedSets, set)
		c.AsPathSet = &gobgpapi.MatchSet{Type: gobgpapi.MatchSet_TYPE_ANY, Name: set.Name}
	}
	stmtName := fmt.Sprintf("%s-%s-rule%d", policy, peerSet, i)
	if !r.Accept {
		return []*gobgpapi.Statement{{Name: stmtName, Conditions: c, Actions: &gobgpapi.Actions{RouteAction: gobgpapi.RouteAction_ROUTE_ACTION_REJECT}}}
	}
	ops := r.Operations
	var out []*gobgpapi.Statement
	for k := len(ops.Prepend) - 1; k >= 1; k-- {
		run := ops.Prepend[k]
		out = append(out, &gobgpapi.Statement{
			Name:       fmt.Sprintf("%s-prepend%d", stmtName, k),
			Conditions: proto.Clone(c).(*gobgpapi.Conditions),
			Actions:    &gobgpapi.Actions{RouteAction: gobgpapi.RouteAction_ROUTE_ACTION_UNSPECIFIED, AsPrepend: &gobgpapi.AsPrependAction{Asn: run.ASN, Repeat: run.Repeat}},
		})
	}
	a := proto.Clone(accept).(*gobgpapi.Actions)
	addOperations(a, ops)
	return append(out, &gobgpapi.Statement{Name: stmtName, Conditions: c, Actions: a})
}

// addOperations adds an Accept rule's operations (but the prepend's runs
// after the first) to a.
func addOperations(a *gobgpapi.Actions, ops RuleOperations) {
	for _, c := range ops.AddCommunities {
		ca := &a.Community
		if c.Large {
			ca = &a.LargeCommunity
		}
		if *ca == nil {
			*ca = &gobgpapi.CommunityAction{Type: gobgpapi.CommunityAction_TYPE_ADD}
		}
		(*ca).Communities = append((*ca).Communities, c.String())
	}
	if len(ops.Prepend) > 0 {
		a.AsPrepend = &gobgpapi.AsPrependAction{Asn: ops.Prepend[0].ASN, Repeat: ops.Prepend[0].Repeat}
	}
	if ops.LocalPref != nil {
		a.LocalPref = &gobgpapi.LocalPrefAction{Value: *ops.LocalPref}
	}
}

// nextHopStatements adds, first in the dynamic export policy, a statement
// per peer with NextHop Self or Keep: the route's next hop set to this
// node's session address, respectively left as it was before GoBGP's own
// rewrite. They come after the static third-party next-hop policy (Auto),
// so they override it, and neither accept nor reject.
func nextHopStatements(in policyInput, gen string, req *gobgpapi.SetPoliciesRequest, exp *gobgpapi.Policy) {
	for _, mode := range []NextHopMode{NextHopSelf, NextHopKeep} {
		var peers []string
		for _, p := range in.peers {
			if p.NextHop == mode {
				peers = append(peers, hostPrefix(p.Address))
			}
		}
		if len(peers) == 0 {
			continue
		}
		set := gen + "tabby-next-hop-" + strings.ToLower(string(mode))
		req.DefinedSets = append(req.DefinedSets, &gobgpapi.DefinedSet{DefinedType: gobgpapi.DefinedType_DEFINED_TYPE_NEIGHBOR, Name: set, List: peers})
		action := &gobgpapi.NexthopAction{Self: true}
		if mode == NextHopKeep {
			action = &gobgpapi.NexthopAction{Unchanged: true}
		}
		exp.Statements = append(exp.Statements, &gobgpapi.Statement{
			Name:       exp.Name + "-next-hop-" + strings.ToLower(string(mode)),
			Conditions: &gobgpapi.Conditions{NeighborSet: &gobgpapi.MatchSet{Type: gobgpapi.MatchSet_TYPE_ANY, Name: set}},
			Actions:    &gobgpapi.Actions{RouteAction: gobgpapi.RouteAction_ROUTE_ACTION_UNSPECIFIED, Nexthop: action},
		})
	}
}
