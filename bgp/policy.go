package bgp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	gobgpapi "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/server"
	"google.golang.org/protobuf/proto"
)

// The speaker's import and export policy (docs/bgp.md has the table).
//
// GoBGP has per-peer policies only for route-server clients, so both are
// global policies whose statements pick peers with neighbor sets: for
// import GoBGP matches a neighbor set against the peer a path came from,
// for export against the peer it is sent to.
//
// Import, first matching statement decides, default reject:
//  1. our own paths (SetAdvertisements) are accepted;
//  2. an external peer's prefix inside an IP pool is rejected (pools
//     come from cluster peers only);
//  3. an external peer's own import rules (BGPFilters), in order;
//  4. 0.0.0.0/0 or ::/0 from an external peer with AcceptDefault is
//     accepted;
//  5. a cluster peer's prefix inside an IP pool is accepted;
//  6. everything else is rejected.
//
// GoBGP's prefix sets hold one family each, so the pool and default-route
// statements come once per family (IPv6 sets carry a "6" suffix); a
// prefix condition never matches a path of the other family, also when
// inverted (NotIn), so BGPFilter rules, which are IPv4, never touch IPv6
// paths.
//
// Every path accepted from an external peer is tagged with the
// NO_ADVERTISE community; the export policy rejects tagged paths for
// every peer. So a route learned from one external peer never reaches
// another (no transit), nor the cluster, and route reflectors reflect
// cluster routes only. The kernel still gets it (the agent filters with
// FilterLearned).
const (
	importPolicy      = "tabby-import"
	exportPolicy      = "tabby-export"
	communitySet      = "tabby-communities"
	noTransitPolicy   = "tabby-no-transit"
	externalSet       = "tabby-external"
	clusterSet        = "tabby-cluster"
	acceptDefaultSet  = "tabby-accept-default"
	poolSet           = "tabby-pools"
	defaultRouteSet   = "tabby-default-route"
	externalTagSet    = "tabby-external-tag"
	externalCommunity = "65535:65282" // NO_ADVERTISE (RFC 1997)
)

// policyInput is what the policy is built from.
type policyInput struct {
	asn         uint32 // the speaker's AS (Config.ASN)
	peers       []Peer // sorted by address
	pools       []netip.Prefix
	communities []PrefixCommunities // sorted by prefix
	aggregates  []Aggregate         // sorted by prefix
}

func hostPrefix(a netip.Addr) string { return netip.PrefixFrom(a, a.BitLen()).String() }

// communityString renders a standard community as GoBGP reads it ("65001:100").
func communityString(c uint32) string { return fmt.Sprintf("%d:%d", c>>16, c&0xffff) }

// buildPolicies returns the import policy and the dynamic export policy
// for in, with the defined sets they use, every name prefixed with gen
// (see applyPolicy). Policies[0] is the import policy, Policies[1] the
// export one. It is pure.
func buildPolicies(in policyInput, gen string) *gobgpapi.SetPoliciesRequest {
	req := buildImport(in, gen)
	req.Policies = append(req.Policies, buildExport(in, gen, req))
	return req
}

