package syncer_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/syncer"
	"github.com/tabbynet/tabby/syncer/syncertest"
)

func start(t *testing.T, src syncer.Source) *syncer.Syncer {
	t.Helper()
	return syncertest.Start(t, src, nil, true)
}

func mustCreate(t *testing.T, st *datastore.Store, obj api.Object) int64 {
	t.Helper()
	out, err := st.Create(context.Background(), obj)
	if err != nil {
		t.Fatalf("creating %s %s: %v", obj.GetTypeMeta().Kind, obj.GetMeta().Name, err)
	}
	return rev(t, out)
}

func rev(t *testing.T, obj api.Object) int64 {
	t.Helper()
	var r int64
	for _, c := range obj.GetMeta().ResourceVersion {
		r = r*10 + int64(c-'0')
	}
	return r
}

func wep(node, name, addr string) *api.WorkloadEndpoint {
	return &api.WorkloadEndpoint{
		Metadata: api.ObjectMeta{Name: name, Namespace: "default"},
		Spec: api.WorkloadEndpointSpec{Node: node, Orchestrator: "cni", Pod: name, ContainerID: name, Endpoint: "eth0",
			InterfaceName: "cali" + name, IPNetworks: []string{addr + "/32"}},
	}
}

// nodeFeeds are what a node's incremental consumer takes: its endpoints
// and the blocks affine to it.
type nodeFeeds struct {
	endpoints *syncer.Feed[api.WorkloadEndpoint]
	blocks    *syncer.Feed[ipam.BlockSummary]
}

func watchNode(v *syncer.Syncer, node string) nodeFeeds {
	return nodeFeeds{
		endpoints: syncer.Watch(v, node, func(u syncer.Update[api.WorkloadEndpoint]) bool {
			return u.Either(func(w *api.WorkloadEndpoint) bool { return w.Spec.Node == node })
		}),
		blocks: syncer.Watch(v, node, func(u syncer.Update[ipam.BlockSummary]) bool {
			return u.Either(func(b *ipam.BlockSummary) bool { return b.Affinity == node })
		}),
	}
}

func TestViewFollowsEtcd(t *testing.T) {
	st := storetest.New(t)
	ctx := context.Background()
	mustCreate(t, st, &api.IPPool{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/30", BlockSize: 30}})
	for _, n := range []string{"a", "b"} {
		mustCreate(t, st, &api.Node{Metadata: api.ObjectMeta{Name: n}, Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: "198.18.0.1/24"}}})
	}
	v := start(t, st)
	subA, subB := watchNode(v, "a"), watchNode(v, "b")
	<-subA.endpoints.C() // the view has synced: a new subscriber is kicked at once
	<-subB.blocks.C()
	if got := len(v.Nodes()); got != 2 {
		t.Fatalf("Nodes() has %d nodes, want 2", got)
	}

	al := ipam.New(st)
	asg, err := al.Assign(ctx, ipam.AssignRequest{Node: "a", Handle: "h1", Attrs: ipam.Attributes{Node: "a"}})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "a's block in the view", testkit.Cond(func() bool { bs := v.BlocksOf("a"); return len(bs) == 1 && bs[0].Confirmed }))
	want := []ipam.BlockInfo{{CIDR: netip.MustParsePrefix("10.244.0.0/30"), Pool: "p", Affinity: "a", Confirmed: true}}
	if diff := cmp.Diff(want, v.BlocksOf("a"), cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
		t.Errorf("BlocksOf(a) (-want +got):\n%s", diff)
	}
	for _, c := range []struct {
		node, addr string
		want       bool
	}{{"a", "10.244.0.3", true}, {"a", "10.244.0.4", false}, {"b", "10.244.0.3", false}} {
		if got := v.InBlocksOf(c.node, netip.MustParseAddr(c.addr)); got != c.want {
			t.Errorf("InBlocksOf(%s, %s) = %v, want %v", c.node, c.addr, got, c.want)
		}
	}
	if ups, _ := subA.blocks.Take(); len(ups) == 0 {
		t.Error("a's subscription saw no update for its new block")
	}

	// A second address in a's own block changes nothing the view shows:
	// no update for anyone.
	before := v.Stats().Updates
	r := v.Revision()
	if _, err := al.Assign(ctx, ipam.AssignRequest{Node: "a", Handle: "h2", Attrs: ipam.Attributes{Node: "a"}}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the second assign's revision", testkit.Cond(func() bool { return v.Revision() > r }))
	if got := v.Stats().Updates; got != before {
		t.Errorf("an allocation in the node's own block made %d updates, want 0", got-before)
	}

	// b borrows from a's block: one block update, which b's owner takes.
	if _, err := al.Assign(ctx, ipam.AssignRequest{Node: "b", Handle: "h3", Attrs: ipam.Attributes{Node: "b"}}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "b's borrowed address", testkit.Cond(func() bool { return len(v.BorrowedBy("b")) == 1 }))
	if got := v.BorrowedBy("b")[0]; got.BlockNode != "a" || !got.Block.Contains(got.Addr) {
		t.Errorf("BorrowedBy(b) = %+v", got)
	}

	// Endpoints: by node, and a's subscription does not see b's.
	subA.endpoints.Take()
	r1 := mustCreate(t, st, wep("a", "pa", asg.Addr.String()))
	mustCreate(t, st, wep("b", "pb", "10.244.0.2"))
	r2 := v.Revision()
	if err := v.WaitRevision(ctx, r1); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "both endpoints", testkit.Cond(func() bool { return len(v.Endpoints()) == 2 }))
	if got := v.EndpointsOn("a"); len(got) != 1 || got[0].Metadata.Name != "pa" {
		t.Errorf("EndpointsOn(a) = %v", got)
	}
	_ = r2
	ups, _ := subA.endpoints.Take()
	for _, u := range ups {
		if u.New != nil && u.New.Spec.Node != "a" {
			t.Errorf("a's subscription got b's endpoint %s", u.New.Metadata.Name)
		}
	}
	if len(ups) != 1 {
		t.Errorf("a's subscription got %d updates for its endpoint, want 1", len(ups))
	}

	// A deleted node is gone from the view; its record no longer exists.
	if err := st.Delete(ctx, api.KindNode, "", "b", ""); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "node b's deletion", testkit.Cond(func() bool { _, ok := v.Node("b"); return !ok }))
	if v.NodeRecordExists("b") || !v.NodeRecordExists("a") {
		t.Errorf("NodeRecordExists: b %v (want false), a %v (want true)", v.NodeRecordExists("b"), v.NodeRecordExists("a"))
	}
	// b is gone but still holds an endpoint and a borrowed address: a
	// candidate of node GC.
	if diff := cmp.Diff([]string{"a", "b"}, v.NodesWithState()); diff != "" {
		t.Errorf("NodesWithState (-want +got):\n%s", diff)
	}
}

