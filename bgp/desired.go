package bgp

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tabbynet/tabby/api"
)

// nodeInfo is what DesiredPeers needs to know about a node.
type nodeInfo struct {
	name      string
	addr      netip.Addr // IPv4 underlay address, invalid when the node has none
	addr6     netip.Addr // IPv6 underlay address, invalid when the node has none
	asn       uint32
	clusterID string
	labels    map[string]string
	// elected: the node is a reflector of Auto mode's choice, since
	// electedSince (Reflector.Since).
	elected      bool
	electedSince time.Time
}

// newNodeInfo is n's nodeInfo; ok is false when n has neither an IPv4 nor
// an IPv6 address.
func newNodeInfo(n *api.Node, defaultASN uint32) (nodeInfo, bool) {
	ni := nodeInfo{name: n.Metadata.Name, asn: defaultASN, labels: n.Metadata.Labels}
	if p, ok := n.IPv4(); ok {
		ni.addr = p.Addr()
	}
	if p, ok := n.IPv6(); ok {
		ni.addr6 = p.Addr()
	}
	if !ni.addr.IsValid() && !ni.addr6.IsValid() {
		return nodeInfo{}, false
	}
	if b := n.Spec.BGP; b != nil {
		if b.ASNumber != nil {
			ni.asn = *b.ASNumber
		}
		ni.clusterID = b.RouteReflectorClusterID
	}
	return ni, true
}

// sessionWith is the address of the session between self (me) and n: IPv4
// when both have an IPv4 address (IPv6 then rides on it, MP-BGP), else
// IPv6 when both have an IPv6 address; ok is false when they share no
// family.
func (me nodeInfo) sessionWith(n nodeInfo) (remote netip.Addr, ok bool) {
	switch {
	case me.addr.IsValid() && n.addr.IsValid():
		return n.addr, true
	case me.addr6.IsValid() && n.addr6.IsValid():
		return n.addr6, true
	}
	return netip.Addr{}, false
}

// localFor is self's address of peer's family, invalid when self has none.
func (me nodeInfo) localFor(peer netip.Addr) netip.Addr {
	if peer.Is4() {
		return me.addr
	}
	return me.addr6
}

// isSelf reports whether a is one of self's addresses.
func (me nodeInfo) isSelf(a netip.Addr) bool {
	return a.IsValid() && (a == me.addr || a == me.addr6)
}

// DesiredPeers computes the BGP sessions node self should have.
//
//   - With the node-to-node mesh enabled (the default), self peers with every
//     other node that has an IPv4 address (type "mesh", plain iBGP even
//     between route reflectors, password nodeMeshPassword).
//   - BGPPeer resources apply whether or not the mesh is enabled. A BGPPeer
//     applies to self when it is global (neither node nor nodeSelector),
//     names self, or its nodeSelector matches self's labels. It then adds a
//     session to its peerIP (type "global" or "node") and to every other
//     node its peerSelector matches.
//   - Between two cluster nodes in the same AS (iBGP), when self has a
//     route-reflector cluster ID and the peer node does not have the same
//     one, the peer is self's reflector client (RRClient, type
//     "rr-client"); a peer node that has a cluster ID is typed "rr". This is
//     Calico's rule, so two reflectors with different cluster IDs treat each
//     other as clients. The exception: with routeReflectorMode Auto and
//     routeReflectorPeering NonClient (its default), two elected
//     reflectors of different zones are non-clients of each other (type
//     "rr"); of two of one zone the first elected keeps the later its
//     client, sending it every route until it reported ready
//     (PeerInput.Ready), then its own only, and the later treats the
//     first as a non-client; a reflector set by hand (an
//     operator's cluster ID on a node not elected) is a client of the
//     elected reflectors it peers with, which it treats as non-clients and
//     sends its own routes only (OwnRoutesOnly: they serve its clients
//     themselves). This holds unless the elected reflectors cannot all
//     peer with each other (one has IPv4 only, another IPv6 only): see
//     reflectorsMeshed. Mesh sessions never set RRClient.
//   - Two reflectors of the same cluster ID send each other their own
//     routes only (OwnRoutesOnly) when every reflector has that cluster
//     ID or with NonClient peering; with reflectors of several cluster
//     IDs as each other's clients (Calico's rule) they pass on all.
//   - An explicit peerIP in self's own AS is also made a reflector client
//     when self is a reflector and the address is not a reflector of the
//     same cluster.
//
// The ASN of a node is its spec.bgp.asNumber, else the configuration's
// asNumber, else 64512. Timers come from the BGPPeer, else from the
// configuration. LocalAddress is self's address unless the BGPPeer's
// sourceAddress is "None". The result has one entry per address (explicit
// BGPPeers beat the mesh; among BGPPeers the one with the smallest name
// wins), never self's own address, sorted by address. It is nil when self is
// unknown or has no address (see PlanPeers).
//
// A BGPPeer's acceptDefault, maxPrefixes, bfd and filters apply to every
// session it makes. Its filters are looked up by name in filters; their
// importV4 rules become Peer.Import and their exportV4 rules Peer.Export,
// concatenated in the order the BGPPeer lists them. A filter that does not
// exist or does not validate is left out (UnusableFilters names them).
func DesiredPeers(self string, nodes []*api.Node, cfg *api.BGPConfiguration, peers []*api.BGPPeer, filters []*api.BGPFilter) []Peer {
	out, _ := PlanPeers(PeerInput{Self: self, Nodes: nodes, Config: cfg, Peers: peers, Filters: filters})
	return out
}