// buildExport returns the export policy that follows the static ones (no
// transit, third-party next hop; see installExport) and adds its defined
// sets to req. Its statements, in order:
//  1. per-pool communities: a route inside a pool gets the pool's
//     communities and large communities (once: removed, then added);
//     these neither accept nor reject, so evaluation goes on;
//  2. pool aggregates: an aggregate is rejected towards cluster peers,
//     and what lies inside an aggregate that is not WithBlocks is
//     rejected towards external peers;
//  3. Service paths (tagged with serviceMarker) are rejected towards
//     cluster peers and stripped of the tag towards the others;
//  4. towards a reflector of this reflector's cluster (OwnRoutesOnly), a
//     route learned over iBGP is rejected;
//  5. each peer's export rules (BGPFilters), in order: the first that
//     matches decides.
//
// A route no statement decides is sent (the assignment's default).
func buildExport(in policyInput, gen string, req *gobgpapi.SetPoliciesRequest) *gobgpapi.Policy {
	exp := &gobgpapi.Policy{Name: gen + exportPolicy}
	for i, pc := range in.communities {
		if !pc.Prefix.IsValid() || len(pc.Communities)+len(pc.LargeCommunities) == 0 {
			continue
		}
		set := fmt.Sprintf("%s%s-%d", gen, communitySet, i)
		p := pc.Prefix.Masked()
		req.DefinedSets = append(req.DefinedSets, &gobgpapi.DefinedSet{DefinedType: gobgpapi.DefinedType_DEFINED_TYPE_PREFIX, Name: set,
			Prefixes: []*gobgpapi.Prefix{{IpPrefix: p.String(), MaskLengthMin: uint32(p.Bits()), MaskLengthMax: uint32(p.Addr().BitLen())}}})
		var std, large []string
		for _, c := range pc.Communities {
			std = append(std, communityString(c))
		}
		for _, c := range pc.LargeCommunities {
			large = append(large, c.String())
		}
		// GoBGP's ADD appends even what the route already carries (a
		// block another node tagged and this one passes on): remove the
		// pool's communities first, then add them, so each appears once.
		for _, op := range []gobgpapi.CommunityAction_Type{gobgpapi.CommunityAction_TYPE_REMOVE, gobgpapi.CommunityAction_TYPE_ADD} {
			a := &gobgpapi.Actions{RouteAction: gobgpapi.RouteAction_ROUTE_ACTION_UNSPECIFIED}
			if len(std) > 0 {
				a.Community = &gobgpapi.CommunityAction{Type: op, Communities: std}
			}
			if len(large) > 0 {
				a.LargeCommunity = &gobgpapi.CommunityAction{Type: op, Communities: large}
			}
			name := fmt.Sprintf("%s-communities%d", exp.Name, i)
			if op == gobgpapi.CommunityAction_TYPE_REMOVE {
				name = fmt.Sprintf("%s-strip%d", exp.Name, i)
			}
			exp.Statements = append(exp.Statements, &gobgpapi.Statement{
				Name:       name,
				Conditions: &gobgpapi.Conditions{PrefixSet: &gobgpapi.MatchSet{Type: gobgpapi.MatchSet_TYPE_ANY, Name: set}},
				Actions:    a,
			})
		}
	}
	nextHopStatements(in, gen, req, exp)
	aggregateStatements(in, gen, req, exp)
	serviceStatements(in, gen, req, exp)
	ownRoutesStatement(in, gen, req, exp)
	for _, p := range in.peers {
		if len(p.Export) == 0 {
			continue
		}
		peerSet := gen + "tabby-export-peer-" + p.Address.String()
		req.DefinedSets = append(req.DefinedSets, &gobgpapi.DefinedSet{DefinedType: gobgpapi.DefinedType_DEFINED_TYPE_NEIGHBOR, Name: peerSet, List: []string{hostPrefix(p.Address)}})
		for i, r := range p.Export {
			exp.Statements = append(exp.Statements, ruleStatements(req, exp.Name, peerSet, i, r,
				&gobgpapi.Actions{RouteAction: gobgpapi.RouteAction_ROUTE_ACTION_ACCEPT}, in.exportPathHead(p))...)
		}
	}
	return exp
}

// clusterSet is the neighbor set of in's cluster peers: the fewest
// prefixes that hold exactly their addresses (coverPrefixes). GoBGP
// matches a neighbor set by a linear scan, per path and peer: with one
// entry per node, a reflector's export to 1,000 clients scanned 1,000
// entries per path and client.
func (in policyInput) clusterSet() []string {
	var addrs []netip.Addr
	for _, p := range in.peers {
		if p.IsCluster() {
			addrs = append(addrs, p.Address)
		}
	}
	return coverPrefixes(addrs)
}