func kv(t *testing.T, obj api.Object, rev int64) datastore.KV {
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

// TestResyncReportsDifferences: a re-list after compaction replaces the
// view and reports exactly what differs from what it held.
func TestResyncReportsDifferences(t *testing.T) {
	src := make(syncertest.Script)
	node := func(n string) *api.Node {
		o := &api.Node{Metadata: api.ObjectMeta{Name: n}}
		o.SetDefaults()
		return o
	}
	go func() {
		src <- datastore.Event{Type: datastore.EventResync, Revision: 10, Snapshot: []datastore.KV{
			kv(t, node("x"), 3), kv(t, node("y"), 4), kv(t, node("keep"), 5),
			{Key: "ipam/handles/h", Value: []byte("{}"), ModRevision: 6}, // not part of the view
		}}
	}()
	v := start(t, src)
	sub := syncer.Watch[api.Node](v, "all", nil)
	<-sub.C()
	sub.Take()
	src <- datastore.Event{Type: datastore.EventResync, Revision: 20, Snapshot: []datastore.KV{
		kv(t, node("y"), 15), kv(t, node("keep"), 5), kv(t, node("z"), 16),
		{Key: "resources/nodes/broken", Value: []byte("{"), ModRevision: 17},
	}}
	testkit.Eventually(t, 10*time.Second, "the second resync", testkit.Cond(func() bool { return v.Revision() == 20 }))
	ups, _ := sub.Take()
	got := map[string]string{}
	for _, u := range ups {
		switch {
		case u.Old == nil:
			got[u.Key] = "create"
		case u.New == nil:
			got[u.Key] = "delete"
		default:
			got[u.Key] = "modify"
		}
	}
	want := map[string]string{"resources/nodes/x": "delete", "resources/nodes/y": "modify", "resources/nodes/z": "create"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("updates of the resync (-want +got):\n%s", diff)
	}
	if !v.NodeRecordExists("broken") {
		t.Error("a node whose record does not decode must still count as existing")
	}
	if _, ok := v.Node("broken"); ok {
		t.Error("a record that does not decode is in the view")
	}
}

// endedSource is a watch that ends at once, as a closed store's does.
type endedSource struct{}

func (endedSource) WatchKeysFunc(context.Context, datastore.WatchSpec, int64, func([]datastore.Event)) {
}

// TestRunReportsAnEndedWatch: a view whose watch ends while it should run
// says so instead of returning nil.
func TestRunReportsAnEndedWatch(t *testing.T) {
	if err := syncer.New(endedSource{}, nil).Run(t.Context()); !errors.Is(err, syncer.ErrWatchEnded) {
		t.Errorf("Run = %v, want %v", err, syncer.ErrWatchEnded)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := syncer.New(endedSource{}, nil).Run(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Run after ctx ended = %v, want %v", err, context.Canceled)
	}
}

// The view holds the cluster's BGP mesh key, wakes its subscribers when it
// is rotated, and forgets it when it is deleted or stops decoding.
func TestViewBGPMeshKey(t *testing.T) {
	st := storetest.New(t)
	ctx := context.Background()
	k, _, err := st.EnsureBGPMeshKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	v := start(t, st)
	sig := v.Notify("test", syncer.On[datastore.BGPMeshKey](nil))
	if got := v.BGPMeshKey(); got != k.Key {
		t.Fatalf("BGPMeshKey() = %q, want %q", got, k.Key)
	}
	<-sig.C() // kicked once at subscription
	rotated, err := st.SetBGPMeshKey(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	<-sig.C()
	testkit.Eventually(t, 10*time.Second, "the rotated key in the view", testkit.Cond(func() bool { return v.BGPMeshKey() == rotated.Key }))
	if _, err := st.PutKV(ctx, datastore.BGPMeshKeyKey, []byte("{"), 0); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "an undecodable key dropped", testkit.Cond(func() bool { return v.BGPMeshKey() == "" }))
}
