package syncer

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// testView is a view fed by hand (apply), synced and empty.
func testView(t *testing.T) *Syncer {
	t.Helper()
	s := New(nil, slog.New(slog.DiscardHandler))
	s.apply(datastore.Event{Type: datastore.EventResync, Revision: 1})
	return s
}

func resourceKV(t *testing.T, obj api.Object, rev int64) datastore.KV {
	t.Helper()
	key, err := datastore.ResourceKey(obj.GetTypeMeta().Kind, obj.GetMeta().Namespace, obj.GetMeta().Name)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return datastore.KV{Key: key, Value: b, ModRevision: rev}
}

func testEndpoint(node string, i int) *api.WorkloadEndpoint {
	w := &api.WorkloadEndpoint{
		Metadata: api.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("%s-k8s-web-%d-eth0", node, i)},
		Spec: api.WorkloadEndpointSpec{Node: node, Orchestrator: "k8s", Pod: fmt.Sprintf("web-%d", i), ContainerID: fmt.Sprintf("%064d", i),
			Endpoint: "eth0", InterfaceName: "cali0123456789a", IPNetworks: []string{fmt.Sprintf("10.244.%d.%d/32", len(node), i+1)}},
	}
	w.SetDefaults()
	return w
}

func onNode(node string) func(Update[api.WorkloadEndpoint]) bool {
	return func(u Update[api.WorkloadEndpoint]) bool {
		return u.Either(func(w *api.WorkloadEndpoint) bool { return w.Spec.Node == node })
	}
}

// step is an update as a test sees it: key, and the revision of the old
// and new value (-1 for none).
type step struct {
	Key      string
	Old, New int64
}

func stepOf(u Update[api.WorkloadEndpoint]) step {
	rev := func(w *api.WorkloadEndpoint) int64 {
		if w == nil {
			return -1
		}
		r, _ := strconv.ParseInt(w.Metadata.ResourceVersion, 10, 64)
		return r
	}
	return step{Key: u.Key, Old: rev(u.Old), New: rev(u.New)}
}

// TestWakeOnlyPinsNothing: 10,000 updates over 50 live endpoints. A
// wake-only subscriber that never looks holds nothing; a typed
// subscriber that takes as it goes gets exactly what changed on its node;
// one that never takes holds nothing either once it has overflowed.
func TestWakeOnlyPinsNothing(t *testing.T) {
	const live, updates = 50, 10_000
	s := testView(t)
	sig := s.Notify("routes", On(onNode("node1")), On[api.IPPool](nil))
	<-sig.C() // the view had synced: a new subscriber is kicked at once
	local := Watch(s, "local", onNode("node1"))
	idle := Watch(s, "idle", onNode("node1"))

	// 50 endpoints, a fifth of them another node's, each written again
	// and again (a new revision is a new value for the view).
	var kvs []datastore.KV
	for i := range live {
		node := "node1"
		if i%5 == 4 {
			node = "node2"
		}
		kvs = append(kvs, resourceKV(t, testEndpoint(node, i), 0))
	}
	rev := int64(1)
	last := map[string]int64{}
	var want, got []step
	for i := range updates {
		kv := kvs[i%live]
		rev++
		kv.ModRevision = rev
		s.apply(datastore.Event{Type: datastore.EventPut, KV: kv, Revision: rev})
		if i%5 != 4 {
			old, had := last[kv.Key]
			if !had {
				old = -1
			}
			want = append(want, step{Key: kv.Key, Old: old, New: rev})
			last[kv.Key] = rev
		}
		if i%100 == 99 {
			ups, all := local.Take()
			if all {
				t.Fatalf("after %d updates: the local feed overflowed", i+1)
			}
			for _, u := range ups {
				got = append(got, stepOf(u))
			}
		}
	}
	ups, _ := local.Take()
	for _, u := range ups {
		got = append(got, stepOf(u))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("what the typed feed took (-want +got):\n%s", diff)
	}

	select {
	case <-sig.C():
	default:
		t.Error("the wake-only subscriber was not woken")
	}
	if got, want := sig.Matched(), int64(len(want)); got != want {
		t.Errorf("the wake-only subscriber matched %d updates, want %d", got, want)
	}
	if n := sig.retained(); n != 0 {
		t.Errorf("the wake-only subscriber holds %d updates, want 0", n)
	}
	if n := idle.Pending(); n != 0 {
		t.Errorf("an overflowed feed holds %d updates, want 0", n)
	}
	if ups, all := idle.Take(); !all || len(ups) != 0 {
		t.Errorf("an overflowed feed's Take = %d updates, all=%v; want none, all", len(ups), all)
	}
	if n := s.Retained(); n != 0 {
		t.Errorf("the view's subscriptions hold %d updates, want 0", n)
	}
	if n := len(s.Endpoints()); n != live {
		t.Errorf("the view has %d endpoints, want %d", n, live)
	}
}