// aggregateStatements adds the pool-aggregate statements of buildExport
// (step 2) to exp and their defined sets to req.
func aggregateStatements(in policyInput, gen string, req *gobgpapi.SetPoliciesRequest, exp *gobgpapi.Policy) {
	cluster, external := in.clusterSet(), []string(nil)
	for _, p := range in.peers {
		if !p.IsCluster() {
			external = append(external, hostPrefix(p.Address))
		}
	}
	var whole, inside []*gobgpapi.Prefix
	for _, a := range in.aggregates {
		p := a.Prefix.Masked()
		if !p.IsValid() || !p.Addr().Is4() {
			continue
		}
		whole = append(whole, &gobgpapi.Prefix{IpPrefix: p.String(), MaskLengthMin: uint32(p.Bits()), MaskLengthMax: uint32(p.Bits())})
		if !a.WithBlocks && p.Bits() < 32 {
			inside = append(inside, &gobgpapi.Prefix{IpPrefix: p.String(), MaskLengthMin: uint32(p.Bits()) + 1, MaskLengthMax: 32})
		}
	}
	reject := &gobgpapi.Actions{RouteAction: gobgpapi.RouteAction_ROUTE_ACTION_REJECT}
	add := func(name string, peers []string, prefixes []*gobgpapi.Prefix) {
		if len(peers) == 0 || len(prefixes) == 0 {
			return
		}
		peerSet, prefixSet := gen+"tabby-export-"+name+"-peers", gen+"tabby-export-"+name
		req.DefinedSets = append(req.DefinedSets,
			&gobgpapi.DefinedSet{DefinedType: gobgpapi.DefinedType_DEFINED_TYPE_NEIGHBOR, Name: peerSet, List: peers},
			&gobgpapi.DefinedSet{DefinedType: gobgpapi.DefinedType_DEFINED_TYPE_PREFIX, Name: prefixSet, Prefixes: prefixes})
		exp.Statements = append(exp.Statements, &gobgpapi.Statement{
			Name: exp.Name + "-" + name,
			Conditions: &gobgpapi.Conditions{
				NeighborSet: &gobgpapi.MatchSet{Type: gobgpapi.MatchSet_TYPE_ANY, Name: peerSet},
				PrefixSet:   &gobgpapi.MatchSet{Type: gobgpapi.MatchSet_TYPE_ANY, Name: prefixSet},
			},
			Actions: reject,
		})
	}
	add("aggregates", cluster, whole)
	add("aggregated", external, inside)
}

// ownRoutesStatement adds buildExport's step 4: towards a peer with
// OwnRoutesOnly (a reflector of this reflector's cluster) a route learned
// over iBGP is rejected, so only this node's own routes go to it.
func ownRoutesStatement(in policyInput, gen string, req *gobgpapi.SetPoliciesRequest, exp *gobgpapi.Policy) {
	var peers []netip.Addr
	for _, p := range in.peers {
		if p.OwnRoutesOnly {
			peers = append(peers, p.Address)
		}
	}
	if len(peers) == 0 {
		return
	}
	peerSet := gen + "tabby-export-same-cluster-peers"
	req.DefinedSets = append(req.DefinedSets, &gobgpapi.DefinedSet{DefinedType: gobgpapi.DefinedType_DEFINED_TYPE_NEIGHBOR, Name: peerSet, List: coverPrefixes(peers)})
	exp.Statements = append(exp.Statements, &gobgpapi.Statement{
		Name: exp.Name + "-same-cluster",
		Conditions: &gobgpapi.Conditions{
			NeighborSet: &gobgpapi.MatchSet{Type: gobgpapi.MatchSet_TYPE_ANY, Name: peerSet},
			RouteType:   gobgpapi.Conditions_ROUTE_TYPE_INTERNAL,
		},
		Actions: &gobgpapi.Actions{RouteAction: gobgpapi.RouteAction_ROUTE_ACTION_REJECT},
	})
}

