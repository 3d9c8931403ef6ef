package bgp

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
)

// zoneNodes makes n nodes per zone, named <zone>-<i>, with 198.18.<z>.<i>.
func zoneNodes(zones []string, n int) []*api.Node {
	var out []*api.Node
	for z, zone := range zones {
		for i := range n {
			out = append(out, node(fmt.Sprintf("%s-%d", zone, i), fmt.Sprintf("198.18.%d.%d/16", z, i+1), withLabels(api.DefaultZoneLabel, zone)))
		}
	}
	return out
}

func liveAll(nodes []*api.Node) map[string]bool {
	m := map[string]bool{}
	for _, n := range nodes {
		m[n.Metadata.Name] = true
	}
	return m
}

func electedNames(c *ReflectorChoice) map[string][]string {
	out := map[string][]string{}
	for z, rs := range c.Zones {
		for _, r := range rs {
			out[z] = append(out[z], r.Node)
		}
	}
	return out
}

// TestElect: from none, each zone gets routeReflectorsPerZone live
// eligible nodes; the choice is stable under joins, a missed heartbeat
// shorter than the grace, and recomputation; a reflector gone for longer
// than the grace is replaced by the next-ranked node of its zone, and
// only it; an ineligible node is never elected.
func TestElect(t *testing.T) {
	nodes := zoneNodes([]string{"a", "b"}, 4)
	nodes = append(nodes, node("c-0", "198.18.9.1/16", withLabels(api.DefaultZoneLabel, "c", "no-rr", "true")))
	notIn := &api.LabelSelector{MatchExpressions: []api.LabelSelectorRequirement{{Key: "no-rr", Operator: api.OpDoesNotExist}}}
	spec := api.AutoReflectorSpec{RouteReflectorMode: api.RouteReflectorModeAuto, RouteReflectorNodeSelector: notIn}
	now := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	in := ElectInput{Spec: spec, Nodes: nodes, Live: liveAll(nodes), Now: now}
	first, changed, _ := Elect(nil, in)
	if !changed || first.Count() != 4 {
		t.Fatalf("first election: changed %v, %v", changed, electedNames(first))
	}
	if _, ok := first.Zones["c"]; ok {
		t.Errorf("zone c's only node is not eligible, yet elected: %v", electedNames(first))
	}
	// Recomputing, or the same inputs elsewhere, changes nothing.
	if again, changed, _ := Elect(first, in); changed || !again.Equal(first) {
		t.Fatalf("recomputed: changed %v, %v", changed, electedNames(again))
	}
	// Nodes join: no healthy reflector moves.
	joined := append(zoneNodes([]string{"a", "b"}, 8), nodes[8])
	in2 := ElectInput{Spec: spec, Nodes: joined, Live: liveAll(joined), Now: now.Add(time.Minute)}
	if next, changed, _ := Elect(first, in2); changed {
		t.Fatalf("joins moved reflectors: %v → %v", electedNames(first), electedNames(next))
	}
	// A reflector's liveness goes: kept within the grace, replaced after.
	victim := first.Zones["a"][0].Node
	in2.Live = liveAll(joined)
	delete(in2.Live, victim)
	in2.GoneSince = map[string]time.Time{victim: in2.Now}
	in2.Now = in2.Now.Add(api.DefaultRouteReflectorGrace)
	if _, changed, _ := Elect(first, in2); changed {
		t.Fatal("a reflector was replaced within the grace period")
	}
	in2.Now = in2.Now.Add(time.Second)
	next, changed, dropped := Elect(first, in2)
	if !changed || len(dropped) != 1 {
		t.Fatalf("after the grace: changed %v, dropped %v", changed, dropped)
	}
	want := electedNames(first)
	got := electedNames(next)
	if cmp.Diff(want["b"], got["b"]) != "" || len(got["a"]) != 2 || got["a"][0] == victim || got["a"][1] == victim {
		t.Errorf("after %s left: %v, was %v", victim, got, want)
	}
	stay := want["a"][1]
	if got["a"][0] != stay && got["a"][1] != stay {
		t.Errorf("the healthy reflector %s of zone a lost its role: %v", stay, got)
	}
	// Lowering the count keeps the best-ranked per zone.
	one := uint32(1)
	in2.Spec.RouteReflectorsPerZone = &one
	low, _, _ := Elect(next, in2)
	if low.Count() != 2 {
		t.Errorf("one per zone: %v", electedNames(low))
	}
}