// PeerInput is what PlanPeers computes a node's sessions from.
type PeerInput struct {
	Self    string
	Nodes   []*api.Node
	Config  *api.BGPConfiguration
	Peers   []*api.BGPPeer
	Filters []*api.BGPFilter
	// Reflectors is the cluster's elected reflectors (routeReflectorMode
	// Auto, see Elect); nil or ignored in manual mode.
	Reflectors *ReflectorChoice
	// Ready holds, per elected reflector that reported it, the election
	// (its Reflector.Since) for which it has every session its role asks
	// for established and their End-of-RIB: until then a reflector of its
	// zone elected before it keeps sending it every route, as to the
	// client it was (make before break, docs/bgp.md "Promotion").
	Ready map[string]time.Time
}

// RefusedPeer is a session PlanPeers leaves out because of the
// configuration, with the reason (shown by tabbyctl node status).
type RefusedPeer struct {
	Address netip.Addr // invalid when the peer has no usable address
	Name    string     // the BGPPeer or the peer node
	Reason  string
}

// PlanPeers is DesiredPeers with the sessions it leaves out and why: a
// peer of an address family self has no underlay address of (an IPv6
// peerIP on a node without spec.bgp.ipv6Address, a node sharing no family
// with self). Sessions between two nodes use IPv4 when both have an IPv4
// address (IPv6 routes ride on it) and IPv6 otherwise; a session's local
// address is self's address of the peer's family. With
// routeReflectorMode Auto the elected reflectors (in.Reflectors) are
// reflectors as if their routeReflectorClusterID were set, and
// addAutoReflectors adds the sessions an operator would have configured
// with BGPPeers.
func PlanPeers(in PeerInput) ([]Peer, []RefusedPeer) {
	pl, ok := newPeerPlan(in)
	if !ok {
		return nil, nil
	}
	sorted := slices.Clone(in.Peers)
	sorted = slices.DeleteFunc(sorted, func(p *api.BGPPeer) bool { return p == nil })
	slices.SortFunc(sorted, func(a, b *api.BGPPeer) int { return cmp.Compare(a.Metadata.Name, b.Metadata.Name) })
	for _, bp := range sorted {
		pl.addBGPPeer(bp)
	}
	if pl.spec.RouteReflectorMode == api.RouteReflectorModeAuto {
		pl.addAutoReflectors()
	}
	if pl.spec.NodeToNodeMeshEnabled == nil || *pl.spec.NodeToNodeMeshEnabled {
		pl.addMesh()
	}
	out := make([]Peer, 0, len(pl.result))
	for _, p := range pl.result {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Peer) int { return a.Address.Compare(b.Address) })
	slices.SortFunc(pl.refused, func(a, b RefusedPeer) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), a.Address.Compare(b.Address))
	})
	return out, slices.Compact(pl.refused)
}

