package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
)

// agentBenchEtcdEnv makes the test binary the child etcd of
// BenchmarkAgentRemotePodEvents (storetest.ServeChild).
const agentBenchEtcdEnv = "TABBY_AGENT_BENCH_ETCD"

func TestMain(m *testing.M) {
	storetest.ServeChild(agentBenchEtcdEnv, agentBenchCommand)
	os.Exit(m.Run())
}

// BenchmarkAgentRemotePodEvents is what a pod event on another node costs
// a whole agent, from etcd's watch response to every owner deciding: a
// real etcd in a child process holding the cluster of
// BenchmarkPolicyRemotePodAdd (1,000 nodes of 30 endpoints, 1,000
// policies), and this process's whole agent for node0 on fake kernel, BGP
// and firewall (memoFirewall): its etcd client and watch, the view, every
// owner's filter and whatever passes the events cause, the metrics, GC.
// The child deletes and adds again remote endpoints that no set of node0
// takes (as the scale harness's churn: a DEL and an ADD are two events),
// paced at TABBY_BENCH_RATE events a second (default 100; the harness
// runs 17). cpu-µs/event is this process's CPU (user + system) over the
// churn less its rate at rest (the mean of 3 s before and 3 s after; the owners' periodic passes are
// off) times the
// churn's length, per event; passes/event the owners' passes the events
// caused (all loops). Run it with a fixed count: -benchtime=400x.
func BenchmarkAgentRemotePodEvents(b *testing.B) {
	// No periodic pass during the measurement: at this size a full pass
	// costs tens of milliseconds, which would fall in the churn or in the
	// rest by chance.
	a, ch := startBenchAgent(b, scaleNodes, time.Hour)
	ctx := b.Context()
	rate := 100
	if s := os.Getenv("TABBY_BENCH_RATE"); s != "" {
		rate, _ = strconv.Atoi(s)
	}
	// The rest's rate (after the start's garbage is collected and its pages
	// returned, which the scavenger would otherwise do during the rest),
	// then the churn, in chunks of at most 50 events.
	debug.FreeOSMemory()
	const rest = 3 * time.Second
	cpu0 := processCPU()
	time.Sleep(rest)
	restCPU := processCPU() - cpu0
	passes0, events0 := loopPasses(b, a), a.view.Stats().Events
	stopProfile := churnProfile(b)
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu1 := time.Now(), processCPU()
	for n := 0; n < b.N; {
		k := min(50, b.N-n)
		if err := a.view.WaitRevision(ctx, ch.Do(b, fmt.Sprintf("churn %d %d", k, rate))); err != nil {
			b.Fatal(err)
		}
		n += k
	}
	// The owners' reactions to the last events (their coalescing window).
	time.Sleep(20 * coalesceWindow)
	cpu, wall := processCPU()-cpu1, time.Since(start)
	b.StopTimer()
	stopProfile()
	cpu2 := processCPU()
	time.Sleep(rest)
	restRate := float64(restCPU+processCPU()-cpu2) / float64(2*rest)
	net := float64(cpu) - restRate*float64(wall)
	b.ReportMetric(net/float64(time.Microsecond)/float64(b.N), "cpu-µs/event")
	b.ReportMetric(float64(loopPasses(b, a)-passes0)/float64(b.N), "passes/event")
	// Watch events the view took per pod event (progress reports included).
	b.ReportMetric(float64(a.view.Stats().Events-events0)/float64(b.N), "view-events/event")
}

// startBenchAgent starts a child etcd holding the cluster of nodes nodes
// (agentBenchCommand's preload) and node0's whole agent against it on fake
// kernel, BGP and firewall, with the given resync interval, and returns it
// once its start has settled; both stop when the benchmark ends.
func startBenchAgent(b *testing.B, nodes int, resync time.Duration) (*Agent, *storetest.Child) {
	ch := storetest.StartChild(b, agentBenchEtcdEnv)
	ch.Do(b, fmt.Sprintf("preload %d", nodes))
	routes := fake.NewRoutes()
	a := newFakeAgentOn(b, []string{ch.URL}, scaleNode(0), "198.18.4.1/16", quietLog(),
		Deps{Workloads: fake.NewWorkloads(routes), Routes: routes, Speaker: newFakeSpeaker(), Firewall: &memoFirewall{}})
	a.cfg.ResyncInterval = resync
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	select {
	case <-a.wired:
	case err := <-done:
		b.Fatalf("agent stopped: %v", err)
	case <-time.After(60 * time.Second):
		b.Fatal("agent never came up")
	}
	if err := a.view.WaitSynced(ctx); err != nil {
		b.Fatal(err)
	}
	settle(b, a)
	return a, ch
}

