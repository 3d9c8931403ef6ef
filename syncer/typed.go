package syncer

import (
	"sync"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// Value is the type of the values of one kind the view holds: the api
// resources it watches, other nodes' endpoints in compact form
// (CompactRemote), IPAM block summaries and affinities, and node GC
// records (as stored: node GC decodes them itself).
type Value interface {
	api.Node | api.IPPool | api.BGPConfiguration | api.BGPPeer | api.BGPFilter |
		api.WorkloadEndpoint | api.NetworkPolicy | api.GlobalNetworkPolicy | api.Service |
		api.HostEndpoint | api.ClusterConfiguration | api.Tier | api.StagedGlobalNetworkPolicy |
		ipam.BlockSummary | ipam.Affinity | datastore.KV | datastore.BGPMeshKey |
		datastore.BGPSecrets | api.RemoteEndpoint
}

// kindOf names the kind whose values are T. The view's one place that
// maps types to kinds: everything handed out is typed by it. The api
// resources are named by api.KindOf (a nil *T is enough for its switch on
// the type).
func kindOf[T Value]() string {
	switch p := any((*T)(nil)).(type) {
	case api.Object:
		return api.KindOf(p)
	case *ipam.BlockSummary:
		return kindBlock
	case *ipam.Affinity:
		return kindAffinity
	case *datastore.BGPMeshKey:
		return kindMeshKey
	case *datastore.BGPSecrets:
		return kindBGPSecrets
	case *api.RemoteEndpoint:
		return kindRemote
	default: // *datastore.KV, the constraint allows nothing else
		return kindNodeGC
	}
}

// Update is one key's change of values of type T. Old is nil for a
// creation, New nil for a deletion; both are set for a modification. An
// update whose value did not change in a way the view represents is never
// sent. The values are shared with the view: read-only.
type Update[T Value] struct {
	Key      string
	Old, New *T
	Revision int64
}

// Either reports whether the old or the new value satisfies f.
func (u Update[T]) Either(f func(*T) bool) bool {
	return (u.Old != nil && f(u.Old)) || (u.New != nil && f(u.New))
}

// change is an update as the view produces it, before a subscriber types
// it. Values are pointers (api objects as decoded; a block, affinity or
// node GC record as stored in the view's items).
type change struct {
	kind     string
	key      string
	old, new any
	rev      int64
}

// typed turns a change of T's kind into its typed update.
func typed[T Value](c change) Update[T] {
	u := Update[T]{Key: c.key, Revision: c.rev}
	u.Old, _ = c.old.(*T)
	u.New, _ = c.new.(*T)
	return u
}

// Filter takes some updates of one kind; build it with On.
type Filter struct {
	kind  string
	match func(change) bool // nil takes every update of the kind
}

// On is a filter taking the updates of T's kind that pred takes; a nil
// pred takes them all. pred must be fast and must not block; it may read
// the view, which already holds the update.
func On[T Value](pred func(Update[T]) bool) Filter {
	f := Filter{kind: kindOf[T]()}
	if pred != nil {
		f.match = func(c change) bool { return pred(typed[T](c)) }
	}
	return f
}

func (f Filter) takes(c change) bool {
	return f.kind == c.kind && (f.match == nil || f.match(c))
}

// subscriber is what the view offers its changes to.
type subscriber interface {
	offer([]change)
	wake()
	retained() int
}

// kicker is the coalescing wake-up every subscription kind shares.
type kicker struct{ kick chan struct{} }

func newKicker() kicker { return kicker{kick: make(chan struct{}, 1)} }

// C is signalled (never blocking, coalescing) when updates for this
// consumer arrived, and once when the view first syncs.
func (k kicker) C() <-chan struct{} { return k.kick }

func (k kicker) wake() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// Signal is a wake-only subscription: it tells its consumer that
// something it cares about changed and keeps nothing, so a consumer that
// recomputes from the view (a level-based owner) pins no old values
// however long it does not look. Build it with Syncer.Notify.
type Signal struct {
	kicker
	name    string
	filters []Filter

	mu      sync.Mutex
	matched int64
}

// Notify registers a wake-only consumer, woken by the updates any of
// filters takes (none: only the first sync). Safe for concurrent use.
func (s *Syncer) Notify(name string, filters ...Filter) *Signal {
	sig := &Signal{kicker: newKicker(), name: name, filters: filters}
	s.register(sig)
	return sig
}

// Matched returns how many updates woke (or would have woken) the
// consumer so far.
func (sig *Signal) Matched() int64 {
	sig.mu.Lock()
	defer sig.mu.Unlock()
	return sig.matched
}

func (sig *Signal) offer(cs []change) {
	n := 0
	for _, c := range cs {
		for _, f := range sig.filters {
			if f.takes(c) {
				n++
				break
			}
		}
	}
	if n == 0 {
		return
	}
	sig.mu.Lock()
	sig.matched += int64(n)
	sig.mu.Unlock()
	sig.wake()
}

func (sig *Signal) retained() int { return 0 }

// Feed is a subscription to the updates of one kind that its consumer
// takes one by one (an incremental consumer). Build it with Watch. Up to
// maxPending updates are kept between two Takes; beyond that Take says
// "everything changed" and keeps none.
type Feed[T Value] struct {
	kicker
	name   string
	filter Filter

	mu       sync.Mutex
	pending  []Update[T]
	overflow bool
	matched  int64
}

// Watch registers a consumer of the updates of T's kind that pred takes
// (nil: all of them). Safe for concurrent use.
func Watch[T Value](s *Syncer, name string, pred func(Update[T]) bool) *Feed[T] {
	fd := &Feed[T]{kicker: newKicker(), name: name, filter: On(pred)}
	s.register(fd)
	return fd
}

// Take returns the updates since the last Take, in the order the view
// applied them. all is true when more arrived than were kept: the
// consumer should recompute everything from the view.
func (fd *Feed[T]) Take() (ups []Update[T], all bool) {
	fd.mu.Lock()
	defer fd.mu.Unlock()
	ups, all = fd.pending, fd.overflow
	fd.pending, fd.overflow = nil, false
	return ups, all
}

// Pending returns how many updates wait for the next Take.
func (fd *Feed[T]) Pending() int {
	fd.mu.Lock()
	defer fd.mu.Unlock()
	return len(fd.pending)
}

// Matched returns how many updates passed the filter so far.
func (fd *Feed[T]) Matched() int64 {
	fd.mu.Lock()
	defer fd.mu.Unlock()
	return fd.matched
}

func (fd *Feed[T]) offer(cs []change) {
	n := 0
	fd.mu.Lock()
	for _, c := range cs {
		if !fd.filter.takes(c) {
			continue
		}
		n++
		switch {
		case fd.overflow:
		case len(fd.pending) < maxPending:
			fd.pending = append(fd.pending, typed[T](c))
		default:
			// Everything changed: what was kept says nothing more.
			fd.pending, fd.overflow = nil, true
		}
	}
	fd.matched += int64(n)
	fd.mu.Unlock()
	if n > 0 {
		fd.wake()
	}
}

func (fd *Feed[T]) retained() int { return fd.Pending() }

// register adds a subscriber, kicking it at once when the view has
// already synced (else the first sync will), so that a consumer's first
// pass sees a complete view.
func (s *Syncer) register(sub subscriber) {
	s.mu.Lock()
	s.subs = append(s.subs, sub)
	synced := s.synced
	s.mu.Unlock()
	if synced {
		sub.wake()
	}
}

// Retained returns how many updates the view's subscriptions hold for
// their consumers, all together: the memory a slow consumer pins.
func (s *Syncer) Retained() int {
	s.mu.RLock()
	subs := s.subs
	s.mu.RUnlock()
	n := 0
	for _, sub := range subs {
		n += sub.retained()
	}
	return n
}
