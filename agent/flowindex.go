package agent

import (
	"net/netip"
	"sync"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/syncer"
)

// The flows owner's address index answers the flow log aggregator's
// "whose address is this?" for every flow record. It follows the view by
// the changes of each endpoint and node (syncer.Feed), not by reading the
// whole view again on every change: at 30,000 endpoints that rebuild cost
// every agent with flow logs on milliseconds per pod event anywhere in the
// cluster (docs/scale.md, "Start costs"). It reads the whole view only
// when the feeds lost track (more changes than they keep between two
// takes) and when the owner starts.

// claim is one endpoint's or node's claim on an address. Its identity is
// its class (rank) and the namespace and name of its record: an endpoint's
// own name, not the pod's, since two interfaces of one pod are two
// endpoints. The namespace is the flow record's (info.ep.Namespace): an
// endpoint's key always has one, so it is the record's own.
type claim struct {
	name string
	info endpointInfo
}

func (c claim) ns() string { return c.info.ep.Namespace }

// rank orders the classes of claims: this node's pods, then other nodes'
// pods, then nodes.
func (c claim) rank() int {
	switch {
	case c.info.ep.Kind == api.FlowEndpointHost:
		return 0
	case c.info.local:
		return 2
	default:
		return 1
	}
}

func (c claim) same(d claim) bool {
	return c.rank() == d.rank() && c.ns() == d.ns() && c.name == d.name
}

// outranks is the rule that decides which of several claims on one address
// the index answers, whatever the order they came in: the higher class,
// then the greater namespace and name. Two claims on one address are a
// transient state (an address released by one pod and assigned to another
// before the first's record is gone) or a misconfiguration; this node's own
// pods are what it knows best.
func outranks(c, d claim) bool {
	if c.rank() != d.rank() {
		return c.rank() > d.rank()
	}
	if c.ns() != d.ns() {
		return c.ns() > d.ns()
	}
	return c.name > d.name
}

// flowPodInfo is what a flow record says of an endpoint.
func flowPodInfo(ns, name, pod string, labels map[string]string, on, node string) endpointInfo {
	if ns == "" {
		ns = "default"
	}
	if pod != "" {
		name = pod
	}
	return endpointInfo{ep: api.FlowEndpoint{Kind: api.FlowEndpointPod, Namespace: ns, Name: name, Labels: labels}, local: on == node}
}

// claims is the index's state: each address's winning claim, and the
// others of the few addresses claimed more than once.
type claims struct {
	win    map[netip.Addr]claim
	losers map[netip.Addr][]claim
}

func newClaims() claims {
	return claims{win: map[netip.Addr]claim{}, losers: map[netip.Addr][]claim{}}
}

// add records c's claim on a, replacing an earlier one of the same
// identity. Idempotent.
func (cs claims) add(a netip.Addr, c claim) {
	a = a.Unmap()
	win, ok := cs.win[a]
	switch {
	case !ok, win.same(c):
		cs.win[a] = c
		return
	}
	others := cs.losers[a]
	for i := range others {
		if others[i].same(c) {
			others[i] = c // the same identity: the same place in the order
			return
		}
	}
	if outranks(c, win) {
		cs.win[a], c = c, win
	}
	cs.losers[a] = append(others, c)
}

// drop removes the claim of c's identity on a, if any; the best remaining
// claim wins the address. Idempotent.
func (cs claims) drop(a netip.Addr, c claim) {
	a = a.Unmap()
	win, ok := cs.win[a]
	if !ok {
		return
	}
	others := cs.losers[a]
	i := -1
	if win.same(c) {
		if len(others) == 0 {
			delete(cs.win, a)
			return
		}
		i = 0
		for j := range others {
			if outranks(others[j], others[i]) {
				i = j
			}
		}
		cs.win[a] = others[i]
	} else {
		for j := range others {
			if others[j].same(c) {
				i = j
			}
		}
		if i < 0 {
			return
		}
	}
	others[i] = others[len(others)-1]
	others[len(others)-1] = claim{}
	if others = others[:len(others)-1]; len(others) == 0 {
		delete(cs.losers, a)
	} else {
		cs.losers[a] = others
	}
}

// The claims of one record, given to each (add or drop).

func nodeClaims(n *api.Node, each func(netip.Addr, claim)) {
	if n == nil {
		return
	}
	c := claim{name: n.Metadata.Name, info: endpointInfo{ep: api.FlowEndpoint{Kind: api.FlowEndpointHost, Name: n.Metadata.Name}}}
	if p, ok := n.IPv4(); ok {
		each(p.Addr(), c)
	}
	if p, ok := n.IPv6(); ok {
		each(p.Addr(), c)
	}
}

func endpointClaims(node string, w *api.WorkloadEndpoint, each func(netip.Addr, claim)) {
	if w == nil {
		return
	}
	addrs, _ := w.Addrs()
	c := claim{name: w.Metadata.Name,
		info: flowPodInfo(w.Metadata.Namespace, w.Metadata.Name, w.Spec.Pod, w.Metadata.Labels, w.Spec.Node, node)}
	for _, a := range addrs {
		each(a, c)
	}
}