// serviceStatements adds the Service statements of buildExport (step 3)
// and their defined sets: a path carrying serviceMarker is rejected
// towards cluster peers; towards any other peer the marker is removed and
// evaluation goes on (the peer's BGPFilters still apply).
func serviceStatements(in policyInput, gen string, req *gobgpapi.SetPoliciesRequest, exp *gobgpapi.Policy) {
	marker := serviceMarker.String()
	markerSet := gen + "tabby-service-marker"
	req.DefinedSets = append(req.DefinedSets, &gobgpapi.DefinedSet{DefinedType: gobgpapi.DefinedType_DEFINED_TYPE_LARGE_COMMUNITY, Name: markerSet, List: []string{"^" + marker + "$"}})
	if cluster := in.clusterSet(); len(cluster) > 0 {
		peerSet := gen + "tabby-export-services-peers"
		req.DefinedSets = append(req.DefinedSets, &gobgpapi.DefinedSet{DefinedType: gobgpapi.DefinedType_DEFINED_TYPE_NEIGHBOR, Name: peerSet, List: cluster})
		exp.Statements = append(exp.Statements, &gobgpapi.Statement{
			Name: exp.Name + "-services-cluster",
			Conditions: &gobgpapi.Conditions{
				NeighborSet:       &gobgpapi.MatchSet{Type: gobgpapi.MatchSet_TYPE_ANY, Name: peerSet},
				LargeCommunitySet: &gobgpapi.MatchSet{Type: gobgpapi.MatchSet_TYPE_ANY, Name: markerSet},
			},
			Actions: &gobgpapi.Actions{RouteAction: gobgpapi.RouteAction_ROUTE_ACTION_REJECT},
		})
	}
	exp.Statements = append(exp.Statements, &gobgpapi.Statement{
		Name:       exp.Name + "-services-untag",
		Conditions: &gobgpapi.Conditions{LargeCommunitySet: &gobgpapi.MatchSet{Type: gobgpapi.MatchSet_TYPE_ANY, Name: markerSet}},
		Actions: &gobgpapi.Actions{RouteAction: gobgpapi.RouteAction_ROUTE_ACTION_UNSPECIFIED,
			LargeCommunity: &gobgpapi.CommunityAction{Type: gobgpapi.CommunityAction_TYPE_REMOVE, Communities: []string{marker}}},
	})
}

