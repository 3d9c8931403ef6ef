package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
)

// newFakeAgent makes a whole agent on fake kernel and BGP, against etcd at
// endpoints, logging to log.
func newFakeAgent(t *testing.T, endpoints []string, node, ip string, log *slog.Logger) *Agent {
	t.Helper()
	routes := fake.NewRoutes()
	return newFakeAgentOn(t, endpoints, node, ip, log, Deps{Workloads: fake.NewWorkloads(routes), Routes: routes, Speaker: newFakeSpeaker()})
}

// newFakeAgentOn makes a whole agent on deps (a fake kernel an earlier
// agent programmed, say), against etcd at endpoints, logging to log.
func newFakeAgentOn(t testing.TB, endpoints []string, node, ip string, log *slog.Logger, deps Deps) *Agent {
	t.Helper()
	dir := t.TempDir()
	cfg := Default()
	cfg.NodeName = node
	cfg.NodeIP = netip.MustParsePrefix(ip)
	cfg.Etcd = datastore.Config{Endpoints: endpoints}
	cfg.CNISocket = filepath.Join(dir, "cni.sock")
	cfg.StatusSocket = ""
	cfg.HTTPListen = netip.AddrPort{}
	cfg.DefaultPoolCIDR = netip.MustParsePrefix("10.244.0.0/16")
	return New(cfg, log, deps)
}

// startFakeAgent runs a whole agent on fake kernel and BGP, against etcd at
// endpoints, until the test ends.
func startFakeAgent(t *testing.T, endpoints []string, node, ip string) *Agent {
	t.Helper()
	return runAgent(t, newFakeAgent(t, endpoints, node, ip, testLogger()))
}

// runAgent runs a until the test ends (an error then fails it) and returns
// it once it is wired.
func runAgent(t *testing.T, a *Agent) *Agent {
	t.Helper()
	node := a.cfg.NodeName
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent %s: %v", node, err)
		}
	})
	select {
	case <-a.wired:
		return a
	case err := <-done:
		t.Fatalf("agent %s stopped: %v", node, err)
	case <-time.After(20 * time.Second):
		t.Fatalf("agent %s never came up", node)
	}
	return nil
}

// TestPodAddCostsOtherNodesNothing: a pod added on node1 makes exactly its
// own etcd requests on node1 (no list of anything) and none at all on
// node2, whose owners are not even woken; only its view follows the
// writes.
func TestPodAddCostsOtherNodesNothing(t *testing.T) {
	etcd := storetest.Etcd(t)
	a1 := startFakeAgent(t, etcd.Endpoints(), "node1", "198.18.0.11/24")
	a2 := startFakeAgent(t, etcd.Endpoints(), "node2", "198.18.0.12/24")
	ctx := context.Background()

	added := 0
	add := func(id string) {
		t.Helper()
		req, conf, args := addReq(id)
		if _, err := a1.handler.Add(ctx, req, conf, args); err != nil {
			t.Fatalf("ADD %s: %v", id, err)
		}
		added++
		deadline := time.Now().Add(10 * time.Second)
		// node2's view keeps node1's endpoints compact.
		for len(slices.DeleteFunc(a2.view.RemoteEndpoints(), func(r *api.RemoteEndpoint) bool { return r.Node != "node1" })) < added {
			if time.Now().After(deadline) {
				t.Fatalf("node2's view never showed endpoint %s", id)
			}
			time.Sleep(time.Millisecond)
		}
	}
	// The first pod claims node1's block: that is news for node2's BGP
	// owner only through BGP, not through its view.
	add("first")

	type snap struct {
		r1, r2                  datastore.Requests
		routes2, bgp2, gc2, up2 int64
	}
	take := func() snap {
		return snap{r1: a1.store.Requests(), r2: a2.store.Requests(),
			routes2: a2.routes.sub.Matched(), bgp2: a2.bgp.sub.Matched(), gc2: a2.gc.sub.Matched(), up2: a2.view.Stats().Updates}
	}
	const pods = 10
	before := take()
	for i := range pods {
		add(fmt.Sprintf("pod%d", i))
	}
	after := take()

	if d := after.r2; d != before.r2 {
		t.Errorf("node2 sent etcd requests for node1's pods: %+v → %+v", before.r2, d)
	}
	if after.routes2 != before.routes2 || after.bgp2 != before.bgp2 || after.gc2 != before.gc2 {
		t.Errorf("node2's owners were woken by node1's pods: routes %d, bgp %d, gc %d updates",
			after.routes2-before.routes2, after.bgp2-before.bgp2, after.gc2-before.gc2)
	}
	if got := after.up2 - before.up2; got != pods {
		t.Errorf("node2's view changed %d times for %d endpoints, want one each (blocks unchanged)", got, pods)
	}
	d := datastore.Requests{
		Get: after.r1.Get - before.r1.Get, List: after.r1.List - before.r1.List,
		Txn: after.r1.Txn - before.r1.Txn, Put: after.r1.Put - before.r1.Put,
	}
	t.Logf("node1, per ADD: %.1f gets, %.1f lists, %.1f txns, %.1f puts",
		float64(d.Get)/pods, float64(d.List)/pods, float64(d.Txn)/pods, float64(d.Put)/pods)
	if d.List != 0 {
		t.Errorf("node1 listed %d prefixes for %d ADDs: an ADD must read only its own keys", d.List, pods)
	}
	// IPAM: one transaction (block + handle) with a warm cache; the
	// endpoint: a read and a write. Status publication may add a put.
	if d.Get > 2*pods || d.Txn > 2*pods {
		t.Errorf("node1 made %d gets and %d transactions for %d ADDs, want at most 2 of each per ADD", d.Get, d.Txn, pods)
	}
}
