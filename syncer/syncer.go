// Package syncer is the agent's view of the cluster. One etcd watch, started
// from one revision with an initial list and re-listed after compaction or
// an etcd restart, feeds typed in-memory indexes: nodes, pools, BGP
// configuration and peers, workload endpoints (also by node), policies, IPAM
// blocks (by affine node, with the addresses other nodes borrowed) and
// affinities. Nothing that reads the view touches etcd.
//
// Consumers subscribe with typed filters (On) and are woken only by the
// updates that pass them. A consumer that recomputes from the view uses a
// wake-only Signal (Notify), which keeps nothing; one that folds changes
// in takes typed updates, Update[T] with the old and new value of one key,
// from a Feed (Watch). A pod added on another node therefore costs a
// consumer nothing unless it asked for other nodes' endpoints; a pod added
// in its own node's block does not even produce a block update (see
// ipam.BlockSummary).
//
// Values handed out are shared with the view: treat them as read-only.
// A Syncer is safe for concurrent use.
package syncer

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// The view's kinds besides the api kinds (api.KindNode, …); consumers name
// a kind by its value type (see Value).
const (
	kindBlock    = "Block"    // ipam.BlockSummary
	kindAffinity = "Affinity" // ipam.Affinity
	kindNodeGC   = "NodeGC"   // datastore.KV of gc/nodes/<node>, which node GC decodes itself
	// kindRemote is another node's WorkloadEndpoint in an agent's view
	// (CompactRemote): an *api.RemoteEndpoint under the endpoint's key.
	kindRemote  = "RemoteEndpoint"
	kindMeshKey = "BGPMeshKey" // datastore.BGPMeshKey of config/bgp-mesh-key
	// kindBGPSecrets is datastore.BGPSecrets of config/bgp-secrets.
	kindBGPSecrets = "BGPSecrets"
)

// Source is where the view's events come from: datastore.Store.WatchKeysFunc,
// which calls fn with each watch response in the watch's own goroutine (one
// goroutine wake-up per event less than a channel) and returns when ctx is
// done or the watch ended.
type Source interface {
	WatchKeysFunc(ctx context.Context, spec datastore.WatchSpec, fromRev int64, fn func([]datastore.Event))
}

// watchSpec is what the view watches: every key up to the status records
// (each agent's, rewritten as its sessions change: every agent would
// receive every other's), without previous values, except the range from
// the IPAM blocks to the resources — blocks (rewritten by every pod added
// anywhere; the view reads their summaries, ipam.BlockSummariesPrefix),
// handles, LoadBalancer records and Kubernetes records — which etcd does
// not even send; of the rest only the keys the view holds (relevantKey),
// dropped before they are copied.
var watchSpec = datastore.WatchSpec{End: datastore.StatusPrefix, Keep: relevantKey,
	Skip: []datastore.KeyRange{{From: ipam.BlocksPrefix, To: datastore.ResourcesPrefix}}}

// WatchSpec returns what an agent's view watches, for a harness that loads
// etcd with the watches agents hold (tabby-lab sim's simulated nodes).
func WatchSpec() datastore.WatchSpec { return watchSpec }

// Syncer holds the view. Build it with New, start it with Run.
type Syncer struct {
	src Source
	log *slog.Logger

	mu     sync.RWMutex
	st     *state
	rev    int64
	synced bool
	// waiters are the WaitRevision calls, each woken once, when the view
	// is synced and has reached its revision: not on every event.
	waiters []waiter
	// offering: an apply has changed the state and not yet offered its
	// updates to the subscribers; a key it holds does not end a WaitHeld
	// until they have been (the apply's end wakes the waiters).
	offering bool
	subs     []subscriber
	stats    Stats
}

// Stats counts what the view has processed, for metrics and tests.
type Stats struct {
	Events  int64 // watch events (a resync counts once)
	Resyncs int64
	Updates int64 // updates that changed the view
	Ignored int64 // events of keys outside the view, or without change
}

// New returns a view fed from src; log may be nil.
func New(src Source, log *slog.Logger) *Syncer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Syncer{src: src, log: log, st: newState()}
}

// ErrWatchEnded is Run's error when the source's watch ends while ctx
// lives (the datastore was closed): the view no longer follows etcd.
var ErrWatchEnded = errors.New("the cluster view's watch ended")

