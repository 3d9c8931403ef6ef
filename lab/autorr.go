package lab

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/bgp/session"
	"github.com/tabbynet/tabby/datastore"
)

// Automatic route reflectors (Options.AutoReflectors): the nodes are spread
// over Options.Zones zones by the label api.DefaultZoneLabel, the mesh is
// off and the agents elect the reflectors (docs/bgp.md, "Reflectors that
// place themselves"). No reflector is chosen when the agents start.

// ReflectorCandidateLabel marks the nodes that may be elected in a lab
// with Options.ReflectorCandidates (routeReflectorNodeSelector requires it).
const ReflectorCandidateLabel = "tabby.io/reflector-candidate"

// ZoneName is the zone label value of the i-th zone (0-based).
func ZoneName(i int) string { return fmt.Sprintf("zone-%c", 'a'+i%26) }

// configureAutoReflectors turns the mesh off, sets routeReflectorMode Auto
// and gives every node a zone: its Node resource is created with the zone
// label before its agent starts (the agent keeps labels).
func (l *Lab) configureAutoReflectors(ctx context.Context, o Options) error {
	s, err := l.connect(ctx)
	if err != nil {
		return err
	}
	progress(l.log, "automatic route reflectors: %d per zone in %d zones, node-to-node mesh off, zones peer as %s", o.AutoReflectors, o.Zones, cmp.Or(o.ReflectorPeering, api.ReflectorPeeringNonClient))
	off := false
	per := uint32(o.AutoReflectors)
	spec := api.BGPConfigurationSpec{NodeToNodeMeshEnabled: &off}
	spec.RouteReflectorMode, spec.RouteReflectorsPerZone = api.RouteReflectorModeAuto, &per
	if o.ReflectorCandidates > 0 {
		spec.RouteReflectorNodeSelector = &api.LabelSelector{MatchLabels: map[string]string{ReflectorCandidateLabel: "true"}}
	}
	spec.RouteReflectorPeering = o.ReflectorPeering
	if o.ReflectorGrace > 0 {
		spec.RouteReflectorGracePeriod = &api.Duration{Duration: o.ReflectorGrace}
	}
	bc := &api.BGPConfiguration{Metadata: api.ObjectMeta{Name: api.SingletonName}, Spec: spec}
	if _, err := s.Apply(ctx, bc); err != nil {
		return fmt.Errorf("writing BGPConfiguration: %w", err)
	}
	for _, n := range l.State().Nodes {
		if err := l.registerZone(ctx, n.Name); err != nil {
			return err
		}
	}
	return nil
}

// registerZone gives a node of an automatic-reflector lab the next zone
// (round robin by its position) and writes its Node resource with the
// zone label (and ReflectorCandidateLabel on the first
// State.ReflectorCandidates nodes), before its agent starts.
func (l *Lab) registerZone(ctx context.Context, node string) error {
	s, err := l.connect(ctx)
	if err != nil {
		return err
	}
	var n NodeState
	if err := l.Update(func(st *State) error {
		i := slices.IndexFunc(st.Nodes, func(x NodeState) bool { return x.Name == node })
		if i < 0 {
			return fmt.Errorf("no node %q", node)
		}
		st.Nodes[i].Zone = ZoneName(i % max(st.Zones, 1))
		st.Nodes[i].NotCandidate = st.ReflectorCandidates > 0 && i >= st.ReflectorCandidates
		n = st.Nodes[i]
		return nil
	}); err != nil {
		return err
	}
	labels := map[string]string{api.DefaultZoneLabel: n.Zone}
	if !n.NotCandidate && l.State().ReflectorCandidates > 0 {
		labels[ReflectorCandidateLabel] = "true"
	}
	obj := &api.Node{
		Metadata: api.ObjectMeta{Name: n.Name, Labels: labels},
		Spec:     api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: prefixOrEmpty(n.IP), IPv6Address: prefixOrEmpty(n.IP6)}},
	}
	if _, err := s.Apply(ctx, obj); err != nil {
		return fmt.Errorf("writing Node %s: %w", n.Name, err)
	}
	return nil
}