// buildImport returns the import policy for in and the defined sets it
// uses, every name prefixed with gen. It is pure.
func buildImport(in policyInput, gen string) *gobgpapi.SetPoliciesRequest {
	req := &gobgpapi.SetPoliciesRequest{}
	importPolicy, externalSet, clusterSet, acceptDefaultSet, poolSet, defaultRouteSet :=
		gen+importPolicy, gen+externalSet, gen+clusterSet, gen+acceptDefaultSet, gen+poolSet, gen+defaultRouteSet
	neighborSet := func(name string, addrs []string) {
		req.DefinedSets = append(req.DefinedSets, &gobgpapi.DefinedSet{DefinedType: gobgpapi.DefinedType_DEFINED_TYPE_NEIGHBOR, Name: name, List: addrs})
	}
	prefixSet := func(name string, ps []*gobgpapi.Prefix) {
		req.DefinedSets = append(req.DefinedSets, &gobgpapi.DefinedSet{DefinedType: gobgpapi.DefinedType_DEFINED_TYPE_PREFIX, Name: name, Prefixes: ps})
	}
	any := func(name string) *gobgpapi.MatchSet {
		return &gobgpapi.MatchSet{Type: gobgpapi.MatchSet_TYPE_ANY, Name: name}
	}
	accept := &gobgpapi.Actions{RouteAction: gobgpapi.RouteAction_ROUTE_ACTION_ACCEPT}
	reject := &gobgpapi.Actions{RouteAction: gobgpapi.RouteAction_ROUTE_ACTION_REJECT}
	acceptTagged := &gobgpapi.Actions{
		RouteAction: gobgpapi.RouteAction_ROUTE_ACTION_ACCEPT,
		Community:   &gobgpapi.CommunityAction{Type: gobgpapi.CommunityAction_TYPE_ADD, Communities: []string{externalCommunity}},
	}

	var external, acceptDef []string
	for _, p := range in.peers {
		if !p.IsCluster() {
			external = append(external, hostPrefix(p.Address))
			if p.AcceptDefault {
				acceptDef = append(acceptDef, hostPrefix(p.Address))
			}
		}
	}
	// Per family: the pools, and the default route. families[1] is
	// IPv6; its sets and statements carry a "6" suffix.
	families := [2]struct {
		suffix string
		pools  []*gobgpapi.Prefix
		deflt  string
	}{{"", nil, "0.0.0.0/0"}, {"6", nil, "::/0"}}
	for _, p := range in.pools {
		if !p.IsValid() {
			continue
		}
		f := &families[0]
		if !p.Addr().Is4() {
			f = &families[1]
		}
		f.pools = append(f.pools, &gobgpapi.Prefix{IpPrefix: p.Masked().String(), MaskLengthMin: uint32(p.Bits()), MaskLengthMax: uint32(p.Addr().BitLen())})
	}

	imp := &gobgpapi.Policy{Name: importPolicy}
	stmt := func(name string, c *gobgpapi.Conditions, a *gobgpapi.Actions) {
		imp.Statements = append(imp.Statements, &gobgpapi.Statement{Name: importPolicy + "-" + name, Conditions: c, Actions: a})
	}
	stmt("local", &gobgpapi.Conditions{RouteType: gobgpapi.Conditions_ROUTE_TYPE_LOCAL}, accept)
	for _, f := range families {
		if len(f.pools) > 0 {
			prefixSet(poolSet+f.suffix, f.pools)
		}
	}
	if len(external) > 0 {
		neighborSet(externalSet, external)
		for _, f := range families {
			if len(f.pools) > 0 {
				stmt("external-pools"+f.suffix, &gobgpapi.Conditions{NeighborSet: any(externalSet), PrefixSet: any(poolSet + f.suffix)}, reject)
			}
		}
		for _, p := range in.peers {
			if p.IsCluster() || len(p.Import) == 0 {
				continue
			}
			peerSet := gen + "tabby-peer-" + p.Address.String()
			neighborSet(peerSet, []string{hostPrefix(p.Address)})
			for i, r := range p.Import {
				imp.Statements = append(imp.Statements, ruleStatements(req, importPolicy, peerSet, i, r, acceptTagged, nil)...)
			}
		}
	}
	if len(acceptDef) > 0 {
		neighborSet(acceptDefaultSet, acceptDef)
		for _, f := range families {
			prefixSet(defaultRouteSet+f.suffix, []*gobgpapi.Prefix{{IpPrefix: f.deflt, MaskLengthMin: 0, MaskLengthMax: 0}})
			stmt("accept-default"+f.suffix, &gobgpapi.Conditions{NeighborSet: any(acceptDefaultSet), PrefixSet: any(defaultRouteSet + f.suffix)}, acceptTagged)
		}
	}
	// Cluster nodes are many, often at consecutive addresses: their set is
	// the fewest prefixes that hold exactly them.
	if cluster := in.clusterSet(); len(cluster) > 0 && (len(families[0].pools) > 0 || len(families[1].pools) > 0) {
		neighborSet(clusterSet, cluster)
		for _, f := range families {
			if len(f.pools) > 0 {
				stmt("cluster-pools"+f.suffix, &gobgpapi.Conditions{NeighborSet: any(clusterSet), PrefixSet: any(poolSet + f.suffix)}, accept)
			}
		}
	}

	req.Policies = []*gobgpapi.Policy{imp}
	return req
}

