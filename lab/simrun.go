package lab

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
)

// simRun is one run of the harness: the real lab, the simulated nodes,
// and the kernel monitors of the real nodes.
type simRun struct {
	o       SimOptions
	l       *Lab
	wg      *sync.WaitGroup
	nodes   []*simNode
	routes  []*kernelMonitor // every real node: `ip monitor route`
	sets    []*kernelMonitor // every client node: its set elements (dataplane.WatchSetElements)
	clients []string         // the real non-reflector nodes
	rrs     []string         // the real reflectors, in lab order
	// zoneRRs are the reflectors' addresses each zone's clients peer with
	// ("" without zones: every reflector); choice is the election they
	// come from (nil without zones).
	zoneRRs map[string][]netip.Addr
	choice  *bgp.ReflectorChoice
	// simBlocks are every simulated node's blocks (simNode.simBlocks).
	simBlocks blockSet
	// reflected is what the observer (the first simulated node) received
	// from each reflector: see simbreakdown.go.
	reflected *reflectLog
	// churnFailures counts the failed operations of the last churn.
	churnFailures int
	// drops logs and counts the simulated sessions that end.
	drops *simDrops
	// floor is the bare watcher the agents' per-event CPU is measured
	// against (simfloor.go); floorDone is closed when it exits.
	floor     *Proc
	floorDone <-chan struct{}
}

// Sim runs the harness (docs/scale.md): it brings up a lab named o.Name,
// grows it through o.Sizes simulated nodes, measures at each size, writes
// the results (o.Out) after each, and takes the lab down.
func Sim(ctx context.Context, o SimOptions) (_ []SimResult, err error) {
	o.Default()
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("invalid sim options: %w", err)
	}
	lo := Options{Name: o.Name, Nodes: o.RealNodes + o.reflectors(), RouteReflectors: o.RouteReflectors,
		RunDir: o.RunDir, BinDir: o.BinDir, EtcdProxy: o.EtcdProxy, Relay: o.Relay, RelayWindow: o.RelayWindow, AgentArgs: o.AgentArgs, ClientAgentArgs: o.ClientAgentArgs, Log: o.Log}
	if o.Zones > 0 {
		lo.RouteReflectors, lo.AutoReflectors, lo.Zones, lo.ReflectorCandidates = 0, o.RouteReflectors, o.Zones, o.reflectors()
		lo.ReflectorPeering = o.ReflectorPeering
	}
	l, err := Up(ctx, lo)
	if err != nil {
		return nil, err
	}
	r := &simRun{o: o, l: l, reflected: newReflectLog()}
	dropLog, closeDropLog, err := openDropLog(o)
	if err != nil {
		return nil, errors.Join(err, l.Down())
	}
	r.drops = newSimDrops(dropLog, r.rrNames(), l.Progress)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		for _, n := range r.nodes {
			err = errors.Join(err, n.close())
		}
		for _, m := range append(r.routes, r.sets...) {
			m.stop()
		}
		err = errors.Join(err, r.stopFloor(), closeDropLog())
		if err != nil && o.Out != "" {
			err = errors.Join(err, keepLabLogs(l, filepath.Join(o.Out, "logs")))
		}
		err = errors.Join(err, l.Down())
	}()
	if err := r.setUp(ctx, &wg); err != nil {
		return nil, err
	}
	var results []SimResult
	for _, size := range o.Sizes {
		res, err := r.step(ctx, size)
		if err != nil {
			return results, fmt.Errorf("at %d simulated nodes: %w", size, err)
		}
		results = append(results, res)
		l.Progress("%d simulated nodes: %s", size, res.summary())
		if err := WriteSimResults(o.Out, results); err != nil {
			return results, err
		}
	}
	return results, nil
}

// setUp adds the sim namespace, the BGP listener, a pod on every client
// node, the policies and the kernel monitors.
func (r *simRun) setUp(ctx context.Context, wg *sync.WaitGroup) error {
	l := r.l
	if err := l.makeSimNet(ctx); err != nil {
		return err
	}
	r.wg = wg
	for i, n := range l.State().Nodes {
		if i < r.o.reflectors() {
			r.rrs = append(r.rrs, n.Name)
		} else {
			r.clients = append(r.clients, n.Name)
		}
		m, err := startMonitor(ctx, n.NetNS, routeTokens, "ip", "-o", "monitor", "route")
		if err != nil {
			return err
		}
		r.routes = append(r.routes, m)
	}
	for _, c := range r.clients {
		if _, err := l.AddPod(ctx, c, "t-"+c, PodOptions{Labels: map[string]string{"app": "sim-target"}}); err != nil {
			return err
		}
		m, err := startElementWatch(ctx, l.State().Node(c).NetNS, l.log)
		if err != nil {
			return err
		}
		r.sets = append(r.sets, m)
	}
	if err := r.readZones(ctx); err != nil {
		return err
	}
	if err := r.startFloor(); err != nil {
		return err
	}
	return r.writePolicies(ctx)
}