// ReflectorChoice reads the elected route reflectors (nil when none is
// recorded yet) and the record's revision.
func (l *Lab) ReflectorChoice(ctx context.Context) (*bgp.ReflectorChoice, int64, error) {
	s, err := l.connect(ctx)
	if err != nil {
		return nil, 0, err
	}
	kv, err := s.GetKV(ctx, datastore.BGPReflectorsKey)
	if errors.Is(err, datastore.ErrNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	c := &bgp.ReflectorChoice{}
	if err := json.Unmarshal(kv.Value, c); err != nil {
		return nil, 0, fmt.Errorf("decoding %s: %w", datastore.BGPReflectorsKey, err)
	}
	return c, kv.ModRevision, nil
}

// ReflectorHistory is every value the reflector record took since the lab
// began, oldest first (etcd's history of the key; the lab's etcd does not
// compact).
func (l *Lab) ReflectorHistory(ctx context.Context) ([]*bgp.ReflectorChoice, error) {
	s, err := l.connect(ctx)
	if err != nil {
		return nil, err
	}
	_, rev, err := l.ReflectorChoice(ctx)
	if err != nil || rev == 0 {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out []*bgp.ReflectorChoice
	for ev := range s.Watch(wctx, datastore.BGPReflectorsKey, 1) {
		if ev.Type == datastore.EventResync {
			return nil, fmt.Errorf("the history of %s is compacted", datastore.BGPReflectorsKey)
		}
		if ev.Type == datastore.EventPut {
			c := &bgp.ReflectorChoice{}
			if err := json.Unmarshal(ev.KV.Value, c); err != nil {
				return nil, fmt.Errorf("decoding %s at revision %d: %w", datastore.BGPReflectorsKey, ev.KV.ModRevision, err)
			}
			out = append(out, c)
			if ev.KV.ModRevision >= rev {
				return out, nil
			}
		}
	}
	return nil, fmt.Errorf("reading the history of %s: %w", datastore.BGPReflectorsKey, wctx.Err())
}

// autoExpectedPeers is, per node of nodes (those with a running agent),
// the underlay addresses of the nodes it should have sessions with under
// choice (the peering of bgp's addAutoReflectors; every: a node of a zone
// without reflectors is served by every reflector, as with
// routeReflectorPeering Client), or an error while the choice lacks
// reflectors (perZone, or all the candidates a zone has) for a zone.
func autoExpectedPeers(nodes []NodeState, perZone int, c *bgp.ReflectorChoice, every bool) (map[string][]string, error) {
	live := map[string]NodeState{}
	inZone := map[string]int{}
	for _, n := range nodes {
		live[n.Name] = n
		if !n.NotCandidate {
			inZone[n.Zone]++
		}
	}
	if c == nil {
		return nil, errors.New("no route reflector elected yet")
	}
	for z, k := range inZone {
		if got := len(c.Zones[z]); got != min(k, perZone) {
			return nil, fmt.Errorf("zone %q has %d reflectors, want %d", z, got, min(k, perZone))
		}
	}
	want := map[string][]string{}
	for name, n := range live {
		_, nRR := c.Find(name)
		want[name] = []string{}
		for oname, o := range live {
			_, oRR := c.Find(oname)
			if oname == name || !(nRR && oRR || nRR && c.Serves(n.Zone, o.Zone, oname, every) || oRR && c.Serves(o.Zone, n.Zone, name, every)) {
				continue
			}
			want[name] = append(want[name], o.IP.Addr().String())
		}
		slices.Sort(want[name])
	}
	return want, nil
}

// autoEstablished is nil when the reflector choice is complete and every
// node with a running agent has exactly the sessions the choice gives it,
// all Established; else what is missing.
func (l *Lab) autoEstablished(ctx context.Context, st *State) error {
	c, _, err := l.ReflectorChoice(ctx)
	if err != nil {
		return err
	}
	var running []NodeState
	for _, n := range st.Nodes {
		if n.Agent != nil && n.Agent.Alive() {
			running = append(running, n)
		}
	}
	want, err := autoExpectedPeers(running, st.AutoReflectors, c, st.ReflectorPeering == api.ReflectorPeeringClient)
	if err != nil {
		return err
	}
	var errs []error
	for name, addrs := range want {
		s, err := l.NodeStatus(ctx, name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var got, down []string
		for _, p := range s.Peers {
			got = append(got, p.Address)
			if p.State != session.Established.String() {
				down = append(down, p.Address+" "+p.State)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, addrs) || len(down) > 0 {
			errs = append(errs, fmt.Errorf("%s: sessions %v (not established: %v), want %v", name, got, down, addrs))
		}
	}
	return errors.Join(errs...)
}