// Run watches the whole Tabby prefix until ctx ends, and returns ctx's
// error then, or ErrWatchEnded if the watch ends first: it never returns
// nil. The first event is a full list; after it the view reports Synced.
func (s *Syncer) Run(ctx context.Context) error {
	s.src.WatchKeysFunc(ctx, watchSpec, 0, func(evs []datastore.Event) { s.apply(evs...) })
	if err := ctx.Err(); err != nil {
		return err
	}
	return ErrWatchEnded
}

// relevant says whether a key is part of the view. Handles, Kubernetes
// records and status records are not: they change with every pod and
// every agent.
func relevant(key string) bool {
	return strings.HasPrefix(key, datastore.ResourcesPrefix) ||
		strings.HasPrefix(key, ipam.BlockSummariesPrefix) ||
		strings.HasPrefix(key, datastore.NodeGCPrefix) ||
		key == datastore.BGPMeshKeyKey || key == datastore.BGPSecretsKey ||
		strings.HasPrefix(key, ipam.AffinitiesPrefix)
}

// relevantKey is relevant for a key as the watch has it, without copying
// it.
func relevantKey(key []byte) bool {
	// The conversion does not allocate: the string does not escape.
	return relevant(string(key))
}

// apply folds watch events into the view and wakes the subscribers whose
// filter takes any of the resulting updates.
func (s *Syncer) apply(evs ...datastore.Event) {
	var ups []change
	s.mu.Lock()
	wasSynced, resynced, rev := s.synced, false, s.rev
	for _, ev := range evs {
		ups = s.applyLocked(ev, ups)
		resynced = resynced || ev.Type == datastore.EventResync
		if ev.Reached != 0 {
			rev = max(rev, ev.Reached) // a watch of several parts (WatchSpec.Skip)
		} else {
			rev = max(rev, ev.Revision)
		}
	}
	subs := s.subs
	s.offering = true
	s.mu.Unlock()
	for _, sub := range subs {
		sub.offer(ups)
		if !wasSynced && resynced {
			sub.wake() // the first complete view, even an empty one
		}
	}
	// The revision moves only after every subscriber was offered the
	// updates: whoever waited for it finds them queued.
	s.mu.Lock()
	s.offering = false
	if resynced {
		s.synced = true
	}
	s.rev = max(s.rev, rev)
	s.wakeWaitersLocked()
	s.mu.Unlock()
}

// waiter is one WaitRevision or WaitHeld call: ch is closed when the view
// is synced, has reached rev and, with a key, holds the key at keyRev or
// later (or has reached keyRev).
type waiter struct {
	rev    int64
	key    string
	keyRev int64
	ch     chan struct{}
}

// doneLocked says whether the view is as w waits for it to be.
func (s *Syncer) doneLocked(w waiter) bool {
	switch {
	case !s.synced || s.rev < w.rev:
		return false
	case w.key == "" || s.rev >= w.keyRev:
		return true
	case s.offering:
		return false // the key may be there before its update is queued
	}
	it, ok := s.st.items[w.key]
	return ok && it.rev >= w.keyRev
}

// wakeWaitersLocked wakes the waiters whose revision the view reached.
func (s *Syncer) wakeWaitersLocked() {
	s.waiters = slices.DeleteFunc(s.waiters, func(w waiter) bool {
		if !s.doneLocked(w) {
			return false
		}
		close(w.ch)
		return true
	})
}

// applyLocked folds one event into the state and appends its updates.
func (s *Syncer) applyLocked(ev datastore.Event, ups []change) []change {
	n := len(ups)
	s.stats.Events++
	switch ev.Type {
	case datastore.EventResync:
		s.stats.Resyncs++
		seen := map[string]bool{}
		for _, kv := range ev.Snapshot {
			if !relevant(kv.Key) {
				continue
			}
			seen[kv.Key] = true
			ups = s.st.put(kv, s.log, ups)
		}
		for _, key := range s.st.keys() {
			if !seen[key] {
				if u, ok := s.st.del(key, ev.Revision); ok {
					ups = append(ups, u)
				}
			}
		}
	case datastore.EventPut:
		if relevant(ev.KV.Key) {
			ups = s.st.put(ev.KV, s.log, ups)
		}
	case datastore.EventDelete:
		if relevant(ev.KV.Key) {
			if u, ok := s.st.del(ev.KV.Key, ev.Revision); ok {
				ups = append(ups, u)
			}
		}
	}
	if len(ups) == n {
		s.stats.Ignored++
	}
	s.stats.Updates += int64(len(ups) - n)
	return ups
}

