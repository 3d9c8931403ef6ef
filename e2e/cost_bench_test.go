package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
)

// BenchmarkPrivilegedPodAddCost measures what one pod ADD costs the
// cluster, in labs of several sizes (TABBY_BENCH_NODES, default "2,10";
// labs over 30 nodes use 2 route reflectors, the host's neighbour table
// caps a full mesh at about 30). Each iteration adds one pod on node1 with
// the real CNI plugin, the way a runtime does. Reported per size:
//
//	add-p50-ms          the CNI ADD as the runtime sees it
//	cpu-ms/add          all agents' CPU time (utime+stime) during the adds,
//	                    minus their idle CPU over as long, per ADD
//	node1-cpu-ms/add    the part of it on the pod's own node
//	others-cpu-ms/add   the part on every other node together
//	node1-reads/add     etcd reads (get+list) of node1's agent per ADD
//	others-reads/add    etcd reads of all other agents together per ADD
//	idle-cpu-%/agent    one agent's CPU at rest (TABBY_BENCH_IDLE, default
//	                    10s, measured before the adds)
//	rss-MiB/agent       median resident memory of an agent
//
//	TABBY_BIN=$PWD/bin TABBY_BENCH_NODES=2,10,30,80 go test -run '^$' \
//	    -bench PodAddCost -benchtime 20x -timeout 60m ./e2e/
func BenchmarkPrivilegedPodAddCost(b *testing.B) {
	testkit.RequirePrivileged(b, "ip", "nsenter")
	sizes := benchSizes(b, []int{2, 10})
	idle := 10 * time.Second
	if s := os.Getenv("TABBY_BENCH_IDLE"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatalf("TABBY_BENCH_IDLE: %v", err)
		}
		idle = d
	}
	for _, n := range sizes {
		var l *lab.Lab
		seq := 0
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			if l == nil {
				l = upCostLab(b, n)
			}
			runAddCost(b, l, idle, &seq)
		})
		if l != nil {
			if err := l.Down(); err != nil {
				b.Errorf("lab down: %v", err)
			}
		}
	}
}

func upCostLab(b *testing.B, n int) *lab.Lab {
	b.Helper()
	name := fmt.Sprintf("e2ecost%d", n)
	_ = lab.Teardown(context.Background(), runDir, name, io.Discard)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	o := lab.Options{Name: name, Nodes: n, RunDir: runDir, BinDir: os.Getenv("TABBY_BIN")}
	if n > 30 {
		o.RouteReflectors = 2
	}
	start := time.Now()
	l, err := lab.Up(ctx, o)
	if err != nil {
		_ = lab.Teardown(context.Background(), runDir, name, io.Discard)
		b.Fatalf("lab up: %v", err)
	}
	if err := l.WaitEstablished(ctx); err != nil {
		_ = l.Down()
		b.Fatal(err)
	}
	b.Logf("lab %s: %d nodes up in %s", name, n, time.Since(start).Round(time.Second))
	return l
}

// agentCPU returns each agent's CPU time so far, in clock ticks, by node.
func agentCPU(b *testing.B, l *lab.Lab) map[string]int64 {
	b.Helper()
	out := map[string]int64{}
	for _, n := range l.State().Nodes {
		if n.Agent == nil {
			continue
		}
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n.Agent.PID))
		if err != nil {
			b.Fatalf("agent of %s: %v", n.Name, err)
		}
		// Fields after the command name (which may hold spaces): state is
		// field 3, utime 14, stime 15.
		f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		out[n.Name] = u + s
	}
	return out
}

// clockTicks is USER_HZ, 100 on every Linux this runs on.
const clockTicks = 100

func agentRSS(b *testing.B, l *lab.Lab) []float64 {
	b.Helper()
	var out []float64
	for _, n := range l.State().Nodes {
		if n.Agent == nil {
			continue
		}
		f, err := os.Open(fmt.Sprintf("/proc/%d/status", n.Agent.PID))
		if err != nil {
			b.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				out = append(out, kb/1024)
			}
		}
		f.Close()
	}
	return out
}