func remoteClaims(node string, r *api.RemoteEndpoint, each func(netip.Addr, claim)) {
	if r == nil {
		return
	}
	addrs, _ := r.Addrs()
	c := claim{name: r.Name, info: flowPodInfo(r.Namespace, r.Name, r.Pod, r.Labels, r.Node, node)}
	for _, a := range addrs {
		each(a, c)
	}
}

// addrIndex is the index the aggregator reads. Only the owner's loop
// writes it (update, rebuild); Endpoint's readers, the aggregator's
// goroutines, take the read lock for one map lookup, and a writer holds
// the lock for one record's change, or for swapping in a rebuilt index.
type addrIndex struct {
	node string
	mu   sync.RWMutex
	cs   claims
}

func newAddrIndex(node string) *addrIndex { return &addrIndex{node: node, cs: newClaims()} }

// lookup returns the winning claim on a (unmapped).
func (x *addrIndex) lookup(a netip.Addr) (endpointInfo, bool) {
	x.mu.RLock()
	c, ok := x.cs.win[a]
	x.mu.RUnlock()
	return c.info, ok
}

// rebuild replaces the index with one read from the whole view. The view
// is read outside the index's lock, so readers wait only for the swap.
func (x *addrIndex) rebuild(v *syncer.Syncer) {
	cs := newClaims()
	for _, n := range v.Nodes() {
		nodeClaims(n, cs.add)
	}
	for _, w := range v.Endpoints() {
		endpointClaims(x.node, w, cs.add)
	}
	for _, r := range v.RemoteEndpoints() {
		remoteClaims(x.node, r, cs.add)
	}
	x.mu.Lock()
	x.cs = cs
	x.mu.Unlock()
}

// The changes of one record: its old claims dropped, its new ones added.
// Each is idempotent, so a change the index already reflects (one that
// came in while a rebuild read the view) does no harm: applied in the
// view's order, a record's changes end at its current value.

// applyChange applies one record's change: claims lists a record's
// claims (nil: none).
func applyChange[T syncer.Value](x *addrIndex, u syncer.Update[T], claims func(*T, func(netip.Addr, claim))) {
	x.mu.Lock()
	defer x.mu.Unlock()
	claims(u.Old, x.cs.drop)
	claims(u.New, x.cs.add)
}

// flowFeeds are the flows owner's subscriptions: the records whose
// addresses it indexes.
type flowFeeds struct {
	eps    *syncer.Feed[api.WorkloadEndpoint]
	remote *syncer.Feed[api.RemoteEndpoint]
	nodes  *syncer.Feed[api.Node]
}

func watchFlowFeeds(v *syncer.Syncer) flowFeeds {
	return flowFeeds{
		eps:    syncer.Watch[api.WorkloadEndpoint](v, "flows", nil),
		remote: syncer.Watch[api.RemoteEndpoint](v, "flows", nil),
		nodes:  syncer.Watch(v, "flows", nodeAddrsMoved),
	}
}

// nodeAddrsMoved takes a node's creation, deletion and change of address:
// a node's other changes (BGP settings, labels) say nothing of addresses.
func nodeAddrsMoved(u syncer.Update[api.Node]) bool {
	if u.Old == nil || u.New == nil {
		return true
	}
	p4, ok4 := u.Old.IPv4()
	q4, ok4n := u.New.IPv4()
	p6, ok6 := u.Old.IPv6()
	q6, ok6n := u.New.IPv6()
	return p4 != q4 || ok4 != ok4n || p6 != q6 || ok6 != ok6n
}

// follow applies what the feeds took since the last call, or rebuilds
// the index from the view when one of them lost track. The feeds are
// taken one after the other, so a record that moves between kinds (an
// endpoint whose node changes to or from this one) may be added as one
// before it is dropped as the other: their claims have different
// identities, and the index is right once both are applied.
func (x *addrIndex) follow(v *syncer.Syncer, fs flowFeeds) (changes int, rebuilt bool) {
	nodes, allN := fs.nodes.Take()
	eps, allE := fs.eps.Take()
	remote, allR := fs.remote.Take()
	if allN || allE || allR {
		x.rebuild(v)
		return 0, true
	}
	local := func(w *api.WorkloadEndpoint, each func(netip.Addr, claim)) { endpointClaims(x.node, w, each) }
	other := func(r *api.RemoteEndpoint, each func(netip.Addr, claim)) { remoteClaims(x.node, r, each) }
	for _, u := range nodes {
		applyChange(x, u, nodeClaims)
	}
	for _, u := range eps {
		applyChange(x, u, local)
	}
	for _, u := range remote {
		applyChange(x, u, other)
	}
	return len(nodes) + len(eps) + len(remote), false
}

// start empties the feeds and reads the whole view: the changes that came
// before are in it.
func (x *addrIndex) start(v *syncer.Syncer, fs flowFeeds) {
	fs.nodes.Take()
	fs.eps.Take()
	fs.remote.Take()
	x.rebuild(v)
}
