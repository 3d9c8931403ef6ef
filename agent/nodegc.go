package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/syncer"
)

// DefaultNodeGCGrace is Config.NodeGCGrace's default: how long a node
// must be gone — no Node record and no liveness record — before its
// endpoints, blocks and addresses are released. Its pods may still be
// draining; a node briefly without its record (an operator re-creating it)
// loses nothing.
const DefaultNodeGCGrace = 5 * time.Minute

// DefaultNodeGCMaxPerPass is Config.NodeGCMaxPerPass's default: how many
// nodes one pass releases, so that a mistake (a mass deletion of Node
// records) is noticed before it has freed the whole cluster's addresses.
const DefaultNodeGCMaxPerPass = 1

// nodeGC releases what dead nodes held. It acts only on positive evidence,
// checked in etcd, not only in the view: the node's Node record is absent
// and so is its liveness record (status/nodes/<node>, which a running
// agent keeps under a lease), at every pass for NodeGCGrace. Since when is
// recorded in etcd (gc/nodes/<node>), so that agent restarts do not reset
// the grace and every agent counts from the same moment. Then, in order,
// the node's WorkloadEndpoints, its addresses (with their handles), its
// blocks and their affinities are removed, and last the record; a crash
// half way is finished by the next pass. Every agent may do it: each write
// is a compare-and-swap.
type nodeGC struct {
	view  *syncer.Syncer
	store *datastore.Store
	ipam  *ipam.Allocator
	log   *slog.Logger
	sub   *syncer.Signal
	now   func() time.Time
	// grace is Config.NodeGCGrace.
	grace time.Duration
	// maxPerPass is Config.NodeGCMaxPerPass.
	maxPerPass int
	// due is kicked when the earliest grace of a node this pass saw gone
	// ends, so that the release does not wait for the periodic pass.
	due   chan struct{}
	timer *time.Timer
	// released counts nodes released by this agent (metrics, tests).
	released int
}

// gcRecord is the value of gc/nodes/<node>.
type gcRecord struct {
	Node      string    `json:"node"`
	GoneSince time.Time `json:"goneSince"`
}

func newNodeGC(view *syncer.Syncer, store *datastore.Store, al *ipam.Allocator, grace time.Duration, log *slog.Logger) *nodeGC {
	g := &nodeGC{view: view, store: store, ipam: al, log: log, now: time.Now, grace: grace, maxPerPass: DefaultNodeGCMaxPerPass, due: make(chan struct{}, 1)}
	// A node came or went, or a gc record changed (its grace, which any
	// agent may have started, arms the timer).
	g.sub = view.Notify("nodegc",
		syncer.On(func(u syncer.Update[api.Node]) bool { return u.Old == nil || u.New == nil }),
		syncer.On[datastore.KV](nil))
	return g
}

func (g *nodeGC) loop(every time.Duration, m *metrics) loop {
	return loop{name: "nodegc", every: every, wake: [2]<-chan struct{}{g.sub.C(), g.due}, pass: g.pass, observe: m.observeReconcile, log: g.log}
}

// pass looks at every node that holds IPAM state or endpoints without a
// Node record in the view, and at every node GC record.
func (g *nodeGC) pass(ctx context.Context) error {
	cands := map[string]bool{}
	for _, n := range g.view.NodesWithState() {
		if !g.view.NodeRecordExists(n) {
			cands[n] = true
		}
	}
	records, err := g.records(ctx)
	if err != nil {
		return err
	}
	for n := range records {
		cands[n] = true
	}
	var errs []error
	budget := g.maxPerPass
	for _, n := range slices.Sorted(maps.Keys(cands)) {
		done, err := g.consider(ctx, n, records[n], budget > 0)
		if err != nil {
			errs = append(errs, err)
		}
		if done {
			budget--
		}
	}
	g.armTimer(records)
	return errors.Join(errs...)
}

