package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/tabbynet/tabby/agent/routetable"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/syncer"
)

// wiringGrace is how long the routes of an interface that CNI ADD wired are
// kept without an endpoint in the view; ADD stores the endpoint well within
// it, and a failed ADD withdraws them at once (Unwire).
const wiringGrace = 30 * time.Second

// routeOwner computes this node's local route classes — a host route per
// local workload address (workload), a blackhole per affine block
// (blackhole) and per advertised pool aggregate (aggregate) — and hands
// them to the route table, the one writer of the kernel's routes. Its
// workload class is the view's endpoints of this node plus the interfaces
// CNI ADD is wiring right now (felix's grace for a pod being set up, kept
// in one place), so a learned route never takes the place of a pod's route
// while its endpoint is still on its way to the view.
type routeOwner struct {
	node  string
	view  *syncer.Syncer
	table *routetable.Table
	log   *slog.Logger
	sub   *syncer.Signal
	kick  chan struct{}

	// mu serialises passes with Wire, so that a pass never drops a route
	// that Wire added after the pass computed its desired state.
	mu     sync.Mutex
	wiring map[string]wiringEntry // by host interface
	// fromView are the workload routes the last pass took from the view,
	// handed again with every Wire.
	fromView  []dataplane.Route
	installed int
	lastPass  time.Time
	passed    bool
}

type wiringEntry struct {
	routes []dataplane.Route
	since  time.Time
}

func newRouteOwner(node string, view *syncer.Syncer, table *routetable.Table, log *slog.Logger) *routeOwner {
	r := &routeOwner{node: node, view: view, table: table, log: log, kick: make(chan struct{}, 1), wiring: map[string]wiringEntry{}}
	r.sub = view.Notify("routes", r.affects()...)
	return r
}

// affects takes this node's endpoints, blocks, block claims and borrowed
// addresses, and pools (aggregates, see aggregateBlackholes).
func (r *routeOwner) affects() []syncer.Filter {
	return []syncer.Filter{
		syncer.On[api.IPPool](nil),
		syncer.On(func(u syncer.Update[api.WorkloadEndpoint]) bool { return u.Either(endpointOn(r.node)) }),
		syncer.On(func(u syncer.Update[ipam.BlockSummary]) bool { return u.Either(blockOfOrLendingTo(r.node)) }),
		syncer.On(func(u syncer.Update[ipam.Affinity]) bool { return u.Either(claimOf(r.node)) }),
	}
}

func (r *routeOwner) loop(every time.Duration, m *metrics) loop {
	return loop{name: "routing", every: every, wake: [2]<-chan struct{}{r.sub.C(), r.kick}, pass: r.pass, observe: m.observeReconcile, log: r.log}
}

// localClasses returns this node's routes by class; r.mu is held. Wiring
// entries whose endpoint reached the view, or that outlived the grace, go.
func (r *routeOwner) localClasses(now time.Time) map[routetable.Class][]dataplane.Route {
	blocks := r.view.BlocksOf(r.node)
	local := desiredLocalRoutes(r.node, r.view.EndpointsOn(r.node), blocks)
	aggs := aggregateBlackholes(r.node, r.view.Pools(), blocks, r.view.BorrowedBy(r.node))
	type key struct {
		dst netip.Prefix
		dev string
	}
	inView := map[key]bool{}
	for _, rt := range slices.Concat(local, aggs) {
		inView[key{rt.Dst, rt.Dev}] = true
	}
	for dev, e := range r.wiring {
		covered := !slices.ContainsFunc(e.routes, func(rt dataplane.Route) bool { return !inView[key{rt.Dst.Masked(), rt.Dev}] })
		if covered || now.Sub(e.since) > wiringGrace {
			delete(r.wiring, dev) // the endpoint (with these addresses) is stored, or ADD died
		}
	}
	out := map[routetable.Class][]dataplane.Route{routetable.Aggregate: aggs}
	r.fromView = nil
	for _, rt := range local {
		if rt.Type == dataplane.RouteBlackhole {
			out[routetable.Blackhole] = append(out[routetable.Blackhole], rt)
		} else {
			r.fromView = append(r.fromView, rt)
		}
	}
	out[routetable.Workload] = r.workloadRoutes()
	return out
}

// workloadRoutes is the workload class: the view's routes of the last pass
// and those being wired; r.mu is held.
func (r *routeOwner) workloadRoutes() []dataplane.Route {
	out := slices.Clone(r.fromView)
	for _, e := range r.wiring {
		out = append(out, e.routes...)
	}
	return sortRoutes(slices.CompactFunc(sortRoutes(out), func(x, y dataplane.Route) bool { return dataplane.CompareRoutes(x, y) == 0 }))
}

// pass hands the local classes to the route table and applies it.
func (r *routeOwner) pass(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	classes := r.localClasses(time.Now())
	var errs []error
	n := 0
	for _, c := range []routetable.Class{routetable.Workload, routetable.Blackhole, routetable.Aggregate} {
		errs = append(errs, r.table.SetClass(c, classes[c]))
		n += len(classes[c])
	}
	errs = append(errs, r.table.Apply(routetable.Workload, routetable.Blackhole, routetable.Aggregate))
	err := ignoreNoDevice(errors.Join(errs...))
	r.installed, r.lastPass, r.passed = n, time.Now(), r.passed || err == nil
	if err != nil {
		return fmt.Errorf("workload routes: %w", err)
	}
	return nil
}

// Wire installs the routes to a workload being added, now, and keeps them
// until its endpoint is in the view (or wiringGrace passes).
func (r *routeOwner) Wire(hostIf string, routes []dataplane.Route) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.wiring[hostIf] = wiringEntry{routes: slices.Clone(routes), since: time.Now()}
	// Problems with other workloads' routes are the pass's to report;
	// this workload's routes must win their destinations.
	_ = r.table.SetClass(routetable.Workload, r.workloadRoutes())
	var errs []error
	dsts := make([]netip.Prefix, 0, len(routes))
	for _, rt := range routes {
		dsts = append(dsts, rt.Dst)
		if w, ok := r.table.Winner(rt.Dst); !ok || !rt.Satisfies(w) {
			errs = append(errs, fmt.Errorf("adding route %s dev %s: the destination is taken by %v", rt.Dst, rt.Dev, w))
		}
	}
	return errors.Join(append(errs, r.table.Flush(dsts))...)
}

// Unwire forgets a workload whose ADD failed; the next pass removes what
// is left of its routes.
func (r *routeOwner) Unwire(hostIf string) {
	r.mu.Lock()
	delete(r.wiring, hostIf)
	r.mu.Unlock()
	kick(r.kick)
}

// Wiring reports whether ADD is wiring the interface right now.
func (r *routeOwner) Wiring(hostIf string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.wiring[hostIf]
	return ok
}

func (r *routeOwner) stats() (installed int, last time.Time, passed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.installed, r.lastPass, r.passed
}

// ignoreNoDevice drops errors about routes whose device is gone: a workload
// deleted while the pass ran. Its endpoint is gone too by the next pass.
func ignoreNoDevice(err error) error {
	if err == nil {
		return nil
	}
	multi, ok := err.(interface{ Unwrap() []error })
	if !ok {
		if errors.Is(err, dataplane.ErrNoDevice) {
			return nil
		}
		return err
	}
	var keep []error
	for _, e := range multi.Unwrap() {
		if e = ignoreNoDevice(e); e != nil {
			keep = append(keep, e)
		}
	}
	return errors.Join(keep...)
}
