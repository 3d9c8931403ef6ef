package agent

import (
	"context"
	"strings"
	"sync"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/syncer"
)

// kubeRecords keeps in memory what a Kubernetes pod's CNI ADD takes from
// the records tabby-kube-controllers write: the marker, every namespace's
// record and the records of this node's pods (the controllers' copies
// under datastore.KubeNodePodsPrefixOf), each range followed by a watch.
// ADD then builds the pod's address request and endpoint at once, without
// waiting for its read of the records, and its address transaction
// carries the comparisons that the records are still what the cache held
// (podRecords.cmps): when one fails, ADD falls back to its read
// (cniadd.go). A namespace change costs every agent an event (namespaces
// are few and change rarely); another node's pod costs none.
type kubeRecords struct {
	node string

	mu sync.Mutex
	// kvs holds the records of the three ranges by key (relative).
	kvs map[string]datastore.KV
	// synced: each range's first list has arrived.
	synced [3]bool
}

func newKubeRecords(node string) *kubeRecords {
	return &kubeRecords{node: node, kvs: map[string]datastore.KV{}}
}

// specs are the three watched ranges: the marker, the namespaces, this
// node's pods.
func (k *kubeRecords) specs() [3]datastore.WatchSpec {
	marker := []byte(datastore.KubeMarkerKey)
	return [3]datastore.WatchSpec{
		{Prefix: datastore.KubeMarkerKey, Keep: func(key []byte) bool { return string(key) == string(marker) }},
		{Prefix: datastore.KubeNamespacesPrefix},
		{Prefix: datastore.KubeNodePodsPrefixOf(k.node)},
	}
}

// run follows the three ranges until ctx ends, watching through w (the
// datastore, as the cluster view does).
func (k *kubeRecords) run(ctx context.Context, w syncer.Source) {
	var wg sync.WaitGroup
	for i, spec := range k.specs() {
		wg.Go(func() {
			w.WatchKeysFunc(ctx, spec, 0, func(evs []datastore.Event) { k.apply(i, spec, evs) })
		})
	}
	wg.Wait()
}

func (k *kubeRecords) apply(i int, spec datastore.WatchSpec, evs []datastore.Event) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, ev := range evs {
		switch ev.Type {
		case datastore.EventResync:
			for key := range k.kvs {
				if strings.HasPrefix(key, spec.Prefix) && (spec.Keep == nil || spec.Keep([]byte(key))) {
					delete(k.kvs, key)
				}
			}
			for _, kv := range ev.Snapshot {
				k.kvs[kv.Key] = kv
			}
			k.synced[i] = true
		case datastore.EventPut:
			k.kvs[ev.KV.Key] = ev.KV
		case datastore.EventDelete:
			delete(k.kvs, ev.KV.Key)
		}
	}
}

// podRecords are a pod's records as the cache holds them.
type podRecords struct {
	// pod and ns are the pod's and its namespace's records (nil: none);
	// a nil pod means a cluster the controllers do not manage.
	pod, ns *datastore.KV
	// cmps hold in etcd when the records are still these: the pod's (at
	// its own key, which the controllers write with the copy), its
	// namespace's (with a pod record) and the marker.
	cmps []datastore.Cmp
}

// lookup returns the pod's records as the cache holds them, or false when
// it cannot tell: a range not listed yet, or a cluster the controllers
// manage whose copy of the pod is not here (not written yet, or written by
// controllers that make no copies). It decides as readPodRecords does.
func (k *kubeRecords) lookup(ns, name string) (podRecords, bool) {
	if k == nil {
		return podRecords{}, false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.synced != [3]bool{true, true, true} {
		return podRecords{}, false
	}
	rev := func(kv *datastore.KV) int64 {
		if kv == nil {
			return 0 // must not exist
		}
		return kv.ModRevision
	}
	get := func(key string) *datastore.KV { return kvAt(k.kvs, key) }
	marker := get(datastore.KubeMarkerKey)
	var r podRecords
	if r.pod = get(datastore.KubeNodePodKey(k.node, ns, name)); podRecordsSay(r.pod, marker) == notYet {
		return podRecords{}, false // the read waits for it
	}
	r.cmps = []datastore.Cmp{{Key: datastore.KubePodKey(ns, name), ModRevision: rev(r.pod)}, {Key: datastore.KubeMarkerKey, ModRevision: rev(marker)}}
	if r.pod != nil {
		r.ns = get(datastore.KubeNamespaceKey(ns))
		r.cmps = append(r.cmps, datastore.Cmp{Key: datastore.KubeNamespaceKey(ns), ModRevision: rev(r.ns)})
	}
	return r, true
}