// installExport installs the export policies that never change: no
// transit (reject what carries the external tag) and third-party next
// hops (see nexthop.go). They are added one by one: GoBGP's (v4.8.0, v4.9.0)
// SetPolicies drops the prefix length of a next-hop condition. It returns
// their names in the order the export assignment lists them, before the
// dynamic export policy (see applyPolicy).
func installExport(ctx context.Context, srv *server.BgpServer, subnet, subnet6 netip.Prefix) ([]string, error) {
	sets := []*gobgpapi.DefinedSet{{
		DefinedType: gobgpapi.DefinedType_DEFINED_TYPE_COMMUNITY, Name: externalTagSet, List: []string{"^" + externalCommunity + "$"},
	}}
	policies := []*gobgpapi.Policy{{Name: noTransitPolicy, Statements: []*gobgpapi.Statement{{
		Name:       noTransitPolicy + "-stmt",
		Conditions: &gobgpapi.Conditions{CommunitySet: &gobgpapi.MatchSet{Type: gobgpapi.MatchSet_TYPE_ANY, Name: externalTagSet}},
		Actions:    &gobgpapi.Actions{RouteAction: gobgpapi.RouteAction_ROUTE_ACTION_REJECT},
	}}}}
	if subnet.IsValid() || subnet6.IsValid() {
		set, pol := thirdPartyNextHopPolicy(subnet.Masked(), subnet6)
		sets = append(sets, set)
		policies = append(policies, pol)
	}
	for _, set := range sets {
		if err := srv.AddDefinedSet(ctx, &gobgpapi.AddDefinedSetRequest{DefinedSet: set}); err != nil {
			return nil, fmt.Errorf("adding defined set %s: %w", set.Name, err)
		}
	}
	var names []string
	for _, pol := range policies {
		if err := srv.AddPolicy(ctx, &gobgpapi.AddPolicyRequest{Policy: pol}); err != nil {
			return nil, fmt.Errorf("adding policy %s: %w", pol.Name, err)
		}
		names = append(names, pol.Name)
	}
	return names, nil
}

// rulePrefix is the GoBGP prefix-set entry of r: Equal matches the CIDR
// only, In and NotIn the CIDR and everything inside it (or the lengths
// PrefixLength allows).
func rulePrefix(r FilterRule) *gobgpapi.Prefix {
	c := r.CIDR.Masked()
	lo, hi := uint32(c.Bits()), uint32(c.Addr().BitLen())
	if r.Operator == MatchEqual {
		hi = lo
	} else if pl := r.PrefixLength; pl != nil {
		if pl.Min != 0 {
			lo = max(lo, uint32(pl.Min))
		}
		if pl.Max != 0 {
			hi = uint32(pl.Max)
		}
	}
	return &gobgpapi.Prefix{IpPrefix: c.String(), MaskLengthMin: lo, MaskLengthMax: hi}
}

