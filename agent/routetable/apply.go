package routetable

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/tabbynet/tabby/dataplane"
)

// Apply programs the kernel: every destination whose winner changed since
// the last Apply (and any that failed then) is replaced or deleted, adds
// and replaces before deletes. At the first call, after Resync and once per
// resync interval it first reads the kernel's Tabby routes and the node's
// own routes and diffs every destination against them, which removes
// orphans and repairs routes changed behind the table's back; if that
// read fails, the changes are applied all the same and the next Apply reads
// again. It keeps going after a failure (the destination stays dirty, so
// the next Apply retries it) and returns errors.Join of every failure.
//
// Only the errors of the given classes are returned (all, if none is
// given): a failed destination of another class stays dirty for its own
// owner's Apply to report.
func (t *Table) Apply(classes ...Class) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var readErr error
	if t.needFull || t.now().Sub(t.lastFull) >= t.resyncEvery {
		readErr = t.readKernel() // on failure, the changes are still applied
	}
	return errors.Join(readErr, t.applyDirty(nil, classes))
}

// Flush programs the winners of the given destinations now, whether or not
// the table thinks the kernel has them (a workload's new link starts
// without routes), and returns only their errors; nothing else is touched
// and the kernel is not read. CNI ADD uses it to install a workload's
// routes before it returns.
func (t *Table) Flush(dsts []netip.Prefix) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	only := make(map[netip.Prefix]bool, len(dsts))
	for _, d := range dsts {
		only[d.Masked()] = true
		t.dirty[d.Masked()] = true
	}
	return t.applyDirty(only, nil)
}

