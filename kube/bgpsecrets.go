package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// BGP passwords from Secrets (docs/bgp.md, "Passwords from Secrets"). The
// controllers watch the Secrets of their own namespace (a namespaced Role:
// get, list, watch on secrets there and nowhere else) and copy into the
// etcd record datastore.BGPSecretsKey exactly the keys that a BGPPeer's
// password or the BGPConfiguration's nodeMeshPassword names, with the
// reason for each that is missing. The agents read that record and need no
// Kubernetes rights; a Secret no BGP resource names never leaves the API
// server.

// secretSync is the Secret side of the controller.
type secretSync struct {
	factory informers.SharedInformerFactory
	lister  listerscorev1.SecretLister
	synced  cache.InformerSynced
	dirty   chan struct{}
	last    []byte // the record as last written or read
}

// watchSecrets sets up the Secret informer of the controllers' namespace.
func (c *controller) watchSecrets() {
	c.secrets.factory = informers.NewSharedInformerFactoryWithOptions(c.kc, 0, informers.WithNamespace(c.cfg.LeaseNamespace))
	inf := c.secrets.factory.Core().V1().Secrets()
	c.secrets.lister = inf.Lister()
	c.secrets.dirty = make(chan struct{}, 1)
	_, _ = inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.markSecretsDirty() },
		UpdateFunc: func(_, _ any) { c.markSecretsDirty() },
		DeleteFunc: func(any) { c.markSecretsDirty() },
	})
	c.secrets.synced = inf.Informer().HasSynced
}

func (c *controller) markSecretsDirty() {
	select {
	case c.secrets.dirty <- struct{}{}:
	default:
	}
}

// BGPPasswordRefs lists, sorted and once each, the Secret keys that BGP
// passwords name in peers and configs.
func BGPPasswordRefs(peers []*api.BGPPeer, configs []*api.BGPConfiguration) []api.SecretKeyRef {
	var out []api.SecretKeyRef
	for _, p := range peers {
		if p != nil && p.Spec.Password.SecretKeyRef != nil {
			out = append(out, *p.Spec.Password.SecretKeyRef)
		}
	}
	for _, c := range configs {
		if c != nil && c.Spec.NodeMeshPassword.SecretKeyRef != nil {
			out = append(out, *c.Spec.NodeMeshPassword.SecretKeyRef)
		}
	}
	slices.SortFunc(out, func(a, b api.SecretKeyRef) int { return strings.Compare(a.String(), b.String()) })
	return slices.Compact(out)
}

// BGPSecretsRecord is the record of the keys refs name, read from the
// Secrets of namespace ns through get (nil Secret and nil error: not
// found). It is pure but for get.
func BGPSecretsRecord(ns string, refs []api.SecretKeyRef, get func(name string) (*corev1.Secret, error)) datastore.BGPSecrets {
	rec := datastore.BGPSecrets{Namespace: ns}
	missing := func(ref api.SecretKeyRef, format string, args ...any) {
		if rec.Missing == nil {
			rec.Missing = map[string]string{}
		}
		rec.Missing[ref.String()] = fmt.Sprintf(format, args...)
	}
	for _, ref := range refs {
		s, err := get(ref.Name)
		switch {
		case err != nil:
			missing(ref, "reading Secret %s/%s: %v", ns, ref.Name, err)
			continue
		case s == nil:
			missing(ref, "Secret %s/%s not found", ns, ref.Name)
			continue
		}
		v, ok := s.Data[ref.Key]
		if !ok {
			v, ok = []byte(s.StringData[ref.Key]), s.StringData[ref.Key] != ""
		}
		switch {
		case !ok:
			missing(ref, "Secret %s/%s has no key %q", ns, ref.Name, ref.Key)
		case len(v) == 0 || len(v) > api.MaxBGPPasswordLen:
			missing(ref, "Secret %s/%s key %q has %d bytes; a TCP-MD5 key has 1 to %d", ns, ref.Name, ref.Key, len(v), api.MaxBGPPasswordLen)
		default:
			if rec.Values == nil {
				rec.Values = map[string]string{}
			}
			rec.Values[ref.String()] = string(v)
		}
	}
	return rec
}

// syncBGPSecrets writes the record of the keys the view's BGP resources
// name when it changed. It never logs a value.
func (c *controller) syncBGPSecrets(ctx context.Context) error {
	var configs []*api.BGPConfiguration
	if bc := c.view.BGPConfiguration(); bc != nil {
		configs = append(configs, bc)
	}
	refs := BGPPasswordRefs(c.view.BGPPeers(), configs)
	rec := BGPSecretsRecord(c.cfg.LeaseNamespace, refs, func(name string) (*corev1.Secret, error) {
		s, err := c.secrets.lister.Secrets(c.cfg.LeaseNamespace).Get(name)
		if isNotFound(err) {
			return nil, nil
		}
		return s, err
	})
	val, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if c.secrets.last == nil {
		if kv, err := c.store.GetKV(ctx, datastore.BGPSecretsKey); err == nil {
			c.secrets.last = kv.Value
		}
	}
	if bytes.Equal(val, c.secrets.last) {
		return nil
	}
	if _, err := c.store.PutKV(ctx, datastore.BGPSecretsKey, val, 0); err != nil {
		return fmt.Errorf("writing %s: %w", datastore.BGPSecretsKey, err)
	}
	c.secrets.last = val
	c.log.Info("bgp password keys copied from Secrets", "namespace", rec.Namespace, "keys", len(rec.Values), "missing", len(rec.Missing))
	return nil
}