// peerPlan is DesiredPeers' work in progress: the inputs it derived and
// the sessions chosen so far.
type peerPlan struct {
	spec            api.BGPConfigurationSpec
	listenPort      uint16 // 0 for the default port
	keepalive, hold time.Duration
	me              nodeInfo
	others          []nodeInfo // the other nodes with an address, by name
	byAddr          map[netip.Addr]nodeInfo
	usable          map[string]*api.BGPFilter // see usableFilters
	reflectors      *ReflectorChoice          // Auto mode's choice, nil without one
	// electedPeers: no node makes an elected reflector its client
	// (routeReflectorPeering NonClient and reflectorsMeshed).
	electedPeers bool
	// oneCluster: every reflector has the same cluster ID, so no two
	// reflectors are each other's clients by Calico's rule.
	oneCluster bool
	// ready: see PeerInput.Ready.
	ready map[string]time.Time

	result   map[netip.Addr]Peer
	explicit map[netip.Addr]bool // addresses a BGPPeer gave a session
	refused  []RefusedPeer
}

// newPeerPlan derives the plan's inputs; ok is false when self is unknown
// or has no address.
func newPeerPlan(in PeerInput) (*peerPlan, bool) {
	// Sized once: grown node by node, the map and the list of a thousand
	// nodes were twice their size in garbage on every BGP pass.
	pl := &peerPlan{byAddr: make(map[netip.Addr]nodeInfo, len(in.Nodes)), others: make([]nodeInfo, 0, len(in.Nodes)),
		result: map[netip.Addr]Peer{}, explicit: map[netip.Addr]bool{}}
	if in.Config != nil {
		pl.spec = in.Config.Spec
	}
	defaultASN := api.DefaultASNumber
	if pl.spec.ASNumber != nil {
		defaultASN = *pl.spec.ASNumber
	}
	if lp := pl.spec.ListenPort; lp != nil && *lp != api.DefaultListenPort {
		pl.listenPort = *lp
	}
	pl.keepalive, pl.hold = dur(pl.spec.KeepaliveTime), dur(pl.spec.HoldTime)
	if pl.spec.RouteReflectorMode == api.RouteReflectorModeAuto {
		pl.reflectors = in.Reflectors
		pl.ready = in.Ready
	}
	found := false
	firstID := ""
	pl.oneCluster = true
	for _, n := range in.Nodes {
		if n == nil {
			continue
		}
		ni, ok := newNodeInfo(n, defaultASN)
		if r, elected := pl.reflectors.Find(ni.name); elected {
			ni.elected, ni.electedSince = true, r.Since
			if ni.clusterID == "" {
				ni.clusterID = r.ClusterID
			}
		}
		if ni.clusterID != "" {
			firstID = cmp.Or(firstID, ni.clusterID)
			pl.oneCluster = pl.oneCluster && ni.clusterID == firstID
		}
		if n.Metadata.Name == in.Self {
			if !ok {
				return nil, false
			}
			pl.me, found = ni, true
			continue
		}
		if ok {
			pl.others = append(pl.others, ni)
			for _, a := range []netip.Addr{ni.addr, ni.addr6} {
				if _, dup := pl.byAddr[a]; a.IsValid() && !dup {
					pl.byAddr[a] = ni
				}
			}
		}
	}
	slices.SortFunc(pl.others, func(a, b nodeInfo) int { return cmp.Compare(a.name, b.name) })
	pl.usable = usableFilters(in.Filters)
	pl.electedPeers = found && pl.reflectors != nil &&
		pl.spec.EffectiveReflectorPeering() == api.ReflectorPeeringNonClient && pl.reflectorsMeshed()
	return pl, found
}

