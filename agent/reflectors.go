package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/syncer"
)

// reflectorElector takes part in the election of route reflectors
// (routeReflectorMode Auto, bgp.Elect): it follows the nodes' liveness
// records and the choice in etcd, proposes the next choice whenever its
// inputs call for one and writes it with a compare-and-swap on the
// record's revision. Every agent does; the first write wins, and the
// others then read a record they would have written themselves. The BGP
// owner peers by the record read back from etcd, never by its own
// proposal, so all agents act on one choice.
type reflectorElector struct {
	node    string
	store   *datastore.Store
	view    *syncer.Syncer
	log     *slog.Logger
	started time.Time
	changed func() // the choice in etcd changed

	mu           sync.Mutex
	choice       *bgp.ReflectorChoice
	rev          int64 // the record's ModRevision, 0 when there is none
	live         map[string]bool
	goneSince    map[string]time.Time
	liveSynced   bool
	choiceSynced bool
	lastDropped  []string
	// ready: per node, the election (Reflector.Since) its liveness record
	// last said it has every session of its reflector role ready for
	// (liveness.ReflectorReady). Kept when the record goes or comes back
	// without it (an agent restart within the grace), so that a restart
	// does not turn a ready reflector back into a pending one; a later
	// election of the node has another Since and needs a new report.
	ready map[string]time.Time
}

func newReflectorElector(node string, store *datastore.Store, view *syncer.Syncer, log *slog.Logger, changed func()) *reflectorElector {
	return &reflectorElector{node: node, store: store, view: view, log: log, started: time.Now(), changed: changed,
		live: map[string]bool{}, goneSince: map[string]time.Time{}, ready: map[string]time.Time{}}
}

// current is the choice in etcd (nil when there is none).
func (e *reflectorElector) current() *bgp.ReflectorChoice {
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.choice
}

// run follows liveness and the record and elects until ctx ends. Between
// events it sleeps until the next grace period ends (a reflector's grace
// ends without any event), so that an idle cluster costs nothing.
func (e *reflectorElector) run(ctx context.Context) {
	lives := e.store.Watch(ctx, datastore.NodeLivenessPrefix, 0)
	records := e.store.Watch(ctx, datastore.BGPReflectorsKey, 0)
	sub := e.view.Notify("reflectors", syncer.On[api.Node](nil), syncer.On[api.BGPConfiguration](nil))
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-lives:
			if !ok {
				return
			}
			if ev.Type == datastore.EventProgress {
				continue // a progress report another watch of the stream asked for: nothing changed
			}
			if e.applyLiveness(ev, time.Now()) {
				e.changed() // a reflector's readiness changes its peers' sessions
			}
		case ev, ok := <-records:
			if !ok {
				return
			}
			if ev.Type == datastore.EventProgress {
				continue
			}
			e.applyRecord(ev)
		case <-sub.C():
		case <-timer.C:
		}
		next, err := e.elect(ctx)
		if err != nil && !errors.Is(err, datastore.ErrConflict) {
			e.log.Warn("route reflector election", "err", err)
			next = time.Now().Add(electRetry)
		}
		timer.Stop()
		if !next.IsZero() {
			timer.Reset(time.Until(next))
		}
	}
}

// electRetry is when an election that failed (etcd) is tried again
// without any event.
const electRetry = time.Second

// applyLiveness folds a liveness event in; a node seen going is gone
// since now, one never seen live since this agent started. It reports
// whether a node's reflector readiness changed.
func (e *reflectorElector) applyLiveness(ev datastore.Event, now time.Time) (readyChanged bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	name := func(key string) string { return strings.TrimPrefix(key, datastore.NodeLivenessPrefix) }
	noteReady := func(kv datastore.KV) {
		var l liveness
		if json.Unmarshal(kv.Value, &l) != nil || l.ReflectorReady == nil {
			return
		}
		if n := name(kv.Key); !e.ready[n].Equal(*l.ReflectorReady) {
			e.ready[n], readyChanged = *l.ReflectorReady, true
		}
	}
	switch ev.Type {
	case datastore.EventResync:
		was := e.live
		e.live = map[string]bool{}
		for _, kv := range ev.Snapshot {
			e.live[name(kv.Key)] = true
			noteReady(kv)
		}
		for n := range was {
			if !e.live[n] {
				e.goneSince[n] = now
			}
		}
		e.liveSynced = true
	case datastore.EventPut:
		e.live[name(ev.KV.Key)] = true
		delete(e.goneSince, name(ev.KV.Key))
		noteReady(ev.KV)
	case datastore.EventDelete:
		delete(e.live, name(ev.KV.Key))
		e.goneSince[name(ev.KV.Key)] = now
	}
	return readyChanged
}