// agentReads returns each agent's etcd reads (get + list) so far.
func agentReads(b *testing.B, l *lab.Lab) map[string]float64 {
	b.Helper()
	out := map[string]float64{}
	for _, n := range l.State().Nodes {
		_, body, err := l.AgentGet(context.Background(), n.Name, "/metrics")
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, `tabby_datastore_requests_total{op="get"}`) || strings.HasPrefix(line, `tabby_datastore_requests_total{op="list"}`) {
				f := strings.Fields(line)
				v, _ := strconv.ParseFloat(f[len(f)-1], 64)
				out[n.Name] += v
			}
		}
	}
	return out
}

func runAddCost(b *testing.B, l *lab.Lab, idle time.Duration, seq *int) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	origin := l.State().Nodes[0].Name
	nodes := len(l.State().Nodes)

	// Idle: the agents at rest, as long as asked.
	c0 := agentCPU(b, l)
	t0 := time.Now()
	time.Sleep(idle)
	c1 := agentCPU(b, l)
	idleSecs := time.Since(t0).Seconds()
	var idleTicks int64
	for n := range c1 {
		idleTicks += c1[n] - c0[n]
	}
	idleRate := float64(idleTicks) / idleSecs // ticks per second, all agents

	r0 := agentReads(b, l)
	c2 := agentCPU(b, l)
	t2 := time.Now()
	var lat []time.Duration
	var names []string
	b.ResetTimer()
	for range b.N {
		*seq++
		name := fmt.Sprintf("cost%d", *seq)
		start := time.Now()
		if _, err := l.AddPod(ctx, origin, name, lab.PodOptions{}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		names = append(names, name)
	}
	b.StopTimer()
	// Let the other nodes' reactions (BGP routes of a new block, views)
	// finish inside the window; they are counted, the idle rate is not.
	time.Sleep(2 * time.Second)
	c3 := agentCPU(b, l)
	window := time.Since(t2).Seconds()
	r1 := agentReads(b, l)

	var all, own float64
	for n := range c3 {
		d := float64(c3[n] - c2[n])
		all += d
		if n == origin {
			own += d
		}
	}
	extra := all - idleRate*window
	ownExtra := own - idleRate/float64(nodes)*window
	tickMS := 1000.0 / clockTicks
	per := float64(b.N)
	b.ReportMetric(ms(testkit.Quantile(lat, 0.5)), "add-p50-ms")
	b.ReportMetric(extra*tickMS/per, "cpu-ms/add")
	b.ReportMetric(ownExtra*tickMS/per, "node1-cpu-ms/add")
	b.ReportMetric((extra-ownExtra)*tickMS/per, "others-cpu-ms/add")
	var otherReads float64
	for n := range r1 {
		if n != origin {
			otherReads += r1[n] - r0[n]
		}
	}
	b.ReportMetric((r1[origin]-r0[origin])/per, "node1-reads/add")
	b.ReportMetric(otherReads/per, "others-reads/add")
	b.ReportMetric(idleRate/float64(nodes)/clockTicks*100, "idle-cpu-%/agent")
	rss := agentRSS(b, l)
	slices.Sort(rss)
	if len(rss) > 0 {
		b.ReportMetric(rss[len(rss)/2], "rss-MiB/agent")
	}
	for _, name := range names {
		if err := l.DelPod(ctx, name); err != nil {
			b.Errorf("removing %s: %v", name, err)
		}
	}
}

// benchSizes returns the lab sizes of a benchmark: TABBY_BENCH_NODES
// ("2,10,30,80") or def.
func benchSizes(b *testing.B, def []int) []int {
	b.Helper()
	s := os.Getenv("TABBY_BENCH_NODES")
	if s == "" {
		return def
	}
	var sizes []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			b.Fatalf("TABBY_BENCH_NODES: %q is not a node count ≥ 2", f)
		}
		sizes = append(sizes, n)
	}
	return sizes
}