// TestAutoReflectorPeering: auto mode's sessions are manual mode's: a
// client peers with its zone's reflectors, a reflector with every other
// reflector and its zone's clients, with the reflector types. Elected
// reflectors of different zones are non-clients (type rr) by default and
// each other's clients with routeReflectorPeering Client (Calico's rule);
// a reflector set by hand (operator's cluster ID, not elected) keeps
// Calico's rule towards elected ones; NonClient falls back to Calico's
// rule while two elected reflectors share no address family. Of two
// elected reflectors of one zone, the first elected keeps the other its
// client, and sends it every route until the other reported ready for
// its election, then its own routes only; the later one is a non-client
// of the first, sending it its own routes only throughout.
func TestAutoReflectorPeering(t *testing.T) {
	nodes := zoneNodes([]string{"a", "b"}, 3)
	f := false
	cfg := &api.BGPConfiguration{Spec: api.BGPConfigurationSpec{NodeToNodeMeshEnabled: &f,
		AutoReflectorSpec: api.AutoReflectorSpec{RouteReflectorMode: api.RouteReflectorModeAuto}}}
	choice := &ReflectorChoice{Zones: map[string][]Reflector{
		"a": {{Node: "a-0", ClusterID: ZoneClusterID("a")}, {Node: "a-1", ClusterID: ZoneClusterID("a")}},
		"b": {{Node: "b-0", ClusterID: ZoneClusterID("b")}},
	}}
	peersOf := func(self string) map[string]string {
		ps, refused := PlanPeers(PeerInput{Self: self, Nodes: nodes, Config: cfg, Reflectors: choice})
		if len(refused) > 0 {
			t.Errorf("%s refused %v", self, refused)
		}
		out := map[string]string{}
		for _, p := range ps {
			out[p.Name] = string(p.Type)
		}
		return out
	}
	check := func(what string, tests map[string]map[string]string) {
		t.Helper()
		for self, want := range tests {
			if d := cmp.Diff(want, peersOf(self)); d != "" {
				t.Errorf("%s: %s peers (-want +got):\n%s", what, self, d)
			}
		}
	}
	check("default (NonClient)", map[string]map[string]string{
		"a-2": {"a-0": "rr", "a-1": "rr"},
		"b-1": {"b-0": "rr"},
		"a-0": {"a-1": "rr-client", "a-2": "rr-client", "b-0": "rr"},
		"a-1": {"a-0": "rr", "a-2": "rr-client", "b-0": "rr"},
		"b-0": {"a-0": "rr", "a-1": "rr", "b-1": "rr-client", "b-2": "rr-client"},
	})
	cfg.Spec.RouteReflectorPeering = api.ReflectorPeeringClient
	check("Client", map[string]map[string]string{
		"a-2": {"a-0": "rr", "a-1": "rr"},
		"a-0": {"a-1": "rr", "a-2": "rr-client", "b-0": "rr-client"},
		"b-0": {"a-0": "rr-client", "a-1": "rr-client", "b-1": "rr-client", "b-2": "rr-client"},
	})
	// Same-zone reflectors send each other their own routes only with
	// NonClient once the later elected reported ready; with Client
	// (main's behaviour) they pass on all.
	var ready map[string]time.Time
	ownOnly := func(self, peer string) bool {
		ps, _ := PlanPeers(PeerInput{Self: self, Nodes: nodes, Config: cfg, Reflectors: choice, Ready: ready})
		for _, p := range ps {
			if p.Name == peer {
				return p.OwnRoutesOnly
			}
		}
		t.Fatalf("%s has no session to %s", self, peer)
		return false
	}
	if ownOnly("a-0", "a-1") {
		t.Error("Client: a-0 sends a-1 its own routes only")
	}
	cfg.Spec.RouteReflectorPeering = api.ReflectorPeeringNonClient
	if ownOnly("a-0", "a-1") || !ownOnly("a-1", "a-0") || ownOnly("a-0", "b-0") {
		t.Errorf("NonClient, a-1 not ready: own routes only a-0 → a-1 %v (want false), a-1 → a-0 %v (want true), a-0 → b-0 %v (want false)",
			ownOnly("a-0", "a-1"), ownOnly("a-1", "a-0"), ownOnly("a-0", "b-0"))
	}
	// A report for an earlier election of a-1 does not count.
	since := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	choice.Zones["a"][1].Since = since
	ready = map[string]time.Time{"a-1": since.Add(-time.Hour)}
	if ownOnly("a-0", "a-1") {
		t.Error("NonClient, a-1 ready for an earlier election: a-0 sends it its own routes only")
	}
	ready["a-1"] = since
	if !ownOnly("a-0", "a-1") || !ownOnly("a-1", "a-0") {
		t.Errorf("NonClient, a-1 ready: own routes only a-0 → a-1 %v, a-1 → a-0 %v, want both", ownOnly("a-0", "a-1"), ownOnly("a-1", "a-0"))
	}
	// Elected later, a-0 is the non-client and a-1 the one that waits.
	choice.Zones["a"][0].Since = since.Add(time.Minute)
	check("a-0 elected after a-1", map[string]map[string]string{
		"a-0": {"a-1": "rr", "a-2": "rr-client", "b-0": "rr"},
		"a-1": {"a-0": "rr-client", "a-2": "rr-client", "b-0": "rr"},
	})
	if ownOnly("a-1", "a-0") {
		t.Error("NonClient, a-0 elected later and not ready: a-1 sends it its own routes only")
	}
	choice.Zones["a"][0].Since, choice.Zones["a"][1].Since, ready = time.Time{}, time.Time{}, nil
	// An operator's cluster ID: on an elected node it wins and the node
	// stays an elected reflector (a non-client of every other); on a node that is
	// not elected (b-2) it makes a reflector below the elected ones: b-0
	// makes it its client (Calico's rule), b-2 does not make b-0 its
	// client.
	nodes[1].Spec.BGP.RouteReflectorClusterID = "10.0.0.1"
	nodes[5].Spec.BGP.RouteReflectorClusterID = "10.0.0.2"
	check("operator's cluster IDs", map[string]map[string]string{
		"a-0": {"a-1": "rr-client", "a-2": "rr-client", "b-0": "rr"},
		"a-1": {"a-0": "rr", "a-2": "rr-client", "b-0": "rr"},
		"b-0": {"a-0": "rr", "a-1": "rr", "b-1": "rr-client", "b-2": "rr-client"},
		"b-2": {"b-0": "rr"},
	})
	nodes[1].Spec.BGP.RouteReflectorClusterID, nodes[5].Spec.BGP.RouteReflectorClusterID = "", ""
	// b-0 with IPv6 only cannot peer with a-0 and a-1 (IPv4 only): the
	// routes between their zones need Calico's rule (a third reflector
	// passes them on), so it applies to every pair.
	v4 := nodes[3].Spec.BGP.IPv4Address
	nodes[3].Spec.BGP.IPv4Address, nodes[3].Spec.BGP.IPv6Address = "", "fd00::3/64"
	nodes = append(nodes, node("c-0", "198.18.7.1/16", withLabels(api.DefaultZoneLabel, "c"), withIPv6("fd00::7/64")))
	choice.Zones["c"] = []Reflector{{Node: "c-0", ClusterID: ZoneClusterID("c")}}
	check("no common family", map[string]map[string]string{
		"c-0": {"a-0": "rr-client", "a-1": "rr-client", "b-0": "rr-client"},
	})
	nodes[3].Spec.BGP.IPv4Address, nodes[3].Spec.BGP.IPv6Address = v4, ""
	nodes = nodes[:len(nodes)-1]
	delete(choice.Zones, "c")
	// Manual mode ignores the choice.
	cfg.Spec.RouteReflectorMode = ""
	if got := peersOf("a-2"); len(got) != 0 {
		t.Errorf("manual mode, mesh off: %v", got)
	}
}

