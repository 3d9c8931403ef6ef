package agent

import (
	"fmt"
	"os"
	"runtime"
	rtmetrics "runtime/metrics"
	"testing"
	"time"

	"github.com/tabbynet/tabby/internal/testkit"
)

// BenchmarkAgentAtRest is what a whole agent costs when nothing changes
// (issue 29 part 5, "idle flat in N"): the agent of
// BenchmarkAgentRemotePodEvents (node0 on fake kernel, BGP and firewall,
// a child etcd holding TABBY_BENCH_NODES nodes of 30 endpoints, default
// 1,000, and 1,000 policies) with the default resync interval, once its
// start has settled, for TABBY_BENCH_REST (default 90 s) in which nothing
// is written. Reported: cpu-% (this process's user + system CPU per second
// of wall time, in % of one core), GC/min (collections), alloc-KB/s (heap
// allocated), live-MB (the heap the last collection found live) and each loop's
// pass time, ms/min. TABBY_BENCH_CPUPROFILE writes a CPU profile of the
// rest; TABBY_BENCH_ALLOCPROFILE writes the heap profile at the rest's end
// and, with the suffix .base, at its start (go tool pprof -sample_index
// alloc_space -base FILE.base FILE: what the rest allocated). Run it
// once: -benchtime=1x.
func BenchmarkAgentAtRest(b *testing.B) {
	nodes := envInt(b, "TABBY_BENCH_NODES", scaleNodes)
	rest := 90 * time.Second
	if s := os.Getenv("TABBY_BENCH_REST"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatal(err)
		}
		rest = d
	}
	a, _ := startBenchAgent(b, nodes, Default().ResyncInterval)
	// The start's garbage collected and its pages returned, as in a long
	// running agent.
	runtime.GC()
	allocProfile := os.Getenv("TABBY_BENCH_ALLOCPROFILE")
	if allocProfile != "" {
		restHeapProfile(b, allocProfile+".base")
	}
	stopProfile := churnProfile(b)
	passes0 := loopPassTime(b, a)
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	b.ResetTimer()
	start, cpu0 := time.Now(), processCPU()
	for range b.N {
		time.Sleep(rest)
	}
	cpu, wall := processCPU()-cpu0, time.Since(start)
	b.StopTimer()
	runtime.ReadMemStats(&m1)
	stopProfile()
	if allocProfile != "" {
		restHeapProfile(b, allocProfile)
	}
	b.ReportMetric(100*float64(cpu)/float64(wall), "cpu-%")
	b.ReportMetric(float64(m1.NumGC-m0.NumGC)/wall.Minutes(), "GC/min")
	b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/1024/wall.Seconds(), "alloc-KB/s")
	live := []rtmetrics.Sample{{Name: "/gc/heap/live:bytes"}}
	rtmetrics.Read(live)
	b.ReportMetric(float64(live[0].Value.Uint64())/1e6, "live-MB")
	for name, d := range loopPassTime(b, a) {
		b.ReportMetric((d-passes0[name])*1000/wall.Minutes(), name+"-ms/min")
	}
	b.ReportMetric(0, "ns/op")
}

// loopPassTime is each loop's reconcile time so far, in seconds.
func loopPassTime(b *testing.B, a *Agent) map[string]float64 {
	fams, err := a.metrics.reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "tabby_reconcile_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "loop" {
					out[l.GetValue()] += m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return out
}

// restHeapProfile writes the heap profile, its in-use figures as of now.
func restHeapProfile(b *testing.B, name string) {
	runtime.GC()
	if err := testkit.WriteHeapProfile(name); err != nil {
		b.Fatal(err)
	}
}

func envInt(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		b.Fatalf("%s=%q: %v", name, s, err)
	}
	return n
}

// BenchmarkAgentPeriodicPass is one periodic (resync) pass of each owner of
// the agent of BenchmarkAgentAtRest, at rest: what the agent does every
// resync interval when nothing changed. Each sub-benchmark calls the
// loop's periodic pass (its full pass, else its pass) back to back;
// "status" is one tick of the status loop (every 2 s). cpu-µs/op is the
// process's CPU per pass (the agent's own idle CPU included), which a
// loaded host does not inflate as it does the wall time of ns/op.
func BenchmarkAgentPeriodicPass(b *testing.B) {
	a, _ := startBenchAgent(b, envInt(b, "TABBY_BENCH_NODES", scaleNodes), time.Hour)
	every := time.Hour
	loops := []loop{a.routes.loop(every, a.metrics), a.bgp.loop(every), a.gc.loop(every, a.metrics), a.policy.loop(every, a.metrics)}
	for _, l := range loops {
		periodic := l.pass
		if l.full != nil {
			periodic = l.full
		}
		b.Run(l.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				if err := periodic(b.Context()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
	b.Run("status", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := marshalStatus(a.Status()); err != nil {
				b.Fatal(err)
			}
		}
	})
}
