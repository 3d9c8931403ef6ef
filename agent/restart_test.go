package agent

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/internal/testkit"
)

// TestRestartKeepsLocalRoutes: an agent restarted over the kernel its
// earlier run programmed (pods' host routes, their block's blackhole)
// deletes none of those routes, whichever of its owners applies the route
// table first. A route deleted and re-added a pass later drops the packets
// in flight to the pod: TestPrivilegedDaemonSet lost 1–2 pings per pair
// through the restarting node that way, when the BGP owner's first pass
// (its Service class) applied the table before the route owner's. Which
// owner goes first is the scheduler's choice, so the agent restarts
// several times.
func TestRestartKeepsLocalRoutes(t *testing.T) {
	etcd := storetest.Etcd(t)
	routes := fake.NewRoutes() // the node's kernel, across the restarts
	workloads := fake.NewWorkloads(routes)
	start := func() (*Agent, func()) {
		t.Helper()
		a := newFakeAgentOn(t, etcd.Endpoints(), "node1", "198.18.0.11/24", quietLog(),
			Deps{Workloads: workloads, Routes: routes, Speaker: newFakeSpeaker()})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		stop := func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("agent: %v", err)
			}
		}
		select {
		case <-a.wired:
		case err := <-done:
			t.Fatalf("agent stopped: %v", err)
		case <-time.After(20 * time.Second):
			stop()
			t.Fatal("agent never came up")
		}
		return a, stop
	}
	// Both owners that write local route classes have passed once.
	passed := func(a *Agent) error {
		if _, _, ok := a.routes.stats(); !ok {
			return errNotYet("route owner")
		}
		a.bgp.mu.Lock()
		defer a.bgp.mu.Unlock()
		if a.bgp.lastPass.IsZero() {
			return errNotYet("BGP owner")
		}
		return nil
	}

	a, stop := start()
	for _, id := range []string{"c1", "c2", "c3"} {
		req, conf, args := addReq(id)
		if _, err := a.handler.Add(context.Background(), req, conf, args); err != nil {
			stop()
			t.Fatalf("ADD %s: %v", id, err)
		}
	}
	testkit.Eventually(t, 10*time.Second, "the first run's routes", func() error { return passed(a) })
	stop()
	local := slices.DeleteFunc(routes.Lines(), func(l string) bool { return !strings.HasSuffix(l, "proto 80") })
	if len(local) != 4 {
		t.Fatalf("the first run programmed %q, want 3 pod routes and a blackhole", local)
	}

	for i := range 15 {
		routes.ResetOps()
		a, stop := start()
		testkit.Eventually(t, 10*time.Second, "the owners' first passes", func() error { return passed(a) })
		stop()
		if ops := slices.DeleteFunc(routes.Ops(), func(op string) bool { return !strings.HasPrefix(op, "delete ") }); len(ops) > 0 {
			t.Fatalf("restart %d deleted routes it still wanted: %q", i+1, ops)
		}
		now := slices.DeleteFunc(routes.Lines(), func(l string) bool { return !strings.HasSuffix(l, "proto 80") })
		if !slices.Equal(now, local) {
			t.Fatalf("after restart %d the local routes are %q, want %q", i+1, now, local)
		}
	}
}

type errNotYet string

func (e errNotYet) Error() string { return string(e) + " has not passed yet" }
