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
	for _, kv := range kvs {
		c.written[kv.Key] = kv.Value
	}
	return nil
}

// putRecord writes v at key unless it already holds it; v nil deletes.
func (c *controller) putRecord(ctx context.Context, key string, v any) error {
	var b []byte
	if v != nil {
		var err error
		if b, err = json.Marshal(v); err != nil {
			return err
		}
	}
	c.mu.Lock()
	old, had := c.written[key]
	c.mu.Unlock()
	switch {
	case b == nil && !had:
		return nil
	case b != nil && had && bytes.Equal(old, b):
		return nil
	case b == nil:
		if err := c.store.DeleteKV(ctx, key, 0); err != nil && !errors.Is(err, datastore.ErrNotFound) {
			return fmt.Errorf("deleting %s: %w", key, err)
		}
		c.mu.Lock()
		delete(c.written, key)
		c.mu.Unlock()
		return nil
	}
	if _, err := c.store.PutKV(ctx, key, b, 0); err != nil {
		return fmt.Errorf("writing %s: %w", key, err)
	}
	c.mu.Lock()
	c.written[key] = b
	c.mu.Unlock()
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
	if err := c.putRecord(ctx, datastore.KubePodKey(ns, name), v); err != nil {
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