// churnProfile writes a CPU profile of the churn alone to the file
// TABBY_BENCH_CPUPROFILE names, or else an execution trace to the one
// TABBY_BENCH_TRACE names, if any; call the function it returns at the
// churn's end.
func churnProfile(b *testing.B) func() {
	start, stop := pprof.StartCPUProfile, pprof.StopCPUProfile
	name := os.Getenv("TABBY_BENCH_CPUPROFILE")
	if name == "" {
		start, stop = trace.Start, trace.Stop
		if name = os.Getenv("TABBY_BENCH_TRACE"); name == "" {
			return func() {}
		}
	}
	f, err := os.Create(name)
	if err != nil {
		b.Fatal(err)
	}
	if err := start(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		stop()
		if err := f.Close(); err != nil {
			b.Error(err)
		}
	}
}

// settle waits until the agent's owners ran no pass for a second (their
// first passes over the preloaded cluster are done).
func settle(b *testing.B, a *Agent) {
	deadline := time.Now().Add(2 * time.Minute)
	last, since := loopPasses(b, a), time.Now()
	for time.Since(since) < time.Second {
		if time.Now().After(deadline) {
			b.Fatal("the agent's owners never settled")
		}
		time.Sleep(100 * time.Millisecond)
		if n := loopPasses(b, a); n != last {
			last, since = n, time.Now()
		}
	}
}

// loopPasses counts the reconcile passes of every loop so far.
func loopPasses(b *testing.B, a *Agent) uint64 {
	fams, err := a.metrics.reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	var n uint64
	for _, f := range fams {
		if f.GetName() != "tabby_reconcile_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			n += m.GetHistogram().GetSampleCount()
		}
	}
	return n
}

// agentBenchCommand is the child's writer: "preload N" writes the cluster
// of N nodes (scaleSnapshot); "churn K R" writes K remote pod events at R
// a second, alternately the creation and the deletion of an endpoint that
// no set of node0 takes (role r-30…r-34), on node after node.
func agentBenchCommand(ctx context.Context, store *datastore.Store, f []string) (int64, error) {
	switch {
	case len(f) == 2 && f[0] == "preload":
		nodes, err := strconv.Atoi(f[1])
		if err != nil {
			return 0, err
		}
		kvs, err := scaleSnapshot(nodes)
		if err != nil {
			return 0, err
		}
		benchNodes = nodes
		// No mesh (the harness's cluster peers through reflectors): a
		// fake speaker with 999 mesh peers would make the agent's status
		// and readiness cost what no such cluster runs.
		off := false
		bc := &api.BGPConfiguration{Metadata: api.ObjectMeta{Name: api.SingletonName}, Spec: api.BGPConfigurationSpec{NodeToNodeMeshEnabled: &off}}
		bc.SetDefaults()
		val, err := json.Marshal(bc)
		if err != nil {
			return 0, err
		}
		key, err := datastore.ResourceKey(api.KindBGPConfiguration, "", bc.Metadata.Name)
		if err != nil {
			return 0, err
		}
		kvs = append(slices.Clip(kvs), datastore.KV{Key: key, Value: val})
		var rev int64
		for len(kvs) > 0 {
			ops := make([]datastore.Op, 0, 100)
			for _, kv := range kvs[:min(100, len(kvs))] {
				ops = append(ops, datastore.Op{Key: kv.Key, Value: kv.Value})
			}
			kvs = kvs[len(ops):]
			if rev, err = store.Txn(ctx, nil, ops); err != nil {
				return 0, err
			}
		}
		return rev, nil
	case len(f) == 3 && f[0] == "churn":
		k, err := strconv.Atoi(f[1])
		if err != nil {
			return 0, err
		}
		rate, err := strconv.Atoi(f[2])
		if err != nil || rate <= 0 {
			return 0, fmt.Errorf("rate %q: want a positive number", f[2])
		}
		return churnRemote(ctx, store, k, time.Second/time.Duration(rate))
	}
	return 0, fmt.Errorf("unknown command %q", f)
}

// The child's churn position: event i of the run is the creation (even) or
// deletion (odd) of endpoint 30+(i/2)%5 of node 1+(i/2)%(benchNodes-1).
var benchNodes, benchEvent int

func churnRemote(ctx context.Context, store *datastore.Store, k int, every time.Duration) (int64, error) {
	var rev int64
	t := time.NewTicker(every)
	defer t.Stop()
	for range k {
		<-t.C
		i := benchEvent / 2
		n, ep := 1+i%(benchNodes-1), scaleEpsPerNode+i%5
		w := scaleWEP(n, ep, map[string]string{"app": fmt.Sprintf("svc-%d", ep%100), "role": fmt.Sprintf("r-%d", ep%50)})
		w.SetDefaults()
		key, err := datastore.ResourceKey(api.KindWorkloadEndpoint, w.Metadata.Namespace, w.Metadata.Name)
		if err != nil {
			return 0, err
		}
		op := datastore.Op{Key: key, Delete: true}
		if benchEvent%2 == 0 {
			if op.Value, err = json.Marshal(w); err != nil {
				return 0, err
			}
			op.Delete = false
		}
		if rev, err = store.Txn(ctx, nil, []datastore.Op{op}); err != nil {
			return 0, err
		}
		benchEvent++
	}
	return rev, nil
}