// Synced reports whether the initial list has been applied.
func (s *Syncer) Synced() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.synced
}

// Revision returns the etcd revision the view has reached.
func (s *Syncer) Revision() int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.rev
}

// Stats returns the counters.
func (s *Syncer) Stats() Stats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.stats
}

// WaitRevision blocks until the view is synced and has reached rev, or ctx
// ends. rev must be the revision of a write of a key the view holds (an
// endpoint, a block): the view moves only with those, and then holds that
// write.
//
// A view whose source watches in parts (the datastore's) reaches a
// revision only when every part has: it asks the source for a progress
// report while it waits, so that a part without writes catches up.
func (s *Syncer) WaitRevision(ctx context.Context, rev int64) error {
	return s.wait(ctx, waiter{rev: rev}, true)
}

// WaitHeld blocks until the view is synced, has reached since, and holds
// key as written at rev or later (or has reached rev: the key may have
// been deleted since), or ctx ends. since < rev: everything written up to
// since, and the one write at rev. It is WaitRevision(rev) without the
// wait for the parts of the view that rev's write did not touch: the
// write's own event brings the key, where reaching rev would take a
// progress report. It asks for one only while the view is short of since,
// and then every progressRetry (a key deleted before its event arrived).
func (s *Syncer) WaitHeld(ctx context.Context, since int64, key string, rev int64) error {
	s.mu.RLock()
	short := s.rev < since
	s.mu.RUnlock()
	return s.wait(ctx, waiter{rev: since, key: key, keyRev: rev}, short)
}

// wait blocks until w is done or ctx ends, asking the source for progress
// reports every progressRetry, and at once when askNow.
func (s *Syncer) wait(ctx context.Context, w waiter, askNow bool) error {
	w.ch = make(chan struct{})
	s.mu.Lock()
	if s.doneLocked(w) {
		s.mu.Unlock()
		return nil
	}
	s.waiters = append(s.waiters, w)
	s.mu.Unlock()
	p, asks := s.src.(progressSource)
	retry := time.NewTicker(progressRetry)
	defer retry.Stop()
	for {
		if askNow && asks && s.Synced() {
			_ = p.RequestWatchProgress(ctx) // best effort: asked again on the next tick
		}
		askNow = true
		select {
		case <-w.ch:
			return nil
		case <-retry.C:
		case <-ctx.Done():
			s.mu.Lock()
			s.waiters = slices.DeleteFunc(s.waiters, func(o waiter) bool { return o.ch == w.ch })
			s.mu.Unlock()
			return ctx.Err()
		}
	}
}

// progressSource is a Source that can be asked how far its watch got
// (datastore.Store).
type progressSource interface {
	RequestWatchProgress(ctx context.Context) error
}

// progressRetry: etcd answers a progress request only while every watch
// of the stream is in step; a wait asks again this often.
const progressRetry = 100 * time.Millisecond

// WaitSynced blocks until the initial list has been applied or ctx ends.
func (s *Syncer) WaitSynced(ctx context.Context) error { return s.WaitRevision(ctx, 0) }

// maxPending bounds the updates a Feed keeps between two Takes; beyond it
// the consumer is told to treat everything as changed.
const maxPending = 4096

// sortedValues returns a map's values ordered by key.
func sortedValues[V any](m map[string]V) []V {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]V, 0, len(keys))
	for _, k := range keys {
		out = append(out, m[k])
	}
	return out
}

// sortedPrefixValues returns a map's values ordered by prefix.
func sortedPrefixValues[V any](m map[netip.Prefix]V) []V {
	keys := make([]netip.Prefix, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, netip.Prefix.Compare)
	out := make([]V, 0, len(keys))
	for _, k := range keys {
		out = append(out, m[k])
	}
	return out
}
