package routetable

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/tabbynet/tabby/dataplane"
)

// DefaultResyncEvery is how often Apply does a full diff against the kernel
// when New is given no interval.
const DefaultResyncEvery = 30 * time.Second

// Table is the one writer of the kernel's Tabby routes (protocols
// RouteProtoWorkload and RouteProtoBGP) in the main table. It is safe for
// concurrent use; kernel calls are serialised under its lock.
type Table struct {
	kernel      dataplane.Routes
	resyncEvery time.Duration
	now         func() time.Time

	mu      sync.Mutex
	classes map[Class]map[netip.Prefix]dataplane.Route
	// applied is what the kernel holds of ours, as far as the table
	// knows: read from it at a full sync, kept up to date by every call
	// since.
	applied map[netip.Prefix]dataplane.Route
	// strays are further routes of ours for a destination that applied
	// already has (another metric, say), found by a full sync; the next
	// apply deletes them.
	strays []dataplane.Route
	// node are the destinations of the node's own routes at the last full
	// sync, plus any a Replace found in the way since.
	node     map[netip.Prefix]bool
	dirty    map[netip.Prefix]bool
	hold     map[Class]bool
	held     map[netip.Prefix]bool
	needFull bool
	lastFull time.Time
	stats    Stats
	// pending are the classes declared with Expect that have not been
	// set yet: their routes from an earlier run are not orphans.
	pending map[Class]bool
}

// Stats counts what the table did, for tests, metrics and benchmarks.
type Stats struct {
	FullSyncs int // full diffs against the kernel
	Replaced  int // routes added or replaced
	Deleted   int // routes deleted
}

// New returns a table programming kernel. resyncEvery is how often Apply
// diffs against the whole kernel table (DefaultResyncEvery if 0); the first
// Apply always does.
func New(kernel dataplane.Routes, resyncEvery time.Duration) *Table {
	if resyncEvery <= 0 {
		resyncEvery = DefaultResyncEvery
	}
	return &Table{
		kernel: kernel, resyncEvery: resyncEvery, now: time.Now,
		classes:  map[Class]map[netip.Prefix]dataplane.Route{},
		applied:  map[netip.Prefix]dataplane.Route{},
		node:     map[netip.Prefix]bool{},
		dirty:    map[netip.Prefix]bool{},
		hold:     map[Class]bool{},
		held:     map[netip.Prefix]bool{},
		pending:  map[Class]bool{},
		needFull: true,
	}
}

// SetClass makes routes the whole desired set of class c, replacing what
// the class had; it is idempotent and touches nothing in the kernel (see
// Apply). A route's Proto may be 0 (it gets c.Proto()); another protocol,
// an invalid route or a second route for one destination is reported and
// left out, the rest is taken.
func (t *Table) SetClass(c Class, routes []dataplane.Route) error {
	if !c.valid() {
		return fmt.Errorf("setting routes of %v: no such class", c)
	}
	var errs []error
	next := make(map[netip.Prefix]dataplane.Route, len(routes))
	for _, rt := range routes {
		rt = rt.Normalized()
		if rt.Proto == 0 {
			rt.Proto = c.Proto()
		}
		if rt.Proto != c.Proto() {
			errs = append(errs, fmt.Errorf("%v route %v: protocol is not %d", c, rt, c.Proto()))
			continue
		}
		if err := rt.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%v route: %w", c, err))
			continue
		}
		if prev, dup := next[rt.Dst]; dup {
			if !same(prev, rt) {
				errs = append(errs, fmt.Errorf("%v routes %v and %v share a destination; keeping the first", c, prev, rt))
			}
			continue
		}
		next[rt.Dst] = rt
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	prev := t.classes[c]
	for dst, rt := range next {
		if old, ok := prev[dst]; !ok || !same(old, rt) {
			t.dirty[dst] = true
		}
	}
	for dst := range prev {
		if _, ok := next[dst]; !ok {
			t.dirty[dst] = true
		}
	}
	t.classes[c] = next
	if t.pending[c] {
		delete(t.pending, c)
		for dst := range t.held {
			t.dirty[dst] = true // remove holds them again if still needed
		}
	}
	return errors.Join(errs...)
}

// Expect declares the classes that owners will set (SetClass). Until a
// declared class has been set once, a route of ours that no class wants
// but that has that class's protocol is kept, not deleted: at a restart the
// kernel holds the routes of the earlier run, and the first Apply of one
// owner (BGP's learned class, say) must not delete another owner's routes
// (a pod's host route, a block's blackhole) before that owner's first pass
// hands them over again — the destination would have no route until then,
// and packets in flight to it would be lost. Declaring a class that is
// already set does nothing.
func (t *Table) Expect(classes ...Class) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range classes {
		if _, set := t.classes[c]; !set && c.valid() {
			t.pending[c] = true
		}
	}
}

