package kube

import (
	"context"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// Address GC: an address whose pod Kubernetes no longer has (its DEL was
// lost: a node crashed, the kubelet was replaced) is released once it has
// been seen orphaned for Config.GCGrace, never while the informers or the
// etcd view are not synced, never more than a bounded share of all
// allocations in one pass, and only after the API server itself (not the
// informer's cache) confirms the pod is gone.

type gcState struct {
	// firstSeen: when each candidate was first seen orphaned.
	firstSeen map[string]time.Time
}

type gcCandidate struct {
	id     string
	ns     string
	pod    string
	node   string // the node the address is used on
	handle string
	wep    *api.WorkloadEndpoint // nil: an allocation without endpoint
}

func everything() labels.Selector { return labels.Everything() }

func (c *controller) allSynced() bool {
	for _, s := range c.synced {
		if !s() {
			return false
		}
	}
	return c.view.Synced()
}

// orphaned says whether pod ns/name on node is one Kubernetes no longer
// has there (gone, or recreated on another node).
func (c *controller) orphaned(ns, name, node string) bool {
	p, err := c.pods.Pods(ns).Get(name)
	if err != nil {
		return isNotFound(err)
	}
	return p.Spec.NodeName != "" && p.Spec.NodeName != node
}

func (c *controller) gcCandidates(ctx context.Context) ([]gcCandidate, int, error) {
	allocs, err := c.ipam.Allocations(ctx)
	if err != nil {
		return nil, 0, err
	}
	var out []gcCandidate
	held := map[string]bool{}
	for _, w := range c.view.Endpoints() {
		held[w.Spec.IPAMHandle] = true
		if w.Spec.Orchestrator != "k8s" || !c.orphaned(w.Metadata.Namespace, w.Spec.Pod, w.Spec.Node) {
			continue
		}
		out = append(out, gcCandidate{id: "wep:" + w.Metadata.Namespace + "/" + w.Metadata.Name,
			ns: w.Metadata.Namespace, pod: w.Spec.Pod, node: w.Spec.Node, handle: w.Spec.IPAMHandle, wep: w})
	}
	seen := map[string]bool{}
	for _, al := range allocs {
		if al.Handle == "" || held[al.Handle] || seen[al.Handle] || al.Pod == "" {
			continue
		}
		seen[al.Handle] = true
		if !c.orphaned(al.Namespace, al.Pod, al.Node) {
			continue
		}
		out = append(out, gcCandidate{id: "handle:" + al.Handle, ns: al.Namespace, pod: al.Pod, node: al.Node, handle: al.Handle})
	}
	return out, len(allocs), nil
}

// gcPass runs one pass at now and returns how many addresses it released.
func (c *controller) gcPass(ctx context.Context, now time.Time) (int, error) {
	if !c.allSynced() {
		return 0, nil
	}
	cands, total, err := c.gcCandidates(ctx)
	if err != nil {
		return 0, fmt.Errorf("listing allocations: %w", err)
	}
	limit := max(c.cfg.GCMinBatch, int(c.cfg.GCMaxShare*float64(total)))
	live := map[string]bool{}
	var ready []gcCandidate
	for _, cd := range cands {
		live[cd.id] = true
		first, ok := c.gc.firstSeen[cd.id]
		if !ok {
			c.gc.firstSeen[cd.id] = now
			continue
		}
		if now.Sub(first) >= c.cfg.GCGrace {
			ready = append(ready, cd)
		}
	}
	for id := range c.gc.firstSeen {
		if !live[id] {
			delete(c.gc.firstSeen, id)
		}
	}
	if len(ready) > limit {
		c.log.Warn("address GC: more orphaned addresses than one pass may release; the rest wait for later passes",
			"orphaned", len(ready), "limit", limit, "allocations", total)
		ready = ready[:limit]
	}
	n := 0
	var errs []error
	for _, cd := range ready {
		// The informer's cache said the pod is gone: ask the API server.
		p, err := c.kc.CoreV1().Pods(cd.ns).Get(ctx, cd.pod, metav1.GetOptions{})
		if err == nil && (p.Spec.NodeName == "" || p.Spec.NodeName == cd.node) {
			delete(c.gc.firstSeen, cd.id)
			continue
		}
		if err != nil && !isNotFound(err) {
			errs = append(errs, err)
			continue
		}
		// The endpoint goes first: once the address is free it may be
		// handed out again, and the stale endpoint's labels must not match
		// policies by then. An endpoint changed since the view saw it is
		// left to the next pass.
		if cd.wep != nil {
			err := c.store.Delete(ctx, api.KindWorkloadEndpoint, cd.wep.Metadata.Namespace, cd.wep.Metadata.Name, cd.wep.Metadata.ResourceVersion)
			if err != nil && !errors.Is(err, datastore.ErrNotFound) {
				errs = append(errs, fmt.Errorf("deleting endpoint %s: %w", cd.id, err))
				continue
			}
		}
		// An endpoint whose address came without IPAM has no handle.
		if cd.handle != "" {
			if err := c.ipam.ReleaseHandle(ctx, cd.handle); err != nil {
				errs = append(errs, fmt.Errorf("releasing %s: %w", cd.handle, err))
				continue
			}
		}
		delete(c.gc.firstSeen, cd.id)
		c.log.Info("address GC released the address of a pod Kubernetes no longer has",
			"namespace", cd.ns, "pod", cd.pod, "node", cd.node, "handle", cd.handle)
		n++
	}
	return n, errors.Join(errs...)
}