// readKernel replaces applied and node with what the kernel has and marks
// every destination either knows of dirty; t.mu is held. On failure
// nothing changes and the next Apply tries again.
func (t *Table) readKernel() error {
	var errs []error
	var listed []dataplane.Route
	for _, proto := range []int{dataplane.RouteProtoWorkload, dataplane.RouteProtoBGP} {
		rs, err := t.kernel.List(proto)
		if err != nil {
			errs = append(errs, fmt.Errorf("listing routes with protocol %d: %w", proto, err))
		}
		listed = append(listed, rs...)
	}
	node, err := t.kernel.NodeRoutes()
	if err != nil {
		errs = append(errs, fmt.Errorf("listing the node's own routes: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	t.stats.FullSyncs++
	t.lastFull, t.needFull = t.now(), false
	t.node = make(map[netip.Prefix]bool, len(node))
	for _, p := range node {
		t.node[p.Masked()] = true
	}
	t.applied = make(map[netip.Prefix]dataplane.Route, len(listed))
	t.strays = nil
	for _, rt := range listed {
		rt = rt.Normalized()
		t.dirty[rt.Dst] = true
		if _, dup := t.applied[rt.Dst]; dup {
			t.strays = append(t.strays, rt)
			continue
		}
		t.applied[rt.Dst] = rt
	}
	for _, routes := range t.classes {
		for dst := range routes {
			t.dirty[dst] = true
		}
	}
	return nil
}

// applyDirty applies the dirty destinations; with only, just those, even
// if the table believes the kernel has them. It returns the errors of
// report's classes (all if empty); t.mu is held.
func (t *Table) applyDirty(only map[netip.Prefix]bool, report []Class) error {
	var todo []netip.Prefix
	for dst := range t.dirty {
		if only == nil || only[dst] {
			todo = append(todo, dst)
		}
	}
	slices.SortFunc(todo, netip.Prefix.Compare)
	var errs []error
	var deletes []netip.Prefix
	for _, dst := range todo {
		want, c, ok := t.winner(dst)
		if !ok {
			deletes = append(deletes, dst)
			continue
		}
		if err := t.replace(dst, want, c, only != nil); err != nil && reports(report, c) {
			errs = append(errs, err)
		}
	}
	for _, dst := range deletes {
		if c, err := t.remove(dst); err != nil && reports(report, c) {
			errs = append(errs, err)
		}
	}
	if only == nil {
		errs = append(errs, t.deleteStrays(report)...)
	}
	return errors.Join(errs...)
}

func reports(report []Class, c Class) bool { return len(report) == 0 || slices.Contains(report, c) }

// replace makes want the kernel's route for dst (force: even if applied
// says it has it); t.mu is held.
func (t *Table) replace(dst netip.Prefix, want dataplane.Route, c Class, force bool) error {
	if have, ok := t.applied[dst]; ok && !force && satisfied(want, have) {
		delete(t.dirty, dst)
		delete(t.held, dst)
		return nil
	}
	if err := t.kernel.Replace(want); err != nil {
		if errors.Is(err, dataplane.ErrForeignRoute) && c.Remote() {
			// A node route appeared since the last full sync: it wins.
			t.node[dst] = true
			delete(t.dirty, dst)
			return nil
		}
		err = fmt.Errorf("%v route %v: %w", c, want, err)
		// The kernel's route for dst is one no class wants any more (a
		// tunnel route whose node withdrew its tunnel, with a learned
		// successor whose next hop is unreachable): it must not keep
		// carrying traffic its owner gave up. The successor is retried.
		if have, ok := t.applied[dst]; ok && !t.wanted(dst, have) {
			if derr := t.kernel.Delete(have); derr != nil {
				return errors.Join(err, fmt.Errorf("deleting route %v: %w", have, derr))
			}
			t.stats.Deleted++
			delete(t.applied, dst)
		}
		return err
	}
	t.stats.Replaced++
	t.applied[dst] = want
	delete(t.dirty, dst)
	delete(t.held, dst)
	return nil
}

// wanted reports whether some class still wants the route have (as the
// kernel or the table's last apply has it) for dst; t.mu is held.
func (t *Table) wanted(dst netip.Prefix, have dataplane.Route) bool {
	for _, c := range byPriority {
		if rt, ok := t.classes[c][dst]; ok && satisfied(rt, have) {
			return true
		}
	}
	return false
}

// remove deletes the kernel's route of ours for dst, unless its class
// holds deletes or a class declared with Expect and not yet set could own
// it; it returns the class the route is taken to be of. t.mu
// is held.
func (t *Table) remove(dst netip.Prefix) (Class, error) {
	have, ok := t.applied[dst]
	if !ok {
		delete(t.dirty, dst)
		return 0, nil
	}
	c := classOfProto(have.Proto)
	if t.hold[c] || t.awaited(have.Proto) {
		t.held[dst] = true
		delete(t.dirty, dst)
		return c, nil
	}
	if err := t.kernel.Delete(have); err != nil {
		return c, fmt.Errorf("deleting route %v: %w", have, err)
	}
	t.stats.Deleted++
	delete(t.applied, dst)
	delete(t.dirty, dst)
	delete(t.held, dst)
	return c, nil
}

// deleteStrays deletes the duplicates a full sync found, unless held;
// t.mu is held.
func (t *Table) deleteStrays(report []Class) []error {
	var errs []error
	keep := t.strays[:0]
	for _, rt := range t.strays {
		if t.hold[classOfProto(rt.Proto)] {
			keep = append(keep, rt)
			continue
		}
		if w, ok := t.applied[rt.Dst]; ok && same(w, rt) {
			continue // listed twice; nothing to delete
		}
		if err := t.kernel.Delete(rt); err != nil {
			if reports(report, classOfProto(rt.Proto)) {
				errs = append(errs, fmt.Errorf("deleting route %v: %w", rt, err))
			}
			keep = append(keep, rt)
			continue
		}
		t.stats.Deleted++
	}
	t.strays = keep
	return errs
}

// satisfied is dataplane.Route.Satisfies for routes already normalized
// (the table's and the kernel's listings are), without copying them.
func satisfied(want, have dataplane.Route) bool {
	if !same(dataplane.Route{Dst: want.Dst, Type: want.Type, Proto: want.Proto, Gateways: want.Gateways, Onlink: want.Onlink},
		dataplane.Route{Dst: have.Dst, Type: have.Type, Proto: have.Proto, Gateways: have.Gateways, Onlink: have.Onlink}) {
		return false
	}
	return (want.Dev == "" && len(want.Gateways) > 0) || want.Dev == have.Dev
}