// reflectorsMeshed reports whether every elected reflector with an address
// has a session with every other (addAutoReflectors peers each pair), the
// condition for peering them as non-clients: RFC 4456 reflects a route
// learned from a non-client to clients only, so a zone's routes then reach
// another zone's reflectors only directly from the origin zone's. Two
// reflectors share no address family when one has IPv4 only and another
// IPv6 only; the routes between their zones then need a third reflector
// to pass them on, which only Calico's rule (each the other's client)
// does.
func (pl *peerPlan) reflectorsMeshed() bool {
	only4, only6 := false, false
	note := func(n nodeInfo) {
		if n.elected {
			only4 = only4 || !n.addr6.IsValid()
			only6 = only6 || !n.addr.IsValid()
		}
	}
	note(pl.me)
	for _, n := range pl.others {
		note(n)
	}
	return !(only4 && only6)
}

// addExplicit adds a BGPPeer's session unless an earlier BGPPeer (by name)
// has one to the address already, or it is self.
func (pl *peerPlan) addExplicit(p Peer) {
	if pl.me.isSelf(p.Address) || pl.explicit[p.Address] {
		return
	}
	pl.explicit[p.Address] = true
	pl.result[p.Address] = p
}

// sessionTo is the session address towards node n; when self and n share
// no address family it records why under name and returns false.
func (pl *peerPlan) sessionTo(n nodeInfo, name string) (netip.Addr, bool) {
	a, ok := pl.me.sessionWith(n)
	if !ok {
		pl.refused = append(pl.refused, RefusedPeer{Name: name,
			Reason: fmt.Sprintf("node %s shares no address family with this node (%s; it has %s)", n.name, families(pl.me), families(n))})
	}
	return a, ok
}

// families describes the underlay addresses of a node.
func families(n nodeInfo) string {
	var fs []string
	if n.addr.IsValid() {
		fs = append(fs, "IPv4 "+n.addr.String())
	}
	if n.addr6.IsValid() {
		fs = append(fs, "IPv6 "+n.addr6.String())
	}
	return strings.Join(fs, ", ")
}

// nodePeer is a session to cluster node n, with the reflector relationship
// between self and n filled in.
func (pl *peerPlan) nodePeer(n nodeInfo, addr netip.Addr, asn uint32, typ PeerType) Peer {
	me := pl.me
	p := Peer{Address: addr, ASN: asn, Type: typ, Name: n.name, Port: pl.listenPort, ClusterNode: true}
	if asn != me.asn {
		return p
	}
	zl := pl.spec.EffectiveZoneLabel()
	sameZone := pl.electedPeers && n.elected && me.elected && n.labels[zl] == me.labels[zl]
	switch {
	case sameZone && electedBefore(me, n):
		// Two elected reflectors of one zone: the one elected first
		// keeps the other its client (as it was before its election)
		// and sends it every route until it reports its own sessions
		// ready (pl.ready), then its own routes only. Flipping the
		// client flag would re-create the session, and sending own
		// routes only at once left the new reflector, and the other
		// zones' route to it, without a path until its sessions with
		// the other zones' reflectors were up (docs/bgp.md,
		// "Promotion").
		p.RRClient, p.Type, p.OwnRoutesOnly = true, PeerRRClient, pl.isReady(n)
	case me.clusterID != "" && n.clusterID != me.clusterID && !(pl.electedPeers && n.elected):
		p.RRClient, p.Type = true, PeerRRClient
	case n.clusterID != "":
		// A reflector set by hand sends the elected ones its own
		// routes only: they serve its clients themselves, and a
		// client's route that also reached them through it would be
		// a second path GoBGP may prefer and then keep (Serves).
		// So do two elected reflectors of one zone (serving the same
		// clients) whatever their cluster IDs (the later elected
		// towards the earlier, a non-client to it), and two
		// reflectors of one cluster ID; but not while reflectors of
		// different cluster IDs are each other's clients (Calico's
		// rule), whose cycles only the copies between same-cluster
		// reflectors held still (docs/bgp.md, "Peering").
		below := pl.electedPeers && n.elected && !me.elected && me.clusterID != ""
		sameCluster := n.clusterID == me.clusterID && (pl.electedPeers || pl.oneCluster)
		p.Type, p.OwnRoutesOnly = PeerRR, sameCluster || below || sameZone
	}
	return p
}

// electedBefore reports whether elected reflector a was elected before b:
// by Reflector.Since, then by name, so that both sides agree.
func electedBefore(a, b nodeInfo) bool {
	if c := a.electedSince.Compare(b.electedSince); c != 0 {
		return c < 0
	}
	return a.name < b.name
}

