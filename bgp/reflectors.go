package bgp

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/tabbynet/tabby/api"
)

// Reflectors that place themselves (BGPConfiguration routeReflectorMode
// Auto, docs/bgp.md). The choice is one record in etcd that every agent
// reads; any agent may propose the next one with Elect and write it with a
// compare-and-swap on the record's revision, so two agents never act on
// different choices for long: the loser of a race re-reads and finds the
// winner's record, which it would have computed too.

// ReflectorChoice is the elected route reflectors per zone.
type ReflectorChoice struct {
	// Zones maps a zone (the value of the zone label; "" for nodes
	// without it) to its reflectors, sorted by node name.
	Zones map[string][]Reflector `json:"zones"`
}

// Reflector is one elected reflector.
type Reflector struct {
	Node string `json:"node"`
	// ClusterID is the zone's route-reflector cluster ID (ZoneClusterID):
	// the reflectors of one zone share it and serve the same clients. The
	// reflectors of different zones peer as non-clients
	// (routeReflectorPeering NonClient, the default) or as each other's
	// clients (Client, Calico's rule); either way a route crosses zones.
	ClusterID string    `json:"clusterID"`
	Since     time.Time `json:"since"`
	// Reason says why the node was elected.
	Reason string `json:"reason"`
}

// ClusterIDOf is node's cluster ID when it is an elected reflector, "".
// A nil choice has no reflectors.
func (c *ReflectorChoice) ClusterIDOf(node string) string {
	if r, ok := c.Find(node); ok {
		return r.ClusterID
	}
	return ""
}

// Find returns node's entry and zone when it is an elected reflector.
func (c *ReflectorChoice) Find(node string) (Reflector, bool) {
	if c == nil {
		return Reflector{}, false
	}
	for _, rs := range c.Zones {
		for _, r := range rs {
			if r.Node == node {
				return r, true
			}
		}
	}
	return Reflector{}, false
}

// Equal reports whether two choices elect the same nodes with the same
// cluster IDs (reasons and times aside).
func (c *ReflectorChoice) Equal(o *ReflectorChoice) bool {
	return slices.Equal(c.members(), o.members())
}

func (c *ReflectorChoice) members() []string {
	var out []string
	if c == nil {
		return nil
	}
	for z, rs := range c.Zones {
		for _, r := range rs {
			out = append(out, z+"\x00"+r.Node+"\x00"+r.ClusterID)
		}
	}
	slices.Sort(out)
	return out
}

// Serves reports whether the reflectors of zone rz serve node (of zone
// z) as their client: those of its own zone; for a node of a zone without
// reflectors, every reflector when every is set (Calico's rule, where the
// reflectors of different zones are each other's clients), else those of
// one zone only, the first in rendezvous order of the node's name. With
// reflectors of different zones as non-clients, a node that were a client
// of several zones' reflectors would have each of them pass its routes to
// the others, which GoBGP v4.8.0 may then prefer (by router ID: it
// neither keeps nor compares CLUSTER_LISTs as RFC 4456 says) over the
// node's own path and never withdraw (TestZoneReflectorRoutes).
func (c *ReflectorChoice) Serves(rz, z, node string, every bool) bool {
	if c == nil || len(c.Zones[rz]) == 0 {
		return false
	}
	if len(c.Zones[z]) > 0 {
		return rz == z
	}
	if every {
		return true
	}
	best := ""
	for zone, rs := range c.Zones {
		if len(rs) == 0 {
			continue
		}
		if best == "" || cmp.Or(cmp.Compare(rendezvous(zone, node), rendezvous(best, node)), cmp.Compare(zone, best)) < 0 {
			best = zone
		}
	}
	return rz == best
}

// Count is the number of elected reflectors.
func (c *ReflectorChoice) Count() int { return len(c.members()) }

// ZoneClusterID is the route-reflector cluster ID of a zone: 244.x.y.z
// with x.y.z the low 24 bits of the FNV-1a hash of the zone's name. Two
// zones sharing one is harmless but for the loop check of RFC 4456 (each
// would drop the other's reflected routes unless its clients also peer
// with the other zone's reflectors), and needs 2^12 zones to be likely.
func ZoneClusterID(zone string) string {
	h := fnv.New32a()
	h.Write([]byte(zone))
	v := h.Sum32()
	return netip.AddrFrom4([4]byte{244, byte(v >> 16), byte(v >> 8), byte(v)}).String()
}

