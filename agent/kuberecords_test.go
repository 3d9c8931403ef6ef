package agent

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/agent/attach"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/testkit"
)

// startKubeRecords runs the handler's cache of the controllers' records
// until the test ends and waits for its first lists.
func startKubeRecords(t *testing.T, e *handlerEnv) *kubeRecords {
	t.Helper()
	k := newKubeRecords("node1")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); k.run(ctx, e.store) }()
	t.Cleanup(func() { cancel(); <-done })
	testkit.Eventually(t, 10*time.Second, "the records' first lists", testkit.Cond(func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.synced == [3]bool{true, true, true}
	}))
	e.h.kube = k
	return k
}

// putPodRecord writes a pod's record and its copy under node1, in one
// transaction as the controllers do, and returns its revision.
func putPodRecord(t *testing.T, e *handlerEnv, p api.KubePod) int64 {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := e.store.Txn(context.Background(), nil, []datastore.Op{
		{Key: datastore.KubePodKey(p.Namespace, p.Name), Value: b}, {Key: datastore.KubeNodePodKey("node1", p.Namespace, p.Name), Value: b}})
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// holds waits until the cache holds key at rev or later.
func (k *kubeRecords) holds(t *testing.T, key string, rev int64) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, key+" in the cache", testkit.Cond(func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.kvs[key].ModRevision >= rev
	}))
}

// The cache decides as readPodRecords does, with the comparisons that its
// records are still etcd's.
func TestKubeRecordsLookup(t *testing.T) {
	e := newHandlerEnv(t)
	k := startKubeRecords(t, e)
	r, ok := k.lookup("ns1", "a")
	want := []datastore.Cmp{{Key: datastore.KubePodKey("ns1", "a")}, {Key: datastore.KubeMarkerKey}}
	if !ok || r.pod != nil || !cmp.Equal(want, r.cmps) {
		t.Fatalf("unmanaged cluster: %+v, %v; want no pod and %v", r, ok, want)
	}
	putJSON(t, e.store, datastore.KubeMarkerKey, api.KubeMarker{Identity: "test"})
	marker := storeRev(t, e.store)
	k.holds(t, datastore.KubeMarkerKey, marker)
	if _, ok := k.lookup("ns1", "a"); ok {
		t.Fatal("managed cluster without the pod's copy: the cache answered")
	}
	putJSON(t, e.store, datastore.KubeNamespaceKey("ns1"), api.KubeNamespace{Name: "ns1"})
	nsRev := storeRev(t, e.store)
	podRev := putPodRecord(t, e, api.KubePod{Namespace: "ns1", Name: "a", Node: "node1"})
	k.holds(t, datastore.KubeNodePodKey("node1", "ns1", "a"), podRev)
	k.holds(t, datastore.KubeNamespaceKey("ns1"), nsRev)
	r, ok = k.lookup("ns1", "a")
	want = []datastore.Cmp{{Key: datastore.KubePodKey("ns1", "a"), ModRevision: podRev}, {Key: datastore.KubeMarkerKey, ModRevision: marker},
		{Key: datastore.KubeNamespaceKey("ns1"), ModRevision: nsRev}}
	if !ok || r.pod == nil || r.ns == nil || !cmp.Equal(want, r.cmps) {
		t.Fatalf("the pod's copy: %+v, %v; want its records and %v", r, ok, want)
	}
	// Another node's pod is not watched: the cache cannot say.
	b, _ := json.Marshal(api.KubePod{Namespace: "ns1", Name: "b", Node: "node2"})
	if _, err := e.store.PutKV(context.Background(), datastore.KubeNodePodKey("node2", "ns1", "b"), b, 0); err != nil {
		t.Fatal(err)
	}
	if _, ok := k.lookup("ns1", "b"); ok {
		t.Error("another node's pod: the cache answered")
	}
}

// With the pod's records in the cache, ADD reads none of them: the
// address request and the endpoint come from the copy (the endpoint's
// creation compares it with etcd's), and the policy gate waits for the
// endpoint's revision, not a read's.
func TestCNIAddTakesCachedRecords(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t)
	k := startKubeRecords(t, e)
	putJSON(t, e.store, datastore.KubeMarkerKey, api.KubeMarker{Identity: "test"})
	rev := putPodRecord(t, e, api.KubePod{Namespace: "ns1", Name: "pod-c1", Node: "node1", Labels: map[string]string{"app": "cached"}})
	k.holds(t, datastore.KubeNodePodKey("node1", "ns1", "pod-c1"), rev)
	k.holds(t, datastore.KubeMarkerKey, 1)

	var reads atomic.Int32
	e.h.readHook = func() { reads.Add(1) }
	var gotRev, gotSince int64
	e.h.policy = attach.PolicyFunc(func(_ context.Context, _ *api.WorkloadEndpoint, rev, since int64) error {
		gotRev, gotSince = rev, since
		return nil
	})
	req, conf, args := addReq("c1")
	if _, err := e.h.Add(ctx, req, conf, args); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if n := reads.Load(); n != 0 {
		t.Errorf("%d reads of the records, want none: the copy answered", n)
	}
	eps := e.endpoints(t)
	if len(eps) != 1 || eps[0].Metadata.Labels["app"] != "cached" {
		t.Fatalf("endpoints %+v, want one with the copy's label app=cached", eps)
	}
	if gotSince != 0 || gotRev == 0 {
		t.Errorf("the gate got rev %d since %d; want the endpoint's revision and no read's (0)", gotRev, gotSince)
	}
}