// TestRouterIDFor: a configured router ID wins; otherwise a stable
// class-E ID from the name, different for different names.
func TestRouterIDFor(t *testing.T) {
	if got := RouterIDFor("n1", "10.0.0.7"); got.String() != "10.0.0.7" {
		t.Errorf("configured: %v", got)
	}
	a, b := RouterIDFor("n1", ""), RouterIDFor("n2", "")
	if a != RouterIDFor("n1", "") || a == b || a.As4()[0] != 240 || b.As4()[0] != 240 {
		t.Errorf("derived: n1 %v, n2 %v", a, b)
	}
}

// TestElectNextDeadline: an elector sleeps until the first grace period
// that has not ended; Elect at that moment drops the reflector it covers.
func TestElectNextDeadline(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	grace := api.DefaultRouteReflectorGrace
	nodes := zoneNodes([]string{"a"}, 4)
	in := ElectInput{Nodes: nodes, Live: liveAll(nodes), GoneSince: map[string]time.Time{}, Now: t0}
	if d := in.NextDeadline(); !d.IsZero() {
		t.Fatalf("all live: deadline %v, want none", d)
	}
	first, _, _ := Elect(nil, in)
	gone := first.Zones["a"][0].Node
	delete(in.Live, gone)
	in.GoneSince[gone] = t0
	in.GoneSince["a-x"] = t0.Add(-2 * grace) // long gone: its grace is over
	in.Now = t0.Add(grace / 2)
	d := in.NextDeadline()
	if want := t0.Add(grace + time.Millisecond); !d.Equal(want) {
		t.Fatalf("deadline %v, want %v (the end of %s's grace)", d, want, gone)
	}
	if _, changed, _ := Elect(first, in); changed {
		t.Fatalf("Elect changed the choice before the deadline")
	}
	in.Now = d
	if _, changed, dropped := Elect(first, in); !changed || len(dropped) != 1 {
		t.Fatalf("Elect at the deadline: changed %v, dropped %v; want %s dropped", changed, dropped, gone)
	}
	in.Live[gone] = true
	if d := in.NextDeadline(); !d.IsZero() {
		t.Errorf("back live: deadline %v, want none", d)
	}
}