// readZones sets zoneRRs: without zones every reflector; with zones the
// choice the real agents elected (Up waited for it to be complete), which
// must be the candidates, RouteReflectors in each zone.
func (r *simRun) readZones(ctx context.Context) error {
	st := r.l.State()
	r.zoneRRs = map[string][]netip.Addr{}
	if r.o.Zones == 0 {
		r.zoneRRs[""] = r.rrAddrs()
		return nil
	}
	c, _, err := r.l.ReflectorChoice(ctx)
	if err != nil {
		return err
	}
	if err := checkSimChoice(c, r.rrs, r.o.Zones, r.o.RouteReflectors); err != nil {
		return err
	}
	r.choice = c
	for _, z := range slices.Sorted(maps.Keys(c.Zones)) {
		var names []string
		for _, rr := range c.Zones[z] {
			r.zoneRRs[z] = append(r.zoneRRs[z], st.Node(rr.Node).IP.Addr())
			names = append(names, rr.Node)
		}
		r.l.Progress("zone %s: reflectors %s (cluster ID %s)", z, strings.Join(names, ", "), c.Zones[z][0].ClusterID)
	}
	return nil
}

// checkSimChoice is nil when choice elects exactly the candidates rrs,
// perZone in each of zones zones.
func checkSimChoice(c *bgp.ReflectorChoice, rrs []string, zones, perZone int) error {
	if c == nil {
		return errors.New("no route reflector elected")
	}
	var elected []string
	for i := range zones {
		z := ZoneName(i)
		if got := len(c.Zones[z]); got != perZone {
			return fmt.Errorf("zone %s has %d elected reflectors, want %d", z, got, perZone)
		}
		for _, rr := range c.Zones[z] {
			elected = append(elected, rr.Node)
		}
	}
	slices.Sort(elected)
	want := slices.Sorted(slices.Values(rrs))
	if c.Count() != len(elected) || !slices.Equal(elected, want) {
		return fmt.Errorf("elected reflectors %v, want the candidates %v", elected, want)
	}
	return nil
}

// checkChoice fails when the elected reflectors changed since readZones:
// the simulated nodes peer by the first choice (they do not follow the
// record as an agent does), so a run whose choice moved is not measured.
func (r *simRun) checkChoice(ctx context.Context) error {
	if r.choice == nil {
		return nil
	}
	c, _, err := r.l.ReflectorChoice(ctx)
	if err != nil {
		return err
	}
	if !c.Equal(r.choice) {
		return fmt.Errorf("the elected reflectors changed during the run (%d now); the simulated nodes peer by the first election", c.Count())
	}
	return nil
}

// simZone is the zone of simulated node i (1-based): round robin, as the
// real nodes' ("" without zones).
func simZone(i, zones int) string {
	if zones == 0 {
		return ""
	}
	return ZoneName((i - 1) % zones)
}

// writePolicies writes o.Policies NetworkPolicies: sim-target selects the
// real pods and admits role=probe; the others select simulated endpoints.
func (r *simRun) writePolicies(ctx context.Context) error {
	s, err := r.l.connect(ctx)
	if err != nil {
		return err
	}
	r.l.Progress("writing %d policies", r.o.Policies)
	tcp := "TCP"
	pol := func(name string, sel, from map[string]string) *api.NetworkPolicy {
		return &api.NetworkPolicy{Metadata: api.ObjectMeta{Name: name, Namespace: simNamespace},
			Spec: api.NetworkPolicySpec{PodSelector: api.LabelSelector{MatchLabels: sel},
				Ingress: []api.NetworkPolicyIngressRule{{From: []api.NetworkPolicyPeer{{PodSelector: &api.LabelSelector{MatchLabels: from}}}},
					{Ports: []api.NetworkPolicyPort{{Protocol: &tcp}}}},
				PolicyTypes: []api.PolicyType{api.PolicyTypeIngress}}}
	}
	objs := []api.Object{pol("sim-target", map[string]string{"app": "sim-target"}, map[string]string{"role": "probe"})}
	for i := 1; i < r.o.Policies; i++ {
		objs = append(objs, pol(fmt.Sprintf("sim-p%d", i), map[string]string{"app": fmt.Sprintf("svc-%d", i%100)},
			map[string]string{"role": fmt.Sprintf("r-%d", i%50)}))
	}
	return parallel(ctx, 16, len(objs), func(i int) error {
		_, err := s.Apply(ctx, objs[i])
		return err
	})
}