// A cache older than etcd's record: the assignment's transaction refuses
// the endpoint, which ADD writes from its read (the newer labels); an
// address annotation that changed fails ADD, which leaves nothing.
func TestCNIAddStaleCachedRecords(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t)
	if _, err := e.store.Create(ctx, &api.IPPool{Metadata: api.ObjectMeta{Name: "pool2"}, Spec: api.IPPoolSpec{CIDR: "10.244.1.0/24", BlockSize: 28}}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "two pools in the view", testkit.Cond(func() bool { return len(e.view.Pools()) == 2 }))
	k := startKubeRecords(t, e)
	putJSON(t, e.store, datastore.KubeMarkerKey, api.KubeMarker{Identity: "test"})
	const poolsAnnotation = "cni.projectcalico.org/" + api.AnnotationIPv4Pools
	for _, name := range []string{"pod-s1", "pod-s2"} {
		rec := api.KubePod{Namespace: "ns1", Name: name, Node: "node1", Labels: map[string]string{"app": "old"},
			Annotations: map[string]string{poolsAnnotation: `["pool1"]`}}
		k.holds(t, datastore.KubeNodePodKey("node1", "ns1", name), putPodRecord(t, e, rec))
		// etcd's record moves on; the copy the cache holds does not.
		rec.Labels["app"] = "new"
		if name == "pod-s2" {
			rec.Annotations[poolsAnnotation] = `["pool2"]`
		}
		putJSON(t, e.store, datastore.KubePodKey("ns1", name), rec)
	}
	k.holds(t, datastore.KubeMarkerKey, 1)

	req, conf, args := addReq("s1")
	if _, err := e.h.Add(ctx, req, conf, args); err != nil {
		t.Fatalf("ADD with a stale cache: %v", err)
	}
	eps := e.endpoints(t)
	if len(eps) != 1 || eps[0].Metadata.Labels["app"] != "new" {
		t.Fatalf("endpoints %v, want one labelled app=new (etcd's record)", eps)
	}

	req, conf, args = addReq("s2")
	_, err := e.h.Add(ctx, req, conf, args)
	var te *types.Error
	if !errors.As(err, &te) || te.Code != types.ErrTryAgainLater {
		t.Fatalf("ADD whose pool annotation changed under the cache: %v, want try again later", err)
	}
	if n := len(e.endpoints(t)); n != 1 {
		t.Errorf("%d endpoints after the failed ADD, want 1", n)
	}
	if addrs, err := e.alloc.AddressesByHandle(ctx, ipamHandle(conf.Name, req.ContainerID)); err != nil || len(addrs) != 0 {
		t.Errorf("the failed ADD's addresses: %v, %v; want none", addrs, err)
	}
}

// A dual-stack pod: the records' comparisons ride on the last family's
// transaction; a stale copy leaves the endpoint to the read's records and
// both addresses in place.
func TestCNIAddDualStackCachedRecords(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t)
	mustCreate(t, e.store, &api.IPPool{Metadata: api.ObjectMeta{Name: "v6"}, Spec: api.IPPoolSpec{CIDR: "fd00:10:244::/64"}})
	testkit.Eventually(t, 10*time.Second, "two pools in the view", testkit.Cond(func() bool { return len(e.view.Pools()) == 2 }))
	k := startKubeRecords(t, e)
	putJSON(t, e.store, datastore.KubeMarkerKey, api.KubeMarker{Identity: "test"})
	k.holds(t, datastore.KubeMarkerKey, 1)
	for _, tt := range []struct {
		id, want string
		stale    bool
	}{{"d1", "cached", false}, {"d2", "read", true}} {
		rec := api.KubePod{Namespace: "ns1", Name: "pod-" + tt.id, Node: "node1", Labels: map[string]string{"app": "cached"}}
		k.holds(t, datastore.KubeNodePodKey("node1", "ns1", rec.Name), putPodRecord(t, e, rec))
		if tt.stale {
			rec.Labels["app"] = "read"
			putJSON(t, e.store, datastore.KubePodKey("ns1", rec.Name), rec)
		}
		req, conf, args := addReq(tt.id)
		conf.AssignIPv6 = flex(true)
		endpoint := func() *api.WorkloadEndpoint {
			for _, w := range e.endpoints(t) {
				if w.Spec.Pod == rec.Name {
					return w
				}
			}
			return nil
		}
		var reads atomic.Int32
		e.h.readHook = func() { reads.Add(1) }
		if _, err := e.h.Add(ctx, req, conf, args); err != nil {
			t.Fatalf("%s: ADD: %v", tt.id, err)
		}
		// From a fresh copy nothing is read; a stale one is read once.
		if want := int32(btoi(tt.stale)); reads.Load() != want {
			t.Errorf("%s: %d reads of the records, want %d", tt.id, reads.Load(), want)
		}
		wep := endpoint()
		if wep == nil || wep.Metadata.Labels["app"] != tt.want || len(wep.Spec.IPNetworks) != 2 {
			t.Fatalf("%s: endpoint %+v, want app=%s and two addresses", tt.id, wep, tt.want)
		}
		if held, err := e.alloc.AddressesByHandle(ctx, wep.Spec.IPAMHandle); err != nil || len(held) != 2 {
			t.Errorf("%s: handle holds %v, %v; want both addresses", tt.id, held, err)
		}
	}
}
