package agent

import (
	"errors"
	"path/filepath"
	"strconv"
	"testing"
	"time"

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
	cfg.NodeIP = "198.18.0.11/24"
	cfg.Etcd = datastore.Config{Endpoints: etcd.Endpoints()}
	cfg.CNISocket = filepath.Join(dir, "cni.sock")
	cfg.StatusSocket = ""
	cfg.HTTPListen = ""
	cfg.DefaultPoolCIDR = "10.244.0.0/16"
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
		t.Fatal("the agent kept running after its view stopped")
	}
}