// parallel runs fn(0..n-1) on workers goroutines and returns every error.
func parallel(ctx context.Context, workers, n int, fn func(i int) error) error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
		next = make(chan int)
	)
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := fn(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	return errors.Join(append(errs, ctx.Err())...)
}

// simLabels are the labels of simulated endpoint k.
func simLabels(k int) map[string]string {
	return map[string]string{"app": fmt.Sprintf("svc-%d", k%100), "role": fmt.Sprintf("r-%d", k%50)}
}

// grow adds simulated nodes up to size, waits for their sessions and fills
// them with endpoints; the last o.Samples new nodes' first endpoints are
// the block-to-route samples it returns.
func (r *simRun) grow(ctx context.Context, size int) (routeLatencies, error) {
	from := len(r.nodes)
	st := r.l.State()
	eps := st.EtcdEndpoints()
	if st.EtcdProxy != nil {
		eps = []string{st.EtcdProxyURL()}
	}
	r.drops.enter(phaseGrow)
	r.l.Progress("adding simulated nodes sim%d-sim%d", from+1, size)
	added := make([]*simNode, size-from)
	if err := parallel(ctx, 16, size-from, func(i int) error {
		n := newSimNode(from + i + 1)
		n.simBlocks = &r.simBlocks
		n.zone = simZone(from+i+1, r.o.Zones)
		n.rrs = r.zoneRRs[n.zone]
		n.drops = r.drops
		if from+i == 0 {
			n.onUpdate = r.reflected.add
		}
		added[i] = n
		if err := n.connect(ctx, st.SimNS(), eps); err != nil {
			return err
		}
		for _, a := range n.rrs {
			r.wg.Go(func() { n.keepSession(ctx, st.SimNS(), a) })
		}
		return nil
	}); err != nil {
		for _, n := range added {
			if n != nil && n.store != nil {
				err = errors.Join(err, n.close())
			}
		}
		return routeLatencies{}, err
	}
	r.nodes = append(r.nodes, added...)
	if err := r.waitSessions(ctx, added); err != nil {
		return routeLatencies{}, err
	}
	nSamples := min(r.o.Samples, len(added))
	fill, samples := added[:len(added)-nSamples], added[len(added)-nSamples:]
	r.drops.enter(phaseFill)
	r.l.Progress("adding %d endpoints", len(added)*r.o.EndpointsPerNode)
	if err := parallel(ctx, 32, len(fill), func(i int) error { return r.fill(ctx, fill[i], 0) }); err != nil {
		return routeLatencies{}, err
	}
	var lat routeLatencies
	lat.quiet, lat.missing = r.waitQuiet(ctx)
	if err := r.waitStable(ctx, "the block samples"); err != nil {
		return lat, err
	}
	r.drops.enter(phaseSamples)
	for _, n := range samples {
		if err := r.sample(ctx, n, &lat); err != nil {
			return lat, err
		}
	}
	return lat, nil
}

// fill adds node n's endpoints from the have-th on.
func (r *simRun) fill(ctx context.Context, n *simNode, have int) error {
	for k := have; k < r.o.EndpointsPerNode; k++ {
		if _, _, err := n.addEndpoint(ctx, simLabels(k)); err != nil {
			return err
		}
	}
	return nil
}

// waitSessions waits until every node has a session with each of its
// reflectors.
func (r *simRun) waitSessions(ctx context.Context, nodes []*simNode) error {
	r.l.Progress("waiting for %d simulated nodes' sessions with the reflectors", len(nodes))
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var missing []string
	err := Poll(ctx, 200*time.Millisecond, func() (bool, error) {
		missing = missing[:0]
		for _, n := range nodes {
			if n.established() < len(n.rrs) {
				missing = append(missing, n.name)
			}
		}
		return len(missing) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("sessions of %d simulated nodes not established (first %v): %w", len(missing), missing[:min(5, len(missing))], err)
	}
	return nil
}