// ElectInput is what Elect decides from.
type ElectInput struct {
	Spec  api.AutoReflectorSpec
	Nodes []*api.Node
	// Live are the nodes whose liveness record (under their agent's
	// lease) exists now.
	Live map[string]bool
	// GoneSince is, for a node not Live, since when the caller has seen
	// it gone (a caller that never saw it live uses its own start).
	GoneSince map[string]time.Time
	Now       time.Time
}

// NextDeadline is the earliest moment after in.Now at which the grace
// period of a node gone from liveness ends, when Elect may then decide
// otherwise with nothing else changing; zero when there is none. An
// elector waits for it (or for an event), not polls.
func (in ElectInput) NextDeadline() time.Time {
	grace := in.Spec.EffectiveReflectorGrace()
	var next time.Time
	for n, since := range in.GoneSince {
		// Elect drops a reflector gone for more than grace.
		at := since.Add(grace + time.Millisecond)
		if in.Live[n] || !at.After(in.Now) {
			continue
		}
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	return next
}

// Elect computes the next choice from prev (nil at first). It is
// deterministic: every agent with the same inputs computes the same
// reflectors. Per zone (the nodes' zone label):
//
//   - a reflector stays while its Node exists, is eligible and in the
//     zone, and its liveness is there or has been gone for at most the
//     grace period (the lease TTL already absorbs missed heartbeats);
//   - a zone with fewer reflectors than routeReflectorsPerZone takes live
//     eligible nodes of the zone in rendezvous-hash order (a hash of zone
//     and node name): joins never move a healthy reflector, and a zone
//     that had too few eligible nodes fills up as nodes join;
//   - a zone with more (the setting lowered) keeps the best-ranked.
//
// changed says the result elects other nodes than prev (then it is to be
// written); dropped explains every reflector that lost its role.
func Elect(prev *ReflectorChoice, in ElectInput) (next *ReflectorChoice, changed bool, dropped []string) {
	want := in.Spec.EffectiveReflectorsPerZone()
	zoneLabel := in.Spec.EffectiveZoneLabel()
	grace := in.Spec.EffectiveReflectorGrace()
	byName := map[string]*api.Node{}
	candidates := map[string][]string{} // zone → live eligible nodes
	for _, n := range in.Nodes {
		if n == nil {
			continue
		}
		byName[n.Metadata.Name] = n
		if in.Live[n.Metadata.Name] && in.Spec.Eligible(n.Metadata.Labels) {
			z := n.Metadata.Labels[zoneLabel]
			candidates[z] = append(candidates[z], n.Metadata.Name)
		}
	}
	next = &ReflectorChoice{Zones: map[string][]Reflector{}}
	kept := map[string]bool{}
	if prev != nil {
		for _, z := range slices.Sorted(maps.Keys(prev.Zones)) {
			for _, r := range prev.Zones[z] {
				why := keepReason(r, z, byName[r.Node], in, zoneLabel, grace)
				if why != "" {
					dropped = append(dropped, fmt.Sprintf("%s (zone %q): %s", r.Node, z, why))
					continue
				}
				next.Zones[z] = append(next.Zones[z], r)
				kept[r.Node] = true
			}
		}
	}
	for _, z := range slices.Sorted(maps.Keys(candidates)) {
		rank := func(a, b string) int {
			return cmp.Or(cmp.Compare(rendezvous(z, a), rendezvous(z, b)), cmp.Compare(a, b))
		}
		cur := next.Zones[z]
		slices.SortFunc(cur, func(a, b Reflector) int { return rank(a.Node, b.Node) })
		if len(cur) > want {
			for _, r := range cur[want:] {
				dropped = append(dropped, fmt.Sprintf("%s (zone %q): routeReflectorsPerZone is %d", r.Node, z, want))
			}
			cur = cur[:want]
		}
		cands := slices.Clone(candidates[z])
		slices.SortFunc(cands, rank)
		for _, name := range cands {
			if len(cur) >= want {
				break
			}
			if kept[name] {
				continue
			}
			cur = append(cur, Reflector{Node: name, ClusterID: ZoneClusterID(z), Since: in.Now.UTC().Truncate(time.Second),
				Reason: fmt.Sprintf("zone %q had %d of %d reflectors; best-ranked live eligible node", z, len(cur), want)})
		}
		next.Zones[z] = cur
	}
	for z, rs := range next.Zones {
		if len(rs) == 0 {
			delete(next.Zones, z)
			continue
		}
		slices.SortFunc(rs, func(a, b Reflector) int { return cmp.Compare(a.Node, b.Node) })
	}
	return next, !next.Equal(prev), dropped
}

// keepReason is "" when reflector r of zone z keeps its role, else why not.
func keepReason(r Reflector, z string, n *api.Node, in ElectInput, zoneLabel string, grace time.Duration) string {
	switch {
	case n == nil:
		return "its Node was deleted"
	case !in.Spec.Eligible(n.Metadata.Labels):
		return "no longer matches routeReflectorNodeSelector"
	case n.Metadata.Labels[zoneLabel] != z:
		return fmt.Sprintf("moved to zone %q", n.Metadata.Labels[zoneLabel])
	case !in.Live[r.Node]:
		if since, ok := in.GoneSince[r.Node]; ok && in.Now.Sub(since) > grace {
			return fmt.Sprintf("liveness gone for %v (grace %v)", in.Now.Sub(since).Truncate(time.Second), grace)
		}
	}
	return ""
}

// rendezvous ranks node within zone (lower is better).
func rendezvous(zone, node string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(zone))
	h.Write([]byte{0})
	h.Write([]byte(node))
	return h.Sum32()
}