// armTimer wakes the loop when the earliest grace still running ends (a
// record written by this pass reaches the view later and wakes the pass
// that arms for it).
func (g *nodeGC) armTimer(records map[string]datastore.KV) {
	var next time.Duration = -1
	for _, kv := range records {
		var r gcRecord
		if json.Unmarshal(kv.Value, &r) != nil {
			continue
		}
		if left := r.GoneSince.Add(g.grace).Sub(g.now()); left > 0 && (next < 0 || left < next) {
			next = left
		}
	}
	if g.timer != nil {
		g.timer.Stop()
		g.timer = nil
	}
	if next >= 0 {
		// A little after the end, so that clocks a few milliseconds
		// apart across agents do not make the pass early.
		g.timer = time.AfterFunc(next+100*time.Millisecond, func() { kick(g.due) })
	}
}

// records returns node GC's records, by node, from the view (no pass lists
// them from etcd; a record this agent wrote moments ago and the view has not
// seen yet is found by the create's compare-and-swap).
func (g *nodeGC) records(ctx context.Context) (map[string]datastore.KV, error) {
	out := map[string]datastore.KV{}
	for _, kv := range g.view.NodeGCRecords() {
		var r gcRecord
		if err := json.Unmarshal(kv.Value, &r); err != nil || r.Node == "" || datastore.NodeGCKey(r.Node) != kv.Key {
			g.log.Warn("removing a node gc record that does not decode", "key", kv.Key, "err", err)
			if err := g.store.DeleteKV(ctx, kv.Key, kv.ModRevision); err != nil && !errors.Is(err, datastore.ErrNotFound) && !errors.Is(err, datastore.ErrConflict) {
				return nil, err
			}
			continue
		}
		out[r.Node] = kv
	}
	return out, nil
}