// isReady reports whether elected reflector n reported its sessions ready
// for its current election (PeerInput.Ready).
func (pl *peerPlan) isReady(n nodeInfo) bool {
	at, ok := pl.ready[n.name]
	return ok && at.Equal(n.electedSince)
}

// addBGPPeer adds the sessions one BGPPeer gives self.
func (pl *peerPlan) addBGPPeer(bp *api.BGPPeer) {
	s := bp.Spec
	// appliesTo says whether the BGPPeer's node/nodeSelector picks n.
	appliesTo := func(name string, labels map[string]string) bool {
		switch {
		case s.Node != "":
			return s.Node == name
		case s.NodeSelector != nil:
			return s.NodeSelector.Matches(labels)
		}
		return true
	}
	forward := appliesTo(pl.me.name, pl.me.labels)
	// A session needs both ends configured: when the peerSelector picks
	// self, self peers with every node the BGPPeer applies to (as Calico
	// does for node-to-node BGPPeers).
	reverse := s.PeerSelector != nil && s.PeerSelector.Matches(pl.me.labels)
	if reverse {
		for _, n := range pl.others {
			if appliesTo(n.name, n.labels) {
				pl.addSelected(bp, n)
			}
		}
	}
	if !forward {
		return
	}
	if s.PeerIP != "" {
		if p, ok := pl.peerIPSession(bp); ok {
			pl.addExplicit(pl.applySpec(bp, p))
		}
	}
	if s.PeerSelector != nil {
		for _, n := range pl.others {
			if s.PeerSelector.Matches(n.labels) {
				pl.addSelected(bp, n)
			}
		}
	}
}

// addSelected adds the session to node n that BGPPeer bp selects.
func (pl *peerPlan) addSelected(bp *api.BGPPeer, n nodeInfo) {
	if a, ok := pl.sessionTo(n, "bgppeer/"+bp.Metadata.Name); ok {
		pl.addExplicit(pl.applySpec(bp, pl.nodePeer(n, a, n.asn, PeerNode)))
	}
}

// peerIPSession is the session to a BGPPeer's peerIP (a cluster node or a
// router outside the cluster), before its spec is applied; ok is false
// when the peerIP does not parse.
func (pl *peerPlan) peerIPSession(bp *api.BGPPeer) (Peer, bool) {
	s := bp.Spec
	addr, port, ok := parsePeerIP(s.PeerIP)
	if !ok {
		return Peer{}, false
	}
	if !pl.me.localFor(addr).IsValid() {
		fam, field := "IPv6", "spec.bgp.ipv6Address"
		if addr.Is4() {
			fam, field = "IPv4", "spec.bgp.ipv4Address"
		}
		pl.refused = append(pl.refused, RefusedPeer{Address: addr, Name: "bgppeer/" + bp.Metadata.Name,
			Reason: fmt.Sprintf("spec.peerIP %s is %s and node %s has no %s address (%s)", addr, fam, pl.me.name, fam, field)})
		return Peer{}, false
	}
	var p Peer
	if n, isNode := pl.byAddr[addr]; isNode {
		asn := n.asn
		if s.ASNumber != 0 {
			asn = s.ASNumber
		}
		p = pl.nodePeer(n, addr, asn, PeerNode)
	} else {
		p = Peer{Address: addr, ASN: s.ASNumber, Type: PeerNode, Name: bp.Metadata.Name}
		if p.ASN == 0 {
			p.ASN = pl.me.asn
		}
		if p.ASN == pl.me.asn && pl.me.clusterID != "" {
			p.RRClient = true
		}
	}
	if s.Node == "" && s.NodeSelector == nil && p.Type == PeerNode {
		p.Type = PeerGlobal
	}
	if port != 0 {
		p.Port = port
	}
	return p, true
}