// TestServes: a node is served by its zone's reflectors; a node of a zone
// without reflectors by every reflector with Calico's rule (every), else
// by one zone's only, the same for every caller, and not the same zone for
// every node.
func TestServes(t *testing.T) {
	c := &ReflectorChoice{Zones: map[string][]Reflector{
		"a": {{Node: "a-0"}}, "b": {{Node: "b-0"}}, "c": {{Node: "c-0"}},
	}}
	zones := []string{"a", "b", "c", "d"}
	if !c.Serves("a", "a", "x", false) || c.Serves("b", "a", "x", false) || c.Serves("d", "d", "x", true) {
		t.Error("a node of a zone with reflectors must be served by its zone's only; a zone without reflectors serves nobody")
	}
	picked := map[string]int{}
	for i := range 30 {
		node := fmt.Sprintf("d-%d", i)
		var by []string
		for _, z := range zones {
			if c.Serves(z, "d", node, false) {
				by = append(by, z)
			}
			if c.Serves(z, "d", node, true) != (z != "d") {
				t.Errorf("every: zone %s serves %s: %v", z, node, c.Serves(z, "d", node, true))
			}
		}
		if len(by) != 1 {
			t.Fatalf("%s (zone d, no reflectors) served by %v, want one zone", node, by)
		}
		picked[by[0]]++
	}
	if len(picked) < 2 {
		t.Errorf("30 nodes of a zone without reflectors all went to %v", picked)
	}
}