// consider decides about one node; released says it was released now.
// mayRelease is false once the pass has used its budget.
func (g *nodeGC) consider(ctx context.Context, n string, rec datastore.KV, mayRelease bool) (released bool, err error) {
	alive, why, err := g.alive(ctx, n)
	if err != nil {
		return false, err
	}
	if alive {
		if rec.Key != "" {
			g.log.Info("node is back: its gc grace is cancelled", "node", n, "evidence", why)
			if err := g.store.DeleteKV(ctx, rec.Key, rec.ModRevision); err != nil && !errors.Is(err, datastore.ErrNotFound) && !errors.Is(err, datastore.ErrConflict) {
				return false, fmt.Errorf("cancelling gc of node %s: %w", n, err)
			}
		}
		return false, nil
	}
	if rec.Key == "" {
		// First seen gone: the grace starts now, for every agent.
		r := gcRecord{Node: n, GoneSince: g.now().UTC()}
		val, _ := json.Marshal(r)
		_, err := g.store.Txn(ctx, []datastore.Cmp{{Key: datastore.NodeGCKey(n), ModRevision: 0}},
			[]datastore.Op{{Key: datastore.NodeGCKey(n), Value: val}})
		if err != nil && !errors.Is(err, datastore.ErrConflict) {
			return false, fmt.Errorf("recording that node %s is gone: %w", n, err)
		}
		g.log.Info("node is gone: its addresses go after the grace", "node", n, "grace", g.grace)
		return false, nil
	}
	var r gcRecord
	_ = json.Unmarshal(rec.Value, &r) // checked by records
	if g.now().Sub(r.GoneSince) < g.grace {
		return false, nil
	}
	if !mayRelease {
		g.log.Info("node gc: release deferred to a later pass (cap per pass)", "node", n, "cap", g.maxPerPass)
		return false, nil
	}
	// The view may still hold a record that this agent (or another)
	// removed when it released the node moments ago: only the record as
	// etcd has it now starts a release, so a stale one costs no budget.
	cur, err := g.store.GetKV(ctx, rec.Key)
	switch {
	case errors.Is(err, datastore.ErrNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading gc record of node %s: %w", n, err)
	}
	if cur.ModRevision != rec.ModRevision {
		// Written again since the view saw it: the next pass decides on
		// what it says then.
		return false, nil
	}
	if err := g.release(ctx, n, cur); err != nil {
		return false, err
	}
	g.released++
	g.log.Info("released deleted node", "node", n, "gone_since", r.GoneSince)
	return true, nil
}

// alive reports positive evidence that node exists: its Node record or its
// liveness record, read from etcd (the view may lag, and does not hold
// liveness records).
func (g *nodeGC) alive(ctx context.Context, n string) (bool, string, error) {
	key, err := datastore.ResourceKey(api.KindNode, "", n)
	if err != nil {
		// Not a valid node name: no Node record can exist; liveness decides.
		key = ""
	}
	if key != "" {
		_, err = g.store.GetKV(ctx, key)
		switch {
		case err == nil:
			return true, "node record", nil
		case !errors.Is(err, datastore.ErrNotFound):
			return false, "", fmt.Errorf("checking whether node %s exists: %w", n, err)
		}
	}
	_, err = g.store.GetKV(ctx, datastore.NodeLivenessKey(n))
	switch {
	case err == nil:
		return true, "liveness record", nil
	case !errors.Is(err, datastore.ErrNotFound):
		return false, "", fmt.Errorf("checking whether node %s is live: %w", n, err)
	}
	return false, "", nil
}

// release removes a dead node's endpoints, then its addresses, handles,
// blocks and affinities, then its gc record. Each step is idempotent.
func (g *nodeGC) release(ctx context.Context, n string, rec datastore.KV) error {
	// Endpoints first: once an address is free it may be handed out again,
	// and a stale endpoint's labels must not match policies by then.
	for _, w := range g.endpointsOf(ctx, n) {
		err := g.store.Delete(ctx, api.KindWorkloadEndpoint, w.namespace, w.name, w.rv)
		if err != nil && !errors.Is(err, datastore.ErrNotFound) {
			return fmt.Errorf("removing endpoint %s/%s of deleted node %s: %w", w.namespace, w.name, n, err)
		}
	}
	if err := g.ipam.ReleaseNode(ctx, n, true); err != nil {
		return fmt.Errorf("releasing addresses and blocks of deleted node %s: %w", n, err)
	}
	if err := g.store.DeleteKV(ctx, rec.Key, rec.ModRevision); err != nil && !errors.Is(err, datastore.ErrNotFound) && !errors.Is(err, datastore.ErrConflict) {
		return fmt.Errorf("removing gc record of node %s: %w", n, err)
	}
	return nil
}

// endpointRef names an endpoint at a revision: what deleting it takes.
type endpointRef struct{ namespace, name, rv string }

// endpointsOf returns the node's endpoints as etcd has them (the view's
// may lag): listing every endpoint costs one read, once per dead node.
func (g *nodeGC) endpointsOf(ctx context.Context, n string) []endpointRef {
	var out []endpointRef
	all, _, err := datastore.ListAs[*api.WorkloadEndpoint](ctx, g.store, api.KindWorkloadEndpoint, "")
	if err != nil {
		g.log.Warn("listing endpoints for node gc; using the view's", "err", err)
		for _, w := range g.view.EndpointsOn(n) {
			out = append(out, endpointRef{w.Metadata.Namespace, w.Metadata.Name, w.Metadata.ResourceVersion})
		}
		for _, r := range g.view.RemoteEndpoints() { // the agent's view keeps other nodes' compact
			if r.Node == n {
				out = append(out, endpointRef{r.Namespace, r.Name, strconv.FormatInt(r.Revision, 10)})
			}
		}
		return out
	}
	for _, w := range all {
		if w.Spec.Node == n {
			out = append(out, endpointRef{w.Metadata.Namespace, w.Metadata.Name, w.Metadata.ResourceVersion})
		}
	}
	return out
}