// applySpec sets what a BGPPeer says of every session it makes: password,
// timers, source address, default route, prefix limit, BFD, local AS,
// next hop and filters.
func (pl *peerPlan) applySpec(bp *api.BGPPeer, p Peer) Peer {
	s := bp.Spec
	p.Password, p.PasswordRef = s.Password.Value, s.Password.SecretKeyRef
	p.Keepalive, p.Hold = pl.keepalive, pl.hold
	if s.KeepaliveTime != nil {
		p.Keepalive = s.KeepaliveTime.Duration
	}
	if s.HoldTime != nil {
		p.Hold = s.HoldTime.Duration
	}
	p.RestartTime = dur(s.MaxRestartTime)
	if s.SourceAddress != api.SourceAddressNone {
		p.LocalAddress = pl.me.localFor(p.Address)
	}
	p.AcceptDefault = s.AcceptDefault
	p.MaxPrefixes = s.MaxPrefixes
	if b := s.BFD; b != nil && b.Enabled {
		p.BFD = &BFD{Interval: b.EffectiveInterval(), Multiplier: uint8(min(b.EffectiveMultiplier(), 255))}
	}
	// A cluster node peers as its own AS: a local AS would break the
	// session from the other end (LocalASProblems reports it).
	if !p.ClusterNode && s.LocalASNumber != 0 && s.LocalASNumber != pl.me.asn {
		p.LocalASN = s.LocalASNumber
	}
	switch s.EffectiveNextHopMode() {
	case api.NextHopModeSelf:
		p.NextHop = NextHopSelf
	case api.NextHopModeKeep:
		p.NextHop = NextHopKeep
	}
	local := pl.me.asn
	if p.LocalASN != 0 {
		local = p.LocalASN
	}
	ebgp := p.ASN != local
	for _, name := range s.Filters {
		if f, ok := pl.usable[name]; ok {
			// A rule matches routes of its own family only, so the IPv6
			// rules after the IPv4 ones keep the order within each family.
			p.Import = append(p.Import, filterRules(f.Spec.ImportV4, false, ebgp)...)
			p.Import = append(p.Import, filterRules(f.Spec.ImportV6, true, ebgp)...)
			p.Export = append(p.Export, filterRules(f.Spec.ExportV4, false, ebgp)...)
			p.Export = append(p.Export, filterRules(f.Spec.ExportV6, true, ebgp)...)
		}
	}
	return p
}

// addMesh adds a full-mesh session to every other node no BGPPeer gave
// one.
func (pl *peerPlan) addMesh() {
	spec := pl.spec
	for _, n := range pl.others {
		a, ok := pl.sessionTo(n, "mesh")
		if !ok || pl.me.isSelf(a) || pl.explicit[a] {
			continue
		}
		if _, dup := pl.result[a]; dup {
			continue
		}
		pl.result[a] = Peer{
			Address: a, ASN: n.asn, Type: PeerMesh, Name: n.name, ClusterNode: true,
			Password: spec.NodeMeshPassword.Value, Keepalive: pl.keepalive, Hold: pl.hold,
			RestartTime: dur(spec.NodeMeshMaxRestartTime), LocalAddress: pl.me.localFor(a), Port: pl.listenPort,
		}
	}
}

// usableFilters indexes the filters that validate by name.
func usableFilters(filters []*api.BGPFilter) map[string]*api.BGPFilter {
	out := map[string]*api.BGPFilter{}
	for _, f := range filters {
		if f != nil && f.Validate() == nil {
			out[f.Metadata.Name] = f
		}
	}
	return out
}