// addAutoReflectors adds the sessions of routeReflectorMode Auto, the
// peering an operator would configure by hand (docs/bgp.md): a reflector
// peers with every other reflector (those of its zone share its cluster
// ID; those of other zones are non-clients or, with routeReflectorPeering
// Client, its clients: nodePeer) and with the nodes it serves (its
// clients: those of its zone, and of zones without a reflector as Serves
// says); any other node peers with the reflectors that serve it. Explicit
// BGPPeers keep their sessions.
func (pl *peerPlan) addAutoReflectors() {
	c := pl.reflectors
	if c == nil || len(c.Zones) == 0 {
		return
	}
	zoneLabel := pl.spec.EffectiveZoneLabel()
	myZone := pl.me.labels[zoneLabel]
	meRR, every := pl.me.elected, !pl.electedPeers
	for _, n := range pl.others {
		nz := n.labels[zoneLabel]
		var peer bool
		switch {
		case meRR && n.elected:
			peer = true
		case meRR:
			peer = c.Serves(myZone, nz, n.name, every)
		case n.elected:
			peer = c.Serves(nz, myZone, pl.me.name, every)
		}
		if !peer {
			continue
		}
		a, ok := pl.sessionTo(n, "route reflector")
		if !ok || pl.explicit[a] {
			continue
		}
		p := pl.nodePeer(n, a, n.asn, PeerNode)
		p.Password, p.Keepalive, p.Hold = pl.spec.NodeMeshPassword.Value, pl.keepalive, pl.hold
		p.RestartTime, p.LocalAddress, p.Port = dur(pl.spec.NodeMeshMaxRestartTime), pl.me.localFor(a), pl.listenPort
		pl.result[a] = p
	}
}

// RouterIDFor is the 32-bit BGP router ID of a node without an IPv4
// address: configured (Node spec.bgp.routerID, validated) when set, else
// 240.x.y.z with x.y.z the low 24 bits of the FNV-1a hash of the node's
// name (class E: never a real address). docs/ipv6.md, "IPv6 BGP sessions".
func RouterIDFor(node, configured string) netip.Addr {
	if a, err := netip.ParseAddr(configured); err == nil && a.Is4() && !a.IsUnspecified() {
		return a
	}
	h := fnv.New32a()
	h.Write([]byte(node))
	v := h.Sum32()
	return netip.AddrFrom4([4]byte{240, byte(v >> 16), byte(v >> 8), byte(v)})
}
