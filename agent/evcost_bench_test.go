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
	"github.com/tabbynet/tabby/syncer"
)

// agentBenchEtcdEnv makes the test binary the child etcd of
// BenchmarkAgentRemotePodEvents (storetest.ServeChild).
const agentBenchEtcdEnv = "TABBY_AGENT_BENCH_ETCD"

// agentBenchFloorEnv makes the test binary the bare watcher of
// BenchmarkAgentRemotePodEvents (storetest.ServeFloor).
const agentBenchFloorEnv = "TABBY_AGENT_BENCH_FLOOR"

// agentBenchRelayEnv makes the test binary the watch relay of
// BenchmarkAgentRemotePodEvents (storetest.ServeRelay).
const agentBenchRelayEnv = "TABBY_AGENT_BENCH_RELAY"

func TestMain(m *testing.M) {
	storetest.ServeChild(agentBenchEtcdEnv, agentBenchCommand)
	storetest.ServeFloor(agentBenchFloorEnv, syncer.WatchSpec())
	storetest.ServeRelay(agentBenchRelayEnv)
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
//
// The reference, measured in the same run: a bare etcd watcher (the test
// binary again, storetest.StartFloor: datastore.New's client watching the
// view's ranges through etcd's client, counting events) receives the same
// events in a process of its own; floor-cpu-µs/event is its CPU taken the
// same way (its threads' run time, /proc), agent/floor the ratio;
// stream-floor-cpu-µs/event and agent/stream-floor the same of a second
// bare watcher that receives on a gRPC stream of its own in one goroutine
// (datastore.FloorStream), as the view's watch does: what any gRPC watcher
// of these events costs at the least.
// vcsw/event and floor-vcsw/event are the voluntary context switches per
// event (a thread that waits, to be woken again) of each, less the rest's.
//
// TABBY_BENCH_RELAY=WINDOW (a Go duration: 250ms) puts a watch relay
// (datastore/relay, the test binary again: storetest.StartRelay) between
// etcd and the agent's view, batching by WINDOW, and a third floor on a
// stream of its own through it: relay-floor-cpu-µs/event and
// agent/relay-floor. relay-cpu-µs/event/stream is the relay's CPU per
// event divided by the relay-streams it serves: the agent's view and that
// floor's, which holds TABBY_BENCH_RELAY_FLOORS copies of its watch
// (default 1; its figures are per copy), as a relay serving that many
// agents would. Run it interleaved with runs without, for the agent's
// figure both ways.
func BenchmarkAgentRemotePodEvents(b *testing.B) {
	ch, preloaded := startBenchEtcd(b, scaleNodes)
	floor := storetest.StartFloor(b, agentBenchFloorEnv, ch.URL, preloaded+1, datastore.FloorClient)
	floor2 := storetest.StartFloor(b, agentBenchFloorEnv, ch.URL, preloaded+1, datastore.FloorStream)
	floors, pids := []*storetest.Floor{floor, floor2}, []int{floor.PID, floor2.PID}
	var watch []string
	relayFloors := 1
	if s := os.Getenv("TABBY_BENCH_RELAY_FLOORS"); s != "" {
		relayFloors, _ = strconv.Atoi(s)
	}
	if w := os.Getenv("TABBY_BENCH_RELAY"); w != "" {
		window, err := time.ParseDuration(w)
		if err != nil {
			b.Fatalf("TABBY_BENCH_RELAY=%s: %v", w, err)
		}
		rel := storetest.StartRelay(b, agentBenchRelayEnv, ch.URL, window)
		watch = []string{rel.URL}
		floors = append(floors, storetest.StartFloor(b, agentBenchFloorEnv, ch.URL, preloaded+1, datastore.FloorStream, rel.URL, strconv.Itoa(relayFloors)))
		pids = append(pids, floors[2].PID, rel.PID)
	}
	// No periodic pass during the measurement: at this size a full pass
	// costs tens of milliseconds, which would fall in the churn or in the
	// rest by chance.
	a := startBenchAgentOn(b, ch, time.Hour, watch...)
	ctx := b.Context()
	rate := 100
	if s := os.Getenv("TABBY_BENCH_RATE"); s != "" {
		rate, _ = strconv.Atoi(s)
	}
	// The rest's rate (after the start's garbage is collected and its pages
	// returned, which the scavenger would otherwise do during the rest),
	// then the churn, in chunks of at most 50 events.
	debug.FreeOSMemory()
	quiet(b)
	const rest = 3 * time.Second
	s0 := sampleAll(b, pids)
	time.Sleep(rest)
	s1 := sampleAll(b, pids)
	passes0, events0 := loopPasses(b, a), a.view.Stats().Events
	var floorEvents0 []int
	for _, f := range floors {
		floorEvents0 = append(floorEvents0, f.Wait(b, 0)) // the events counted so far
	}
	stopProfile := churnProfile(b)
	b.ReportAllocs()
	b.ResetTimer()
	start, s2 := time.Now(), sampleAll(b, pids)
	var last int64
	for n := 0; n < b.N; {
		k := min(50, b.N-n)
		last = ch.Do(b, fmt.Sprintf("churn %d %d", k, rate))
		if err := a.view.WaitRevision(ctx, last); err != nil {
			b.Fatal(err)
		}
		n += k
	}
	for i, f := range floors {
		if n := f.Wait(b, last) - floorEvents0[i]; n != b.N {
			b.Errorf("floor %d counted %d events, want %d", i, n, b.N)
		}
	}
	// The owners' reactions to the last events (their coalescing window).
	time.Sleep(20 * coalesceWindow)
	s3, wall := sampleAll(b, pids), time.Since(start)
	b.StopTimer()
	stopProfile()
	time.Sleep(rest)
	s4 := sampleAll(b, pids)
	// perEvent is the churn's x less the rests' rate of x over as long,
	// per event.
	perEvent := func(x func(benchSample) float64) float64 {
		restRate := (x(s1) - x(s0) + x(s4) - x(s3)) / float64(2*rest)
		return (x(s3) - x(s2) - restRate*float64(wall)) / float64(b.N)
	}
	// The agent's CPU in each window, to tell a rest that was not one.
	ms := float64(time.Millisecond)
	b.ReportMetric(float64(s1.agentCPU-s0.agentCPU)/ms, "rest1-ms")
	b.ReportMetric(float64(s3.agentCPU-s2.agentCPU)/ms, "churn-ms")
	b.ReportMetric(float64(s4.agentCPU-s3.agentCPU)/ms, "rest2-ms")
	us := float64(time.Microsecond)
	agentUs := perEvent(func(s benchSample) float64 { return float64(s.agentCPU) }) / us
	procUs := func(i int) float64 {
		return perEvent(func(s benchSample) float64 { return float64(s.procs[i].CPU) }) / us
	}
	procVcsw := func(i int) float64 {
		return perEvent(func(s benchSample) float64 { return float64(s.procs[i].Voluntary) })
	}
	floorUs, floor2Us := procUs(0), procUs(1)
	b.ReportMetric(agentUs, "cpu-µs/event")
	b.ReportMetric(floorUs, "floor-cpu-µs/event")
	b.ReportMetric(agentUs/floorUs, "agent/floor")
	b.ReportMetric(floor2Us, "stream-floor-cpu-µs/event")
	b.ReportMetric(agentUs/floor2Us, "agent/stream-floor")
	b.ReportMetric(perEvent(func(s benchSample) float64 { return float64(s.agent.Voluntary) }), "vcsw/event")
	b.ReportMetric(procVcsw(0), "floor-vcsw/event")
	b.ReportMetric(procVcsw(1), "stream-floor-vcsw/event")
	if len(pids) > 2 {
		b.ReportMetric(procUs(2)/float64(relayFloors), "relay-floor-cpu-µs/event")
		b.ReportMetric(agentUs/(procUs(2)/float64(relayFloors)), "agent/relay-floor")
		b.ReportMetric(procVcsw(2)/float64(relayFloors), "relay-floor-vcsw/event")
		b.ReportMetric(procUs(3)/float64(1+relayFloors), "relay-cpu-µs/event/stream") // the agent's view and the relay floor's
		b.ReportMetric(float64(1+relayFloors), "relay-streams")
	}
	b.ReportMetric(float64(loopPasses(b, a)-passes0)/float64(b.N), "passes/event")
	// Watch events the view took per pod event (progress reports included).
	b.ReportMetric(float64(a.view.Stats().Events-events0)/float64(b.N), "view-events/event")
}

// benchSample is what sampleAll read: this process's CPU (getrusage) and
// counters, and the other processes' (the floors', the relay's).
type benchSample struct {
	agentCPU time.Duration
	agent    storetest.ProcCounters
	procs    []storetest.ProcCounters
}

func sampleAll(b *testing.B, pids []int) benchSample {
	s := benchSample{agentCPU: processCPU()}
	var err error
	if s.agent, err = storetest.ProcSample(os.Getpid()); err != nil {
		b.Fatal(err)
	}
	for _, pid := range pids {
		c, err := storetest.ProcSample(pid)
		if err != nil {
			b.Fatal(err)
		}
		s.procs = append(s.procs, c)
	}
	return s
}

// startBenchAgent starts a child etcd holding the cluster of nodes nodes
// (agentBenchCommand's preload) and node0's whole agent against it
// (startBenchAgentOn); both stop when the benchmark ends.
func startBenchAgent(b *testing.B, nodes int, resync time.Duration) (*Agent, *storetest.Child) {
	ch, _ := startBenchEtcd(b, nodes)
	return startBenchAgentOn(b, ch, resync), ch
}

// startBenchEtcd starts a child etcd holding the cluster of nodes nodes
// and returns it with the preload's revision.
func startBenchEtcd(b *testing.B, nodes int) (*storetest.Child, int64) {
	ch := storetest.StartChild(b, agentBenchEtcdEnv)
	return ch, ch.Do(b, fmt.Sprintf("preload %d", nodes))
}

// startBenchAgentOn starts node0's whole agent against ch on fake kernel,
// BGP and firewall, with the given resync interval, and returns it once
// its start has settled; it stops when the benchmark ends. Its view
// watches through the watch relay at watch, if given.
func startBenchAgentOn(b *testing.B, ch *storetest.Child, resync time.Duration, watch ...string) *Agent {
	routes := fake.NewRoutes()
	a := newFakeAgentOn(b, []string{ch.URL}, scaleNode(0), "198.18.4.1/16", quietLog(),
		Deps{Workloads: fake.NewWorkloads(routes), Routes: routes, Speaker: newFakeSpeaker(), Firewall: &memoFirewall{}})
	a.cfg.ResyncInterval = resync
	a.cfg.Etcd.WatchEndpoints = watch
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
	return a
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

// quiet waits until this process used less than 1 % of a core for a
// second: on a loaded host the agent's start (the owners settled) goes on
// in the background long enough to fall into the first rest (378 ms of
// CPU in its 3 s at load 30, against 8 in the second).
func quiet(b *testing.B) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		c := processCPU()
		time.Sleep(time.Second)
		if processCPU()-c < 10*time.Millisecond {
			return
		}
		if time.Now().After(deadline) {
			b.Fatal("the agent never went quiet")
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
