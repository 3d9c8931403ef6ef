package e2e

import (
	"context"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
)

// TestEtcdProxy: agents that know etcd only through the etcd project's gRPC
// proxy (`tabby-lab up --etcd-proxy`) register, assign addresses and wire
// pods that reach each other, also a pod added after they started.
func TestEtcdProxy(t *testing.T) {
	l := upLab(t, lab.Options{Name: "shpx", Nodes: 2, PodsPerNode: 1, EtcdProxy: true})
	st := l.State()
	if st.EtcdProxy == nil || !st.EtcdProxy.Alive() {
		t.Fatal("the lab has no running etcd proxy")
	}
	for _, n := range st.Nodes {
		i := slices.Index(n.Agent.Argv, "--etcd-endpoints")
		if i < 0 || n.Agent.Argv[i+1] != st.EtcdProxyURL() {
			t.Fatalf("agent of %s does not use the proxy %s: %q", n.Name, st.EtcdProxyURL(), n.Agent.Argv)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := l.AddPod(ctx, "node2", "late", lab.PodOptions{}); err != nil {
		t.Fatal(err)
	}
	pingMatrix(t, l)
	g, err := l.EtcdGauges(ctx, "etcd_debugging_mvcc_watcher_total", "etcd_debugging_mvcc_watch_stream_total")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("etcd behind the proxy: %v", g)
}

// TestRelay: agents whose views watch through a watch relay (`tabby-lab up
// --relay`) wire pods that reach each other, also a pod added after they
// started: its ADD waits for its own endpoint in the view, which a
// progress request gets through the relay's window at once.
func TestRelay(t *testing.T) {
	l := upLab(t, lab.Options{Name: "shrl", Nodes: 2, PodsPerNode: 1, Relay: true})
	st := l.State()
	if st.Relay == nil || !st.Relay.Alive() {
		t.Fatal("the lab has no running relay")
	}
	for _, n := range st.Nodes {
		i := slices.Index(n.Agent.Argv, "--watch-endpoints")
		if i < 0 || n.Agent.Argv[i+1] != st.RelayURL() {
			t.Fatalf("agent of %s does not watch through the relay %s: %q", n.Name, st.RelayURL(), n.Agent.Argv)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := l.AddPod(ctx, "node2", "late", lab.PodOptions{}); err != nil {
		t.Fatal(err)
	}
	pingMatrix(t, l)
}

// TestSimHarness is a short representative run of the scale harness
// (`tabby-lab sim`, `make scale-sweep` for the sweep): 10 simulated nodes
// with real reflector sessions and etcd records next to real agents whose
// views watch through a relay; every figure is measured and the table and
// plot are written.
func TestSimHarness(t *testing.T) {
	testkit.RequirePrivileged(t, "ip", "nsenter", "nft")
	const name = "shsim"
	_ = lab.Teardown(context.Background(), runDir, name, io.Discard)
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rs, err := lab.Sim(ctx, lab.SimOptions{Name: name, RunDir: runDir, BinDir: os.Getenv("TABBY_BIN"), Sizes: []int{10},
		Policies: 100, Samples: 3, IdleWindow: 3 * time.Second, ChurnEvents: 40, Watch: true, Relay: true, RelayWindow: 400 * time.Millisecond,
		Out: out, Log: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 {
		t.Fatalf("%d results, want 1", len(rs))
	}
	r := rs[0]
	t.Logf("\n%s", lab.SimTable(rs))
	var problems []string
	check := func(ok bool, what string) {
		if !ok {
			problems = append(problems, what)
		}
	}
	check(r.Nodes == 10 && r.Endpoints == 300, "sizes")
	check(r.Events > 0 && r.ChurnSeconds > 0, "no churn event completed")
	check(r.AgentRSSMiB > 0 && r.RRRSSMiB > 0, "no RSS")
	check(r.RouteP50Ms > 0 && r.RouteP99Ms >= r.RouteP50Ms, "block-to-route latencies")
	check(r.PolicyP50Ms > 0 && r.PolicyP99Ms >= r.PolicyP50Ms, "policy latencies")
	// Through the relay, changes made alone are timed too, and the window
	// is the one asked for.
	check(r.Relay && r.RelayWindowMs == 400, "relay window")
	check(r.PolicyLoneP50Ms > 0 && r.PolicyLoneP99Ms >= r.PolicyLoneP50Ms, "policy latencies of changes alone")
	// A change alone does not wait out the window (the relay sends it at once).
	check(r.PolicyLoneP50Ms < r.RelayWindowMs, "changes alone wait for the relay's window")
	check(r.ReadyS > 0, "restart to Ready")
	// The block samples began with every simulated session holding every
	// simulated block (the sessions' own count of what the reflectors sent).
	check(r.Stages != nil && r.Stages.MissingAtSamples == 0, "blocks missing at the samples")
	// The bare watcher ran beside the agents through the windows.
	check(r.FloorMeasured, "the bare watcher (floor) not measured")
	// Every simulated node and every agent holds a watch.
	check(r.EtcdWatchers >= 10+4, "etcd watchers")
	// The rests are rests: no simulated session dropped in them.
	check(r.SessionDrops["rest"]+r.SessionDrops["rest2"] == 0, "simulated sessions dropped at rest")
	if len(problems) > 0 {
		t.Errorf("implausible results %+v: %s", r, strings.Join(problems, "; "))
	}
	f, err := os.Open(filepath.Join(out, "scale.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Errorf("scale.png: %v", err)
	}
}