// SetPolicy implements Speaker.
func (s *speaker) SetPolicy(ctx context.Context, pol Policy) error {
	var errs []error
	var pools []netip.Prefix
	for _, p := range pol.Pools {
		if !p.IsValid() || p.Addr().Is4In6() || p.Addr().Zone() != "" {
			errs = append(errs, fmt.Errorf("pool %v: not an IPv4 or IPv6 prefix", p))
			continue
		}
		pools = append(pools, p.Masked())
	}
	slices.SortFunc(pools, netip.Prefix.Compare)
	pools = slices.Compact(pools)
	var communities []PrefixCommunities
	for _, pc := range pol.Communities {
		if !pc.Prefix.IsValid() || pc.Prefix.Addr().Is4In6() || pc.Prefix.Addr().Zone() != "" {
			errs = append(errs, fmt.Errorf("communities for %v: not an IPv4 or IPv6 prefix", pc.Prefix))
			continue
		}
		if len(pc.Communities)+len(pc.LargeCommunities) > 0 {
			communities = append(communities, PrefixCommunities{Prefix: pc.Prefix.Masked(),
				Communities: slices.Clone(pc.Communities), LargeCommunities: slices.Clone(pc.LargeCommunities)})
		}
	}
	slices.SortStableFunc(communities, func(a, b PrefixCommunities) int { return a.Prefix.Compare(b.Prefix) })
	var aggregates []Aggregate
	for _, a := range pol.Aggregates {
		if !a.Prefix.IsValid() || !a.Prefix.Addr().Is4() {
			errs = append(errs, fmt.Errorf("aggregate %v: not an IPv4 prefix", a.Prefix))
			continue
		}
		aggregates = append(aggregates, Aggregate{Prefix: a.Prefix.Masked(), WithBlocks: a.WithBlocks})
	}
	slices.SortStableFunc(aggregates, func(a, b Aggregate) int { return a.Prefix.Compare(b.Prefix) })

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv == nil || s.stopped {
		return errors.New("speaker not running")
	}
	s.pools, s.communities, s.aggregates = pools, communities, aggregates
	if err := s.applyPolicy(ctx, sortedPeers(s.peers)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// applyPolicy installs the import and export policies for peers, s.pools
// and s.communities when they changed, then has GoBGP re-apply them to
// every established session (soft reset: import from its Adj-RIB-In,
// export to its Adj-RIB-Out; the sessions stay up). Each version gets
// fresh names: the new policies and their sets are added, the import and
// export assignments are switched to them (one call each), and the old
// ones are deleted, so no update ever meets a half-built policy. Called
// with s.mu held.
func (s *speaker) applyPolicy(ctx context.Context, peers []Peer) error {
	in := policyInput{asn: s.cfg.ASN, peers: peers, pools: s.pools, communities: s.communities, aggregates: s.aggregates}
	key := buildPolicies(in, "")
	if s.lastPolicy != nil && proto.Equal(key, s.lastPolicy) {
		return nil
	}
	gen := fmt.Sprintf("v%d-", s.policyGen+1)
	req := buildPolicies(in, gen)
	for _, set := range req.DefinedSets {
		if err := s.srv.AddDefinedSet(ctx, &gobgpapi.AddDefinedSetRequest{DefinedSet: set}); err != nil {
			return fmt.Errorf("adding defined set %s: %w", set.Name, err)
		}
	}
	for _, pol := range req.Policies {
		if err := s.srv.AddPolicy(ctx, &gobgpapi.AddPolicyRequest{Policy: pol}); err != nil {
			return fmt.Errorf("adding policy %s: %w", pol.Name, err)
		}
	}
	exportRefs := []*gobgpapi.Policy{}
	for _, name := range s.staticExport {
		exportRefs = append(exportRefs, &gobgpapi.Policy{Name: name})
	}
	exportRefs = append(exportRefs, &gobgpapi.Policy{Name: req.Policies[1].Name})
	assignments := []*gobgpapi.PolicyAssignment{{
		Name:          "global",
		Direction:     gobgpapi.PolicyDirection_POLICY_DIRECTION_IMPORT,
		Policies:      []*gobgpapi.Policy{{Name: req.Policies[0].Name}},
		DefaultAction: gobgpapi.RouteAction_ROUTE_ACTION_REJECT,
	}, {
		Name:          "global",
		Direction:     gobgpapi.PolicyDirection_POLICY_DIRECTION_EXPORT,
		Policies:      exportRefs,
		DefaultAction: gobgpapi.RouteAction_ROUTE_ACTION_ACCEPT,
	}}
	for _, assign := range assignments {
		var err error
		if s.lastPolicy == nil {
			err = s.srv.AddPolicyAssignment(ctx, &gobgpapi.AddPolicyAssignmentRequest{Assignment: assign})
		} else {
			err = s.srv.SetPolicyAssignment(ctx, &gobgpapi.SetPolicyAssignmentRequest{Assignment: assign})
		}
		if err != nil {
			return fmt.Errorf("assigning %s policy: %w", strings.ToLower(strings.TrimPrefix(assign.Direction.String(), "POLICY_DIRECTION_")), err)
		}
	}
	old := s.lastInstalled
	first := s.lastPolicy == nil
	all, changed := policyResets(s.lastInput, in)
	s.policyGen++
	s.lastPolicy, s.lastInstalled, s.lastInput = key, req, &in

	var errs []error
	if old != nil {
		for _, p := range old.Policies {
			// All: the policy itself, not only its statements (without it
			// GoBGP keeps an empty policy of every generation, and v4.8.0
			// its statements as well). Nothing refers to it any more: the
			// assignments were switched above.
			if err := s.srv.DeletePolicy(ctx, &gobgpapi.DeletePolicyRequest{Policy: p, All: true}); err != nil {
				errs = append(errs, fmt.Errorf("deleting old policy %s: %w", p.Name, err))
			}
		}
		for _, set := range old.DefinedSets {
			if err := s.srv.DeleteDefinedSet(ctx, &gobgpapi.DeleteDefinedSetRequest{DefinedSet: &gobgpapi.DefinedSet{DefinedType: set.DefinedType, Name: set.Name}, All: true}); err != nil {
				errs = append(errs, fmt.Errorf("deleting old defined set %s: %w", set.Name, err))
			}
		}
	}
	if first || (!all && len(changed) == 0) {
		return errors.Join(errs...)
	}
	reqs := []*gobgpapi.ListPeerRequest{{}}
	if !all {
		reqs = peerListRequests(changed)
	}
	var established []string
	for _, r := range reqs {
		err := s.srv.ListPeer(ctx, r, func(p *gobgpapi.Peer) {
			if p.Conf != nil && p.State != nil && p.State.SessionState == gobgpapi.PeerState_SESSION_STATE_ESTABLISHED {
				established = append(established, p.Conf.NeighborAddress)
			}
		})
		if err != nil {
			return fmt.Errorf("listing BGP peers: %w", err)
		}
	}
	s.softResetMu.Lock()
	defer s.softResetMu.Unlock()
	for _, a := range established {
		if addr, err := netip.ParseAddr(a); !all && (err != nil || !slices.Contains(changed, addr)) {
			continue // listed with every peer (peerListRequests)
		}
		if err := s.srv.ResetPeer(ctx, &gobgpapi.ResetPeerRequest{Address: a, Soft: true, Direction: gobgpapi.ResetPeerRequest_DIRECTION_BOTH}); err != nil {
			errs = append(errs, fmt.Errorf("re-applying policy to %s: %w", a, err))
		}
	}
	return errors.Join(errs...)
}

// policyResets says which established sessions a new policy (built from
// in) may treat differently from the last one (built from old), so that
// applyPolicy soft-resets those only: all of them when anything but the
// peer list changed, else the peers in both lists whose settings changed.
// A peer only in the new list has no session yet (SetPeers installs the
// policy before it adds the peer); one only in the old list is about to be
// deleted; and whether a path from or to one peer is accepted depends on
// that peer alone, never on which other peers exist. So a node joining a
// cluster resets no session: on a reflector, each join re-sent every route
// to every client (O(clients²) export evaluations per join).
func policyResets(old *policyInput, in policyInput) (all bool, changed []netip.Addr) {
	if old == nil || old.asn != in.asn || !slices.Equal(old.pools, in.pools) ||
		!reflect.DeepEqual(old.communities, in.communities) || !slices.Equal(old.aggregates, in.aggregates) {
		return true, nil
	}
	before := make(map[netip.Addr]Peer, len(old.peers))
	for _, p := range old.peers {
		before[p.Address] = p
	}
	for _, p := range in.peers {
		if b, ok := before[p.Address]; ok && !reflect.DeepEqual(b, p) {
			changed = append(changed, p.Address)
		}
	}
	return false, changed
}

// sortedPeers returns the values of m sorted by address.
func sortedPeers(m map[netip.Addr]Peer) []Peer {
	out := make([]Peer, 0, len(m))
	for _, p := range m {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Peer) int { return a.Address.Compare(b.Address) })
	return out
}
