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

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/syncer"
)

// wiringGrace is how long the routes of an interface that CNI ADD wired are
// kept without an endpoint in the view; ADD stores the endpoint well within
// it, and a failed ADD withdraws them at once (Unwire).
const wiringGrace = 30 * time.Second

// routeOwner is the one writer of this node's protocol RouteProtoWorkload
// routes: a /32 per local workload address and a blackhole per affine
// block. Its desired state is the view's endpoints and blocks of this node
// plus the interfaces CNI ADD is wiring right now (felix's grace for a pod
// being set up, kept in one place).
type routeOwner struct {
	node   string
	view   *syncer.Syncer
	kernel dataplane.Routes
	log    *slog.Logger
	sub    *syncer.Signal
	kick   chan struct{}

	// mu serialises passes with Wire, so that a pass never deletes a route
	// that Wire added after the pass computed its desired state.
	mu        sync.Mutex
	wiring    map[string]wiringEntry // by host interface
	installed int
	lastPass  time.Time
	passed    bool
}

type wiringEntry struct {
	routes []dataplane.Route
	since  time.Time
}

func newRouteOwner(node string, view *syncer.Syncer, kernel dataplane.Routes, log *slog.Logger) *routeOwner {
	r := &routeOwner{node: node, view: view, kernel: kernel, log: log, kick: make(chan struct{}, 1), wiring: map[string]wiringEntry{}}
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

// desired returns the routes this node should have; r.mu is held. Wiring
// entries whose endpoint reached the view, or that outlived the grace, go.
func (r *routeOwner) desired(now time.Time) []dataplane.Route {
	blocks := r.view.BlocksOf(r.node)
	out := desiredLocalRoutes(r.node, r.view.EndpointsOn(r.node), blocks)
	out = append(out, aggregateBlackholes(r.node, r.view.Pools(), blocks, r.view.BorrowedBy(r.node))...)
	type key struct {
		dst netip.Prefix
		dev string
	}
	fromView := map[key]bool{}
	for _, rt := range out {
		fromView[key{rt.Dst, rt.Dev}] = true
	}
	for dev, e := range r.wiring {
		covered := !slices.ContainsFunc(e.routes, func(rt dataplane.Route) bool { return !fromView[key{rt.Dst.Masked(), rt.Dev}] })
		switch {
		case covered, now.Sub(e.since) > wiringGrace:
			delete(r.wiring, dev) // the endpoint (with these addresses) is stored, or ADD died
		default:
			out = append(out, e.routes...)
		}
	}
	return sortRoutes(slices.CompactFunc(sortRoutes(out), func(x, y dataplane.Route) bool { return dataplane.CompareRoutes(x, y) == 0 }))
}

// pass makes the kernel's workload routes equal to desired.
func (r *routeOwner) pass(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	want := r.desired(time.Now())
	err := ignoreNoDevice(dataplane.SyncRoutes(r.kernel, dataplane.RouteProtoWorkload, want))
	r.installed, r.lastPass, r.passed = len(want), time.Now(), r.passed || err == nil
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
	var errs []error
	for _, rt := range routes {
		if err := r.kernel.Replace(rt); err != nil {
			errs = append(errs, fmt.Errorf("adding route %s dev %s: %w", rt.Dst, rt.Dev, err))
		}
	}
	return errors.Join(errs...)
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
