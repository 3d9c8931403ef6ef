package agent

import (
	"sync"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/policy"
)

// endpointLog is how the policy owner follows the cluster's endpoints
// without reading all of them on every pass: the view's filter records
// every endpoint change here, and the next pass hands the changes to the
// compiler (policy.Compiler.CompileChanges) instead of the whole list.
//
// It also decides which changes wake the owner: those the last
// compilation's Interest wants (this node's endpoints, endpoints a
// selector of a set in place takes, endpoints that warn). Another node's
// pod that no such selector takes is recorded and waits for whatever pass
// comes next: it cannot change this node's rules.
//
// A change judged by an Interest that the pass running at the time then
// replaces (a policy that came with it makes a new set) would be missed:
// so the pass, when it publishes its Interest, judges again what came in
// since it took its changes, and runs again for any the new Interest wants.
type endpointLog struct {
	node    string
	mu      sync.Mutex
	changes []policy.EndpointChange
	// unwoken are the changes since the last take that woke nobody (their
	// indexes in changes): only those can need another pass on publish.
	unwoken  []int
	overflow bool
	// interest is the last compilation's; nil before the first, which
	// reads every endpoint (and then judges what came in meanwhile): until
	// then only this node's endpoints wake the owner.
	interest *policy.Interest
	// woke and skipped count the changes that woke the owner and those
	// that did not (tests, metrics).
	woke, skipped int64
	// primed are the endpoints CNI ADD is creating, compiled ahead of
	// their commit (prime), by namespace/name: the view's change that
	// creates one replaces it.
	primed map[string]*api.WorkloadEndpoint
}

func epName(w *api.WorkloadEndpoint) string { return w.Metadata.Namespace + "/" + w.Metadata.Name }

// maxEndpointChanges bounds the changes kept between two passes; beyond
// it the next pass reads every endpoint.
const maxEndpointChanges = 8192

// record keeps one change and reports whether it wakes the owner. It runs
// in the view's delivery, once per change, in the view's order.
func (l *endpointLog) record(old, new *api.WorkloadEndpoint) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if old == nil && new != nil {
		if p := l.primed[epName(new)]; p != nil {
			old = p // the compiler holds it: the committed one replaces it
			delete(l.primed, epName(new))
		}
	}
	var wake bool
	if l.interest == nil {
		on := endpointOn(l.node)
		wake = (old != nil && on(old)) || (new != nil && on(new))
	} else {
		wake = l.interest.Wants(old) || l.interest.Wants(new)
	}
	return l.keep(policy.EndpointChange{Old: old, New: new}, wake)
}

// recordRemote is record for another node's endpoint in compact form.
func (l *endpointLog) recordRemote(old, new *api.RemoteEndpoint) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	var wake bool
	if l.interest == nil {
		wake = (old != nil && old.Node == l.node) || (new != nil && new.Node == l.node)
	} else {
		wake = l.interest.WantsRemote(old) || l.interest.WantsRemote(new)
	}
	return l.keep(policy.EndpointChange{OldRemote: old, NewRemote: new}, wake)
}

// prime adds w, an endpoint whose creation is in flight, to the changes
// (replacing one primed before under its name); it wakes the owner.
func (l *endpointLog) prime(w *api.WorkloadEndpoint) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.primed == nil {
		l.primed = map[string]*api.WorkloadEndpoint{}
	}
	prev := l.primed[epName(w)]
	l.primed[epName(w)] = w
	l.keep(policy.EndpointChange{Old: prev, New: w}, true)
}

// unprime takes w back, unless the view's change creating it has
// replaced it already; it reports whether it did.
func (l *endpointLog) unprime(w *api.WorkloadEndpoint) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.primed[epName(w)] != w {
		return false
	}
	delete(l.primed, epName(w))
	return l.keep(policy.EndpointChange{Old: w}, true)
}

// keep keeps a change that wakes the owner or not. The caller holds mu.
func (l *endpointLog) keep(c policy.EndpointChange, wake bool) bool {
	switch {
	case l.overflow:
	case len(l.changes) < maxEndpointChanges:
		if !wake {
			l.unwoken = append(l.unwoken, len(l.changes))
		}
		l.changes = append(l.changes, c)
	default:
		l.changes, l.unwoken, l.overflow = nil, nil, true
	}
	if wake {
		l.woke++
	} else {
		l.skipped++
	}
	return wake
}

// take returns the changes recorded since the last take; all is true when
// too many came: the pass must read every endpoint.
func (l *endpointLog) take() (changes []policy.EndpointChange, all bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	changes, all = l.changes, l.overflow
	l.changes, l.unwoken, l.overflow = nil, nil, false
	return changes, all
}

// publish makes in the Interest that judges the next changes, and reports
// whether a change recorded since the last take that woke nobody is one it
// wants (or was lost to the bound): then another pass must run. (One that
// woke the owner has its pass coming already.)
func (l *endpointLog) publish(in *policy.Interest) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.interest = in
	if l.overflow {
		return true
	}
	for _, i := range l.unwoken {
		if c := l.changes[i]; in.Wants(c.Old) || in.Wants(c.New) || in.WantsRemote(c.OldRemote) || in.WantsRemote(c.NewRemote) {
			return true
		}
	}
	return false
}

// counts returns how many changes woke the owner and how many did not.
func (l *endpointLog) counts() (woke, skipped int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.woke, l.skipped
}
