package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/agent/routetable"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/syncer"
	"github.com/tabbynet/tabby/syncer/syncertest"
)

// startView runs a view over src until the test ends and waits for its
// first sync.
func startView(t testing.TB, src syncer.Source) *syncer.Syncer {
	t.Helper()
	return syncertest.Start(t, src, testLogger(), true)
}

// mustRev returns a stored object's revision.
func mustRev(t testing.TB, obj api.Object) int64 {
	t.Helper()
	rev, err := strconv.ParseInt(obj.GetMeta().ResourceVersion, 10, 64)
	if err != nil {
		t.Fatalf("resourceVersion %q: %v", obj.GetMeta().ResourceVersion, err)
	}
	return rev
}

// TestAgentReturnsTheViewsError: the cluster view runs in the agent's
// errgroup. When its watch ends under a running agent (here: the store
// is closed), the agent stops and returns the view's error.
func TestAgentReturnsTheViewsError(t *testing.T) {
	etcd := storetest.Etcd(t)
	dir := t.TempDir()
	cfg := Default()
	cfg.NodeName = "node1"
	cfg.NodeIP = netip.MustParsePrefix("198.18.0.11/24")
	cfg.Etcd = datastore.Config{Endpoints: etcd.Endpoints()}
	cfg.CNISocket = filepath.Join(dir, "cni.sock")
	cfg.StatusSocket = ""
	cfg.HTTPListen = netip.AddrPort{}
	cfg.DefaultPoolCIDR = netip.MustParsePrefix("10.244.0.0/16")
	routes := fake.NewRoutes()
	a := New(cfg, testLogger(), Deps{Workloads: fake.NewWorkloads(routes), Routes: routes, Speaker: newFakeSpeaker()})
	done := make(chan error, 1)
	go func() { done <- a.Run(t.Context()) }()
	select {
	case <-a.wired:
	case err := <-done:
		t.Fatalf("agent stopped: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("agent never came up")
	}
	if err := a.store.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, syncer.ErrWatchEnded) {
			t.Errorf("agent returned %v, want the view's %v", err, syncer.ErrWatchEnded)
		}
	case <-time.After(20 * time.Second):
		// Which of the agent's loops did not end: their stacks.
		var stacks strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
		t.Fatalf("the agent kept running after its view stopped; goroutines:\n%s", stacks.String())
	}
}

// TestOwnersPinNothing: the agent's owners only recompute from the view,
// so however many updates they are woken for, the view keeps none of them
// (each kept up to 4,096 old and new objects when it held an untyped
// subscription it never took from). 10,000 writes over 50 live endpoints,
// four fifths of them this node's.
func TestOwnersPinNothing(t *testing.T) {
	const live, updates = 50, 10_000
	src := make(syncertest.Script)
	v := syncertest.Start(t, src, quietLog(), false)
	routes := fake.NewRoutes()
	table := routetable.New(routes, 0)
	ro := newRouteOwner("node1", v, table, quietLog())
	bo := newBGPOwner("node1", netip.MustParsePrefix("198.18.0.11/24"), v, table, newFakeSpeaker(), nil, 0, nil, quietLog())
	po := newPolicyOwner("node1", v, &fake.Firewall{}, quietLog())
	gc := newNodeGC(v, nil, nil, time.Hour, quietLog())
	src <- datastore.Event{Type: datastore.EventResync, Revision: 1}

	var kvs []datastore.KV
	for i := range live {
		node := "node1"
		if i%5 == 4 {
			node = "node2"
		}
		w := testWEP(node, "default", fmt.Sprintf("web-%d", i), fmt.Sprintf("cali%011x", i), fmt.Sprintf("10.244.0.%d", i+1), nil)
		key, err := datastore.ResourceKey(api.KindWorkloadEndpoint, w.Metadata.Namespace, w.Metadata.Name)
		if err != nil {
			t.Fatal(err)
		}
		val, err := json.Marshal(w)
		if err != nil {
			t.Fatal(err)
		}
		kvs = append(kvs, datastore.KV{Key: key, Value: val})
	}
	rev := int64(1)
	for i := range updates {
		rev++
		kv := kvs[i%live]
		kv.ModRevision = rev
		src <- datastore.Event{Type: datastore.EventPut, KV: kv, Revision: rev}
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := v.WaitRevision(ctx, rev); err != nil {
		t.Fatal(err)
	}
	if got, want := ro.sub.Matched(), int64(updates*4/5); got != want {
		t.Errorf("the route owner was offered %d updates, want %d", got, want)
	}
	if got, want := po.sub.Matched(), int64(updates*4/5); got != want {
		t.Errorf("the policy owner was offered %d updates, want %d (no policy: only its node's)", got, want)
	}
	if got := bo.sub.Matched() + gc.sub.Matched(); got != 0 {
		t.Errorf("BGP and node GC were offered %d endpoint updates, want 0", got)
	}
	if n := v.Retained(); n != 0 {
		t.Errorf("the view holds %d updates for the owners, want 0", n)
	}
}