// readyReflectors is bgp.PeerInput.Ready: per node, the election it
// reported its reflector sessions ready for.
func (e *reflectorElector) readyReflectors() map[string]time.Time {
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.ready)
}

// isLive reports whether node's liveness record is there.
func (e *reflectorElector) isLive(node string) bool {
	if e == nil {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.live[node]
}

// applyRecord takes the record's new value.
func (e *reflectorElector) applyRecord(ev datastore.Event) {
	var kv *datastore.KV
	switch ev.Type {
	case datastore.EventResync:
		if len(ev.Snapshot) > 0 {
			kv = &ev.Snapshot[0]
		}
	case datastore.EventPut:
		kv = &ev.KV
	case datastore.EventProgress:
		// Only the revision moved (etcd reports progress to every watch
		// of the stream, e.g. when the view asks): the record did not go.
		return
	}
	var choice *bgp.ReflectorChoice
	var rev int64
	if kv != nil {
		c := &bgp.ReflectorChoice{}
		if err := json.Unmarshal(kv.Value, c); err != nil {
			e.log.Warn("the route reflector record does not decode; it will be replaced", "key", datastore.BGPReflectorsKey, "err", err)
			c = nil
		}
		choice, rev = c, kv.ModRevision
	}
	e.mu.Lock()
	old := e.choice
	e.choice, e.rev, e.choiceSynced = choice, rev, true
	e.mu.Unlock()
	if !old.Equal(choice) {
		e.log.Info("route reflectors changed", "count", choice.Count())
		e.changed()
	}
}

// elect proposes the next choice when the inputs call for one, and
// returns when it must look again without an event (zero: not before the
// next event).
func (e *reflectorElector) elect(ctx context.Context) (time.Time, error) {
	bc := e.view.BGPConfiguration()
	if !bc.AutoReflectors() {
		return time.Time{}, nil
	}
	e.mu.Lock()
	if !e.liveSynced || !e.choiceSynced {
		e.mu.Unlock()
		return time.Time{}, nil
	}
	prev, rev := e.choice, e.rev
	in := bgp.ElectInput{Spec: bc.Spec.AutoReflectorSpec, Nodes: e.view.Nodes(), Live: maps.Clone(e.live), GoneSince: maps.Clone(e.goneSince), Now: time.Now()}
	for _, n := range in.Nodes {
		if _, seen := in.GoneSince[n.Metadata.Name]; !seen && !in.Live[n.Metadata.Name] {
			in.GoneSince[n.Metadata.Name] = e.started
		}
	}
	e.mu.Unlock()
	deadline := in.NextDeadline()
	next, changed, dropped := bgp.Elect(prev, in)
	if !changed {
		return deadline, nil
	}
	val, err := json.Marshal(next)
	if err != nil {
		return deadline, err
	}
	_, err = e.store.Txn(ctx, []datastore.Cmp{{Key: datastore.BGPReflectorsKey, ModRevision: rev}}, []datastore.Op{{Key: datastore.BGPReflectorsKey, Value: val}})
	if err != nil {
		return deadline, fmt.Errorf("writing the route reflector choice: %w", err)
	}
	e.mu.Lock()
	e.lastDropped = dropped
	e.mu.Unlock()
	e.log.Info("elected route reflectors", "count", next.Count(), "dropped", dropped)
	return deadline, nil
}

// status describes the choice for tabbyctl node status.
func (e *reflectorElector) status(bc *api.BGPConfiguration, self *api.Node) *api.ReflectorStatus {
	if e == nil || !bc.AutoReflectors() {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	st := &api.ReflectorStatus{Mode: api.RouteReflectorModeAuto, PerZone: bc.Spec.EffectiveReflectorsPerZone(),
		ZoneLabel: bc.Spec.EffectiveZoneLabel(), Grace: bc.Spec.EffectiveReflectorGrace().String(),
		Peering: bc.Spec.EffectiveReflectorPeering(), LastDropped: e.lastDropped}
	if self != nil {
		st.Zone = self.Metadata.Labels[st.ZoneLabel]
	}
	st.Role = "client"
	if r, ok := e.choice.Find(e.node); ok {
		st.Role, st.Reason = "reflector", r.Reason
	} else if self != nil && !bc.Spec.Eligible(self.Metadata.Labels) {
		st.Reason = "not eligible (routeReflectorNodeSelector)"
	}
	if e.choice != nil {
		for z, rs := range e.choice.Zones {
			for _, r := range rs {
				ready := e.ready[r.Node].Equal(r.Since)
				st.Elected = append(st.Elected, api.ElectedReflector{Zone: z, Node: r.Node, ClusterID: r.ClusterID, Since: r.Since, Reason: r.Reason,
					Live: e.live[r.Node], SessionsReady: &ready})
			}
		}
	}
	return st
}

// wake asks the BGP owner for a pass (the reflector choice changed).
func (b *bgpOwner) wake() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}