// awaited reports whether a declared class not yet set could own a route
// with protocol proto; t.mu is held.
func (t *Table) awaited(proto int) bool {
	for c := range t.pending {
		if c.Proto() == proto {
			return true
		}
	}
	return false
}

// HoldDeletes switches the hold on deletes of class c: while on, a route
// of the class that nothing wants any more stays in the kernel (a restarted
// agent keeps the learned routes an earlier run left until BGP has
// converged); adds and replaces still happen. Switching it off makes the
// next Apply delete what was held. Orphans found in the kernel count as
// learned if they have protocol RouteProtoBGP, else as workload routes.
func (t *Table) HoldDeletes(c Class, on bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.hold[c] == on {
		return
	}
	t.hold[c] = on
	if !on {
		for dst := range t.held {
			t.dirty[dst] = true
		}
	}
}

// Resync makes the next Apply diff against the whole kernel table.
func (t *Table) Resync() {
	t.mu.Lock()
	t.needFull = true
	t.mu.Unlock()
}

// NodeRoutes returns the destinations of the node's own routes as of the
// last full sync, sorted.
func (t *Table) NodeRoutes() []netip.Prefix {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]netip.Prefix, 0, len(t.node))
	for p := range t.node {
		out = append(out, p)
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return out
}

// Suppressed returns the destinations a remote class (learned, tunnel)
// wants but that are the node's own routes, sorted.
func (t *Table) Suppressed() []netip.Prefix {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.suppressed()
}

// suppressed: see Suppressed; t.mu is held.
func (t *Table) suppressed() []netip.Prefix {
	var out []netip.Prefix
	for dst := range t.node {
		if slices.ContainsFunc(byPriority, func(c Class) bool { _, ok := t.classes[c][dst]; return ok && c.Remote() }) {
			out = append(out, dst)
		}
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return out
}

// RefreshNodeRoutes re-reads the node's own routes if a remote class's
// route is kept off one of them (and reads nothing otherwise), so that the
// learned route takes the destination soon after the node route goes, not
// only at the next full sync. It reports whether they changed; the next
// Apply programs what that changes.
func (t *Table) RefreshNodeRoutes() (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.suppressed()) == 0 {
		return false, nil
	}
	node, err := t.kernel.NodeRoutes()
	if err != nil {
		return false, fmt.Errorf("listing the node's own routes: %w", err)
	}
	next := make(map[netip.Prefix]bool, len(node))
	for _, p := range node {
		next[p.Masked()] = true
	}
	changed := false
	for p := range next {
		if !t.node[p] {
			t.dirty[p], changed = true, true
		}
	}
	for p := range t.node {
		if !next[p] {
			t.dirty[p], changed = true, true
		}
	}
	t.node = next
	return changed, nil
}

// Stats returns the counters so far.
func (t *Table) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stats
}

// Winners returns the route that wins each destination, sorted.
func (t *Table) Winners() []dataplane.Route {
	t.mu.Lock()
	defer t.mu.Unlock()
	seen := map[netip.Prefix]bool{}
	var out []dataplane.Route
	for _, routes := range t.classes {
		for dst := range routes {
			if seen[dst] {
				continue
			}
			seen[dst] = true
			if rt, _, ok := t.winner(dst); ok {
				out = append(out, rt)
			}
		}
	}
	slices.SortFunc(out, dataplane.CompareRoutes)
	return out
}

// Winner returns the route that wins dst, if any.
func (t *Table) Winner(dst netip.Prefix) (dataplane.Route, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rt, _, ok := t.winner(dst.Masked())
	return rt, ok
}

// winner is the route of the highest class that wants dst, skipping remote
// classes over a node route; t.mu is held.
func (t *Table) winner(dst netip.Prefix) (dataplane.Route, Class, bool) {
	for _, c := range byPriority {
		rt, ok := t.classes[c][dst]
		if !ok || (c.Remote() && t.node[dst]) {
			continue
		}
		return rt, c, true
	}
	return dataplane.Route{}, 0, false
}

// same reports whether two normalized desired routes are the same route.
func same(a, b dataplane.Route) bool {
	return a.Dst == b.Dst && a.Type == b.Type && a.Dev == b.Dev && a.Proto == b.Proto && a.Onlink == b.Onlink && slices.Equal(a.Gateways, b.Gateways)
}
