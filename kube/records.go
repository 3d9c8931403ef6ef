package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// loadWritten reads the kube/ records once, so that later passes compare
// against memory (this controller is their only writer while it leads).
func (c *controller) loadWritten(ctx context.Context) error {
	kvs, _, err := c.store.ListKV(ctx, datastore.KubePrefix)
	if err != nil {
		return fmt.Errorf("listing %s: %w", datastore.KubePrefix, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.written = make(map[string][]byte, len(kvs))
	c.nodePodKey = map[string]string{}
	for _, kv := range kvs {
		c.written[kv.Key] = kv.Value
		if _, ns, name, ok := splitNodePodKey(kv.Key); ok {
			c.nodePodKey[ns+"/"+name] = kv.Key
		}
	}
	return nil
}

// putRecord writes v at key unless it already holds it; v nil deletes.
func (c *controller) putRecord(ctx context.Context, key string, v any) error {
	return c.putRecords(ctx, map[string]any{key: v})
}

// putRecords writes each value at its key (nil deletes) in one
// transaction when any key does not hold its value yet, and nothing when
// every key does. Values are written also where they are already held, so
// that all the keys written share one ModRevision: an agent compares its
// copy of a pod's record (kube/nodepods/) with the record's revision
// (kuberecords.go), and a copy written apart from its record (a pod
// recorded before the copies existed) would never compare equal.
func (c *controller) putRecords(ctx context.Context, recs map[string]any) error {
	want := make(map[string][]byte, len(recs))
	for key, v := range recs {
		var b []byte
		if v != nil {
			var err error
			if b, err = json.Marshal(v); err != nil {
				return err
			}
		}
		want[key] = b
	}
	var ops []datastore.Op
	changed := false
	c.mu.Lock()
	for key, b := range want {
		old, had := c.written[key]
		switch {
		case b == nil && !had:
			delete(want, key) // nothing to delete
		case b == nil:
			ops, changed = append(ops, datastore.Op{Key: key, Delete: true}), true
		default:
			changed = changed || !had || !bytes.Equal(old, b)
			ops = append(ops, datastore.Op{Key: key, Value: b})
		}
	}
	c.mu.Unlock()
	if !changed {
		return nil
	}
	if _, err := c.store.Txn(ctx, nil, ops); err != nil {
		keys := make([]string, 0, len(ops))
		for _, op := range ops {
			keys = append(keys, op.Key)
		}
		return fmt.Errorf("writing %s: %w", strings.Join(keys, ", "), err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, b := range want {
		node, ns, name, isNodePod := splitNodePodKey(key)
		if b == nil {
			delete(c.written, key)
			if isNodePod && c.nodePodKey[ns+"/"+name] == key {
				delete(c.nodePodKey, ns+"/"+name)
			}
			continue
		}
		c.written[key] = b
		if isNodePod && node != "" {
			c.nodePodKey[ns+"/"+name] = key
		}
	}
	return nil
}

func (c *controller) namespaceRecord(ns string) *api.KubeNamespace {
	n, err := c.nss.Get(ns)
	if err != nil {
		return nil
	}
	return NamespaceRecord(n)
}

// syncPod writes the pod's record and brings its endpoints' labels, named
// ports and namespace labels in line. A pod that is gone loses its record;
// its endpoints and addresses are address GC's business.
func (c *controller) syncPod(ctx context.Context, ns, name string) error {
	var rec *api.KubePod
	p, err := c.pods.Pods(ns).Get(name)
	switch {
	case isNotFound(err):
	case err != nil:
		return err
	default:
		rec = PodRecord(p)
	}
	var v any
	if rec != nil {
		v = rec
	}
	// The record, and its copy under its node's prefix (the node's agent
	// watches those); a copy under another node (a pod of that name that
	// ran elsewhere) goes.
	recs := map[string]any{datastore.KubePodKey(ns, name): v}
	if rec != nil && rec.Node != "" {
		recs[datastore.KubeNodePodKey(rec.Node, ns, name)] = v
	}
	c.mu.Lock()
	old := c.nodePodKey[ns+"/"+name]
	c.mu.Unlock()
	if _, keep := recs[old]; old != "" && !keep {
		recs[old] = nil
	}
	if err := c.putRecords(ctx, recs); err != nil {
		return err
	}
	if rec == nil {
		return nil
	}
	nsRec := c.namespaceRecord(ns)
	var errs []error
	for _, w := range c.endpointsOf(ns, name) {
		if w.Spec.Node != rec.Node && rec.Node != "" {
			continue // an old sandbox elsewhere: GC's
		}
		want, changed := EndpointWants(w, rec, nsRec)
		if !changed {
			continue
		}
		if _, err := datastore.UpdateAs(ctx, c.store, want); err != nil && !errors.Is(err, datastore.ErrNotFound) {
			// A conflict means the agent rewrote it: the view's update
			// queues this pod again.
			errs = append(errs, fmt.Errorf("updating endpoint %s/%s: %w", ns, w.Metadata.Name, err))
		}
	}
	return errors.Join(errs...)
}

// syncNamespace writes the namespace's record and queues its pods, whose
// endpoints carry the namespace's labels.
func (c *controller) syncNamespace(ctx context.Context, name string) error {
	var v any
	n, err := c.nss.Get(name)
	switch {
	case isNotFound(err):
	case err != nil:
		return err
	default:
		v = NamespaceRecord(n)
	}
	if err := c.putRecord(ctx, datastore.KubeNamespaceKey(name), v); err != nil {
		return err
	}
	if v == nil {
		return nil
	}
	pods, err := c.pods.Pods(name).List(everything())
	if err != nil {
		return err
	}
	for _, p := range pods {
		c.queue.Add(key{kindPod, p.Namespace, p.Name})
	}
	return nil
}

func splitPodKey(k string) (ns, name string, ok bool) {
	rest, ok := strings.CutPrefix(k, datastore.KubePodsPrefix)
	if !ok {
		return "", "", false
	}
	a, b, ok := strings.Cut(rest, "/")
	if !ok {
		return "", "", false
	}
	ns, err1 := url.PathUnescape(a)
	name, err2 := url.PathUnescape(b)
	return ns, name, err1 == nil && err2 == nil
}

// splitNodePodKey parses a datastore.KubeNodePodKey.
func splitNodePodKey(k string) (node, ns, name string, ok bool) {
	rest, ok := strings.CutPrefix(k, datastore.KubeNodePodsPrefix)
	if !ok {
		return "", "", "", false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return "", "", "", false
	}
	var errs [3]error
	node, errs[0] = url.PathUnescape(parts[0])
	ns, errs[1] = url.PathUnescape(parts[1])
	name, errs[2] = url.PathUnescape(parts[2])
	return node, ns, name, errs[0] == nil && errs[1] == nil && errs[2] == nil
}

func splitNamespaceKey(k string) (string, bool) {
	rest, ok := strings.CutPrefix(k, datastore.KubeNamespacesPrefix)
	if !ok {
		return "", false
	}
	name, err := url.PathUnescape(rest)
	return name, err == nil
}

// putMarker tells the agents that controllers manage this cluster, so that
// they require a pod record at ADD (datastore.KubeMarkerKey).
func (c *controller) putMarker(ctx context.Context) error {
	b, err := json.Marshal(api.KubeMarker{Identity: c.cfg.Identity, Since: time.Now().UTC()})
	if err != nil {
		return err
	}
	if _, err := c.store.PutKV(ctx, datastore.KubeMarkerKey, b, 0); err != nil {
		return fmt.Errorf("writing %s: %w", datastore.KubeMarkerKey, err)
	}
	return nil
}
