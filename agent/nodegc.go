package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/syncer"
)

// NodeGCGrace is how long a deleted node's addresses stay allocated after
// its block affinities were released (its pods may still be draining).
var NodeGCGrace = 5 * time.Minute

// nodeGC releases the blocks and addresses of nodes that no longer exist.
// Every agent may do it; IPAM's compare-and-swap writes make concurrent
// releases safe.
type nodeGC struct {
	view  *syncer.Syncer
	store *datastore.Store
	ipam  *ipam.Allocator
	log   *slog.Logger
	sub   *syncer.Subscription

	mu      sync.Mutex
	missing map[string]time.Time // node → first seen gone
}

func newNodeGC(view *syncer.Syncer, store *datastore.Store, al *ipam.Allocator, log *slog.Logger) *nodeGC {
	g := &nodeGC{view: view, store: store, ipam: al, log: log, missing: map[string]time.Time{}}
	g.sub = view.Subscribe("nodegc", func(u syncer.Update) bool {
		return u.Kind == api.KindNode && (u.Old == nil || u.New == nil) // a node came or went
	})
	return g
}

func (g *nodeGC) loop(every time.Duration, m *metrics) loop {
	return loop{name: "nodegc", every: every, wake: [2]<-chan struct{}{g.sub.C()}, pass: g.pass, observe: m.observeReconcile, log: g.log}
}

// pass releases the affinities of nodes that no longer exist at once and,
// after NodeGCGrace, their addresses.
func (g *nodeGC) pass(ctx context.Context) error {
	affine := map[string]bool{}
	var gone []string
	for _, n := range g.view.AffineNodes() {
		if !g.view.NodeRecordExists(n) {
			affine[n] = true
			gone = append(gone, n)
		}
	}
	g.mu.Lock()
	for n := range g.missing {
		switch {
		case g.view.NodeRecordExists(n):
			delete(g.missing, n) // it came back
		case !affine[n]:
			gone = append(gone, n) // claims released, addresses due later
		}
	}
	g.mu.Unlock()
	return g.release(ctx, gone, affine)
}

// release handles the nodes the view says are gone; each is confirmed
// against etcd first (the view may lag a re-created node).
func (g *nodeGC) release(ctx context.Context, gone []string, claims map[string]bool) error {
	now := time.Now()
	var errs []error
	for _, n := range gone {
		key, err := datastore.ResourceKey(api.KindNode, "", n)
		if err == nil {
			_, err = g.store.GetKV(ctx, key)
		}
		switch {
		case err == nil:
			continue // it exists: the view will catch up
		case !errors.Is(err, datastore.ErrNotFound):
			errs = append(errs, fmt.Errorf("checking that node %s is gone: %w", n, err))
			continue
		}
		g.mu.Lock()
		first, seen := g.missing[n]
		if !seen {
			first = now
			g.missing[n] = now
		}
		g.mu.Unlock()
		// Affinities go at once: the node will not use its blocks again.
		if claims[n] {
			if err := g.ipam.ReleaseNode(ctx, n, false); err != nil {
				errs = append(errs, fmt.Errorf("releasing blocks of deleted node %s: %w", n, err))
				continue
			}
			g.log.Info("released block affinities of deleted node", "node", n)
		}
		if now.Sub(first) < NodeGCGrace {
			continue
		}
		if err := g.ipam.ReleaseNode(ctx, n, true); err != nil {
			errs = append(errs, fmt.Errorf("releasing addresses of deleted node %s: %w", n, err))
			continue
		}
		g.log.Info("released addresses of deleted node", "node", n)
		g.mu.Lock()
		delete(g.missing, n)
		g.mu.Unlock()
	}
	return errors.Join(errs...)
}