// TestTypedKinds: every kind of value reaches a feed of its type, and
// only that feed; a deletion carries the old value.
func TestTypedKinds(t *testing.T) {
	s := testView(t)
	nodes := Watch[api.Node](s, "nodes", nil)
	pools := Watch[api.IPPool](s, "pools", nil)
	blocks := Watch[ipam.BlockSummary](s, "blocks", nil)
	affs := Watch[ipam.Affinity](s, "affinities", nil)
	gcs := Watch[datastore.KV](s, "gc", nil)
	eps := Watch[api.WorkloadEndpoint](s, "endpoints", nil)

	node := &api.Node{Metadata: api.ObjectMeta{Name: "n1"}}
	node.SetDefaults()
	pool := &api.IPPool{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/24", BlockSize: 26}}
	pool.SetDefaults()
	blockVal, _ := json.Marshal(map[string]any{"cidr": "10.244.0.0/26", "affinity": "host:n1"})
	kvs := []datastore.KV{
		resourceKV(t, node, 2),
		resourceKV(t, pool, 3),
		{Key: ipam.BlockSummariesPrefix + "10.244.0.0-26", Value: blockVal, ModRevision: 4},
		{Key: ipam.AffinitiesPrefix + "n1/10.244.0.0-26", Value: []byte(`{"state":"confirmed"}`), ModRevision: 5},
		{Key: datastore.NodeGCPrefix + "n2", Value: []byte(`{"node":"n2"}`), ModRevision: 6},
	}
	for _, kv := range kvs {
		s.apply(datastore.Event{Type: datastore.EventPut, KV: kv, Revision: kv.ModRevision})
	}
	s.apply(datastore.Event{Type: datastore.EventDelete, KV: datastore.KV{Key: kvs[0].Key}, Revision: 7})

	if ups, _ := nodes.Take(); len(ups) != 2 || ups[0].New.Metadata.Name != "n1" || ups[1].New != nil || ups[1].Old.Metadata.Name != "n1" || ups[1].Revision != 7 {
		t.Errorf("node updates: %+v", ups)
	}
	if ups, _ := pools.Take(); len(ups) != 1 || ups[0].Old != nil || ups[0].New.Spec.CIDR != "10.244.0.0/24" {
		t.Errorf("pool updates: %+v", ups)
	}
	if ups, _ := blocks.Take(); len(ups) != 1 || ups[0].New.CIDR != netip.MustParsePrefix("10.244.0.0/26") || ups[0].New.Affinity != "n1" {
		t.Errorf("block updates: %+v", ups)
	}
	if ups, _ := affs.Take(); len(ups) != 1 || *ups[0].New != (ipam.Affinity{Node: "n1", Block: netip.MustParsePrefix("10.244.0.0/26"), Confirmed: true}) {
		t.Errorf("affinity updates: %+v", ups)
	}
	if ups, _ := gcs.Take(); len(ups) != 1 || ups[0].New.Key != kvs[4].Key || string(ups[0].New.Value) != `{"node":"n2"}` {
		t.Errorf("node gc updates: %+v", ups)
	}
	if n := eps.Matched(); n != 0 {
		t.Errorf("the endpoint feed matched %d updates of other kinds", n)
	}
}

// TestNotifyFilters: a signal wakes on the updates of any of its filters
// and on nothing else.
func TestNotifyFilters(t *testing.T) {
	s := testView(t)
	sig := s.Notify("bgp", On[api.IPPool](nil), On(func(u Update[ipam.Affinity]) bool { return u.New != nil && u.New.Node == "n1" }))
	<-sig.C()
	put := func(kv datastore.KV) {
		s.apply(datastore.Event{Type: datastore.EventPut, KV: kv, Revision: kv.ModRevision})
	}
	woken := func() bool {
		select {
		case <-sig.C():
			return true
		default:
			return false
		}
	}
	put(resourceKV(t, testEndpoint("n1", 1), 2))
	put(datastore.KV{Key: ipam.AffinitiesPrefix + "n2/10.244.0.64-26", Value: []byte(`{"state":"confirmed"}`), ModRevision: 3})
	if woken() {
		t.Error("woken by an endpoint and another node's affinity")
	}
	put(datastore.KV{Key: ipam.AffinitiesPrefix + "n1/10.244.0.0-26", Value: []byte(`{"state":"confirmed"}`), ModRevision: 4})
	if !woken() {
		t.Error("not woken by the node's affinity")
	}
	pool := &api.IPPool{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/24", BlockSize: 26}}
	pool.SetDefaults()
	put(resourceKV(t, pool, 5))
	if !woken() {
		t.Error("not woken by a pool")
	}
	if n := sig.Matched(); n != 2 {
		t.Errorf("matched %d updates, want 2", n)
	}
}

// TestKindOf: every type the view hands out names its kind.
func TestKindOf(t *testing.T) {
	got := []string{
		kindOf[api.Node](), kindOf[api.IPPool](), kindOf[api.BGPConfiguration](), kindOf[api.BGPPeer](),
		kindOf[api.BGPFilter](), kindOf[api.WorkloadEndpoint](), kindOf[api.NetworkPolicy](),
		kindOf[api.GlobalNetworkPolicy](), kindOf[ipam.BlockSummary](), kindOf[ipam.Affinity](), kindOf[datastore.KV](), kindOf[api.Service](),
	}
	want := []string{
		api.KindNode, api.KindIPPool, api.KindBGPConfiguration, api.KindBGPPeer,
		api.KindBGPFilter, api.KindWorkloadEndpoint, api.KindNetworkPolicy,
		api.KindGlobalNetworkPolicy, kindBlock, kindAffinity, kindNodeGC, api.KindService,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("kindOf (-want +got):\n%s", diff)
	}
}