// UnusableFilters describes, sorted, every filter a BGPPeer names that
// DesiredPeers leaves out because it does not exist or does not validate
// (only a datastore written around tabbyctl holds such a filter).
func UnusableFilters(peers []*api.BGPPeer, filters []*api.BGPFilter) []string {
	byName := map[string]*api.BGPFilter{}
	for _, f := range filters {
		if f != nil {
			byName[f.Metadata.Name] = f
		}
	}
	var out []string
	for _, p := range peers {
		if p == nil {
			continue
		}
		for _, name := range p.Spec.Filters {
			f, ok := byName[name]
			switch {
			case !ok:
				out = append(out, "bgppeer/"+p.Metadata.Name+": bgpfilter/"+name+" not found")
			case f.Validate() != nil:
				out = append(out, "bgppeer/"+p.Metadata.Name+": bgpfilter/"+name+" is invalid: "+strings.ReplaceAll(f.Validate().Error(), "\n", "; "))
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// filterRules converts validated BGPFilter rules of one family (v6: an
// importV6/exportV6 list) for a session that is eBGP or not: a rule
// without a cidr matches every prefix of the family, a cidr without an
// operator means In, and a rule for the other peer type is left out.
func filterRules(rules []api.BGPFilterRule, v6, ebgp bool) []FilterRule {
	all := netip.MustParsePrefix("0.0.0.0/0")
	if v6 {
		all = netip.MustParsePrefix("::/0")
	}
	out := make([]FilterRule, 0, len(rules))
	for _, r := range rules {
		if (r.PeerType == api.FilterPeerEBGP && !ebgp) || (r.PeerType == api.FilterPeerIBGP && ebgp) {
			continue
		}
		fr := FilterRule{CIDR: all, Operator: MatchIn, Accept: r.Action == api.FilterActionAccept}
		if r.CIDR != "" {
			fr.CIDR = netip.MustParsePrefix(r.CIDR) // validated
			if r.MatchOperator != "" {
				fr.Operator = MatchOperator(r.MatchOperator)
			}
		}
		if pl := r.PrefixLength; pl != nil {
			fr.PrefixLength = &PrefixLengthRange{}
			if pl.Min != nil {
				fr.PrefixLength.Min = uint8(*pl.Min)
			}
			if pl.Max != nil {
				fr.PrefixLength.Max = uint8(*pl.Max)
			}
		}
		if c := r.Communities; c != nil && len(c.Values) == 1 {
			if fc, err := api.ParseFilterCommunity(c.Values[0]); err == nil { // validated
				fr.Community = &fc
			}
		}
		fr.ASPathPrefix = slices.Clone(r.ASPathPrefix)
		fr.Operations = ruleOperations(r.Operations)
		out = append(out, fr)
	}
	return out
}

// ruleOperations converts validated BGPFilter operations.
func ruleOperations(ops []api.BGPFilterOperation) RuleOperations {
	var out RuleOperations
	for _, op := range ops {
		switch {
		case op.AddCommunity != nil:
			if fc, err := api.ParseFilterCommunity(op.AddCommunity.Value); err == nil {
				out.AddCommunities = append(out.AddCommunities, fc)
			}
		case op.PrependASPath != nil:
			out.Prepend = append(out.Prepend, api.ASRuns(op.PrependASPath.Prefix)...)
		case op.SetLocalPreference != nil:
			v := op.SetLocalPreference.Value
			out.LocalPref = &v
		}
	}
	return out
}

// LocalASProblems describes, sorted, every BGPPeer whose localASNumber
// DesiredPeers ignores because its peerIP is a cluster node's address
// (cluster nodes peer as their own AS numbers).
func LocalASProblems(nodes []*api.Node, peers []*api.BGPPeer) []string {
	// The usual case, no peer setting a local AS, costs no map of every
	// node (this runs on every BGP pass, at rest too).
	if !slices.ContainsFunc(peers, func(p *api.BGPPeer) bool { return p != nil && p.Spec.LocalASNumber != 0 }) {
		return nil
	}
	addrs := map[netip.Addr]string{}
	for _, n := range nodes {
		if n == nil {
			continue
		}
		if p, ok := n.IPv4(); ok {
			addrs[p.Addr()] = n.Metadata.Name
		}
	}
	var out []string
	for _, p := range peers {
		if p == nil || p.Spec.LocalASNumber == 0 || p.Spec.PeerIP == "" {
			continue
		}
		if a, _, ok := parsePeerIP(p.Spec.PeerIP); ok && addrs[a] != "" {
			out = append(out, fmt.Sprintf("bgppeer/%s: spec.localASNumber %d ignored: spec.peerIP %s is node %s, which peers as its own AS number",
				p.Metadata.Name, p.Spec.LocalASNumber, a, addrs[a]))
		}
	}
	slices.Sort(out)
	return out
}

// PoolCommunities returns the communities of every pool that has some
// (IPPool bgpCommunities, bgpLargeCommunities), for Policy.Communities.
// Pools whose CIDR does not parse are left out, as are communities that do
// not parse.
func PoolCommunities(pools []*api.IPPool) []PrefixCommunities {
	var out []PrefixCommunities
	for _, p := range pools {
		if p == nil || len(p.Spec.BGPCommunities)+len(p.Spec.BGPLargeCommunities) == 0 {
			continue
		}
		cidr, err := p.Prefix()
		if err != nil {
			continue
		}
		pc := PrefixCommunities{Prefix: cidr}
		for _, c := range p.Spec.BGPCommunities {
			if n, err := api.ParseCommunity(c); err == nil && !slices.Contains(pc.Communities, n) {
				pc.Communities = append(pc.Communities, n)
			}
		}
		for _, c := range p.Spec.BGPLargeCommunities {
			if n, err := api.ParseLargeCommunity(c); err == nil && !slices.Contains(pc.LargeCommunities, n) {
				pc.LargeCommunities = append(pc.LargeCommunities, n)
			}
		}
		if len(pc.Communities)+len(pc.LargeCommunities) > 0 {
			out = append(out, pc)
		}
	}
	slices.SortStableFunc(out, func(a, b PrefixCommunities) int { return a.Prefix.Compare(b.Prefix) })
	return out
}

// PoolAggregates returns the pools advertised as aggregates (IPPool
// bgpAggregate), for Policy.Aggregates and AddAggregates. Pools that do
// not parse or are not exported (disableBGPExport) are left out.
func PoolAggregates(pools []*api.IPPool) []Aggregate {
	var out []Aggregate
	for _, p := range pools {
		if p == nil || p.Spec.DisableBGPExport {
			continue
		}
		if p.Spec.BGPAggregate != api.AggregateOnly && p.Spec.BGPAggregate != api.AggregateWithBlocks {
			continue
		}
		cidr, err := p.Prefix()
		if err != nil || !cidr.Addr().Is4() {
			continue
		}
		out = append(out, Aggregate{Prefix: cidr.Masked(), WithBlocks: p.Spec.BGPAggregate == api.AggregateWithBlocks})
	}
	slices.SortFunc(out, func(a, b Aggregate) int { return a.Prefix.Compare(b.Prefix) })
	return slices.CompactFunc(out, func(a, b Aggregate) bool { return a.Prefix == b.Prefix })
}

// AddAggregates returns adv (sorted, without duplicates) plus the CIDR of
// every aggregate that holds one of adv's prefixes: a node advertises a
// pool's aggregate while it advertises a block or a borrowed address in
// it, so that a router sends traffic for the pool only to nodes that hold
// part of it.
func AddAggregates(adv []netip.Prefix, aggs []Aggregate) []netip.Prefix {
	out := slices.Clone(adv)
	for _, a := range aggs {
		if slices.ContainsFunc(adv, func(p netip.Prefix) bool { return p.Bits() > a.Prefix.Bits() && a.Prefix.Contains(p.Addr()) }) {
			out = append(out, a.Prefix)
		}
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return slices.Compact(out)
}

// parsePeerIP accepts "198.18.0.1", "198.18.0.1:1790" and "[addr]:port".
func parsePeerIP(s string) (netip.Addr, uint16, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), 0, true
	}
	host, portStr, err := net.SplitHostPort(s)
	if err != nil {
		return netip.Addr{}, 0, false
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, 0, false
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return netip.Addr{}, 0, false
	}
	return a.Unmap(), uint16(port), true
}

func dur(d *api.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return d.Duration
}

// Block is an IPAM block (affine or borrowed address) as the BGP side sees it.
type Block struct {
	CIDR             netip.Prefix
	DisableBGPExport bool
}

// DesiredAdvertisements returns the prefixes to originate: every affine
// block and every borrowed /32 whose pool allows BGP export, masked, sorted
// and without duplicates.
func DesiredAdvertisements(affine []Block, borrowed []Block) []netip.Prefix {
	var out []netip.Prefix
	for _, list := range [][]Block{affine, borrowed} {
		for _, b := range list {
			if b.DisableBGPExport || !b.CIDR.IsValid() {
				continue
			}
			out = append(out, b.CIDR.Masked())
		}
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return slices.Compact(out)
}
