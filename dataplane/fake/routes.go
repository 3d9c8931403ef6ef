// Package fake holds in-memory implementations of dataplane.Routes and
// dataplane.Workloads for unit tests. They keep state the way the kernel
// would (one route per destination in the main table, routes on a device
// vanish with the device), print it as sorted `ip route`-like lines, record
// the calls that change state, and fail on demand so that callers can test
// their rollback and retry paths. Both are safe for concurrent use.
package fake

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/tabbynet/tabby/dataplane"
)

// failer holds injected failures keyed by operation name.
type failer struct {
	// FailOn makes an operation fail with the given error. Keys are the
	// method name ("List", "NodeRoutes", "Replace", "Delete", "Setup",
	// "Teardown", "Check")
	// or the method name, a space and the destination prefix or host
	// interface name ("Replace 10.244.0.0/26", "Setup cali0123456789a").
	// Set it before the fake is shared between goroutines, or use SetFail.
	FailOn map[string]error
}

// SetFail makes op fail with err from now on; a nil err clears it.
func (r *Routes) SetFail(op string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	setFail(&r.failer, op, err)
}

func setFail(f *failer, op string, err error) {
	if err == nil {
		delete(f.FailOn, op)
		return
	}
	if f.FailOn == nil {
		f.FailOn = map[string]error{}
	}
	f.FailOn[op] = err
}

// fail returns the injected error for op, or for op and its object.
func (f *failer) fail(op, object string) error {
	if err := f.FailOn[op]; err != nil {
		return fmt.Errorf("injected failure of %s: %w", op, err)
	}
	if object == "" {
		return nil
	}
	if err := f.FailOn[op+" "+object]; err != nil {
		return fmt.Errorf("injected failure of %s %s: %w", op, object, err)
	}
	return nil
}

// Routes is an in-memory main routing table. The zero value is empty and
// ready to use.
type Routes struct {
	mu sync.Mutex
	failer
	routes map[netip.Prefix]dataplane.Route
	ops    []string
}

var _ dataplane.Routes = (*Routes)(nil)

// NewRoutes returns an empty table holding routes (of any protocol, as if
// some other program had added them).
func NewRoutes(routes ...dataplane.Route) *Routes {
	r := &Routes{failer: failer{FailOn: map[string]error{}}}
	for _, rt := range routes {
		r.Add(rt)
	}
	return r
}

// Add puts a route into the table without any check, as `ip route replace`
// by another program would. Use it to seed foreign routes.
func (r *Routes) Add(rt dataplane.Route) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.put(rt.Normalized())
}

// Remove deletes the route for dst, whatever its protocol, as `ip route
// del` by another program would.
func (r *Routes) Remove(dst netip.Prefix) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.routes, dst.Masked())
}

func (r *Routes) put(rt dataplane.Route) {
	if r.routes == nil {
		r.routes = map[netip.Prefix]dataplane.Route{}
	}
	r.routes[rt.Dst] = rt
}

// List implements dataplane.Routes.
func (r *Routes) List(proto int) ([]dataplane.Route, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.fail("List", ""); err != nil {
		return nil, err
	}
	var out []dataplane.Route
	for _, rt := range r.routes {
		if rt.Proto == proto {
			out = append(out, rt.Normalized())
		}
	}
	slices.SortFunc(out, dataplane.CompareRoutes)
	return out, nil
}

// Replace implements dataplane.Routes: like the kernel it replaces whatever
// route has the same destination, but refuses to replace a foreign one.
func (r *Routes) Replace(rt dataplane.Route) error {
	rt = rt.Normalized()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.fail("Replace", rt.Dst.String()); err != nil {
		return err
	}
	if err := rt.Validate(); err != nil {
		return err
	}
	if !dataplane.OwnedProto(rt.Proto) {
		return fmt.Errorf("replacing route %v: %w", rt, dataplane.ErrForeignRoute)
	}
	if old, ok := r.routes[rt.Dst]; ok && !dataplane.OwnedProto(old.Proto) {
		return fmt.Errorf("replacing route %v over %v: %w", rt, old, dataplane.ErrForeignRoute)
	}
	r.put(rt)
	r.ops = append(r.ops, "replace "+rt.String())
	return nil
}

// Delete implements dataplane.Routes. Like the kernel, it deletes the route
// for rt.Dst only if protocol and type match and, where rt names them, the
// device and gateways; otherwise the route counts as missing.
func (r *Routes) Delete(rt dataplane.Route) error {
	rt = rt.Normalized()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.fail("Delete", rt.Dst.String()); err != nil {
		return err
	}
	if !dataplane.OwnedProto(rt.Proto) {
		return fmt.Errorf("deleting route %v: %w", rt, dataplane.ErrForeignRoute)
	}
	old, ok := r.routes[rt.Dst]
	if !ok || old.Proto != rt.Proto || old.Type != rt.Type ||
		(rt.Dev != "" && rt.Dev != old.Dev) ||
		(len(rt.Gateways) > 0 && !slices.Equal(rt.Gateways, old.Gateways)) {
		return nil
	}
	delete(r.routes, rt.Dst)
	r.ops = append(r.ops, "delete "+old.String())
	return nil
}

// NodeRoutes implements dataplane.Routes: the destinations of every route
// of a protocol that is not Tabby's, of both families.
func (r *Routes) NodeRoutes() ([]netip.Prefix, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.fail("NodeRoutes", ""); err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for dst, rt := range r.routes {
		if !dataplane.OwnedProto(rt.Proto) {
			out = append(out, dst)
		}
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return out, nil
}

// removeDev drops every route through dev, as the kernel does when the
// device goes away.
func (r *Routes) removeDev(dev string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for dst, rt := range r.routes {
		if rt.Dev == dev {
			delete(r.routes, dst)
		}
	}
}

// Ops returns the state-changing calls so far, oldest first, as
// "replace <route>" and "delete <route>".
func (r *Routes) Ops() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ops)
}

// ResetOps forgets the recorded calls.
func (r *Routes) ResetOps() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = nil
}

// Lines returns every route in the table, of any protocol, as `ip route`
// lines sorted by destination.
func (r *Routes) Lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	all := make([]dataplane.Route, 0, len(r.routes))
	for _, rt := range r.routes {
		all = append(all, rt)
	}
	slices.SortFunc(all, dataplane.CompareRoutes)
	lines := make([]string, len(all))
	for i, rt := range all {
		lines[i] = rt.String()
	}
	return lines
}

// String prints the table as `ip route` lines, one per line, sorted.
func (r *Routes) String() string {
	return joinLines(r.Lines())
}

func joinLines(lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	return strings.Join(lines, "\n") + "\n"
}

// ErrInjected is a convenient error to inject with FailOn or SetFail.
var ErrInjected = errors.New("injected fault")
