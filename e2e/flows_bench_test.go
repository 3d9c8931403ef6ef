package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
)

// flowModes are the agent's --flow-logs settings the benchmark compares;
// off is the reference.
var flowModes = []string{"off", "deny", "all"}

// BenchmarkPrivilegedFlowLogs measures what flow logs cost, in one lab of
// 3 nodes (nftables) where a NetworkPolicy selects every pod and admits
// TCP 5201 only, with the agents of node1 and node3 restarted in each
// mode (off, deny, all) in rotating order, TABBY_BENCH_ROUNDS rounds
// (default 3), medians reported:
//
//   - pod↔pod TCP throughput (one stream, 2 s) and latency (1-byte round
//     trips, p50) from n1p1 to n3p1 (tput-*-MBps, rtt-*-us, ratios x-*);
//
//   - CNI ADD of 5 pods on node1 (add-*-ms);
//
//   - a flood from n1p1 to n3p1, 3,000 denied UDP flows and 300 short
//     allowed TCP connections: the CPU time node3's agent spent from the
//     flood's start to 3 s after its end (flood-cpu-*-ms), its peak RSS
//     (rss-*-MiB, VmHWM: the agent restarted for the mode) and the flows
//     its flow log dropped (drops-*).
//
//     TABBY_BIN=$PWD/bin go test -run '^$' -bench PrivilegedFlowLogs -benchtime 1x -timeout 30m ./e2e/
func BenchmarkPrivilegedFlowLogs(b *testing.B) {
	testkit.RequirePrivileged(b, "ip", "nsenter", "nft")
	rounds := 3
	if s := os.Getenv("TABBY_BENCH_ROUNDS"); s != "" {
		rounds, _ = strconv.Atoi(s)
	}
	l := upBenchVXLANLab(b, lab.Options{Name: "flow-bn", Nodes: 3, PodsPerNode: 1,
		AgentArgs: []string{"--firewall-backend", "nftables"}})
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	tcp := "TCP"
	if _, err := l.Store().Apply(ctx, netpol("default", "bench-in", api.NetworkPolicySpec{PolicyTypes: []api.PolicyType{api.PolicyTypeIngress},
		Ingress: []api.NetworkPolicyIngressRule{{Ports: []api.NetworkPolicyPort{{Protocol: &tcp, Port: &api.IntOrString{IntVal: 5201}}}}}})); err != nil {
		b.Fatal(err)
	}
	srv := startVXLANSink(b, l, "n3p1")
	srvAddr, err := netip.ParseAddr(srv)
	if err != nil {
		b.Fatal(err)
	}
	tput, rtt, addMs := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	cpuMs, rssMiB, drops := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	added := 0
	b.ResetTimer()
	for r := range rounds {
		for i := range flowModes {
			mode := flowModes[(i+r)%len(flowModes)]
			restartWithFlowLogs(ctx, b, l, mode, srv)
			bps, err := vxlanHelper(ctx, l, "n1p1", "tput", srv, "2s")
			if err != nil {
				b.Fatalf("%s throughput: %v", mode, err)
			}
			us, err := vxlanHelper(ctx, l, "n1p1", "rtt", srv, "2000")
			if err != nil {
				b.Fatalf("%s latency: %v", mode, err)
			}
			tput[mode], rtt[mode] = append(tput[mode], bps/1e6), append(rtt[mode], us)
			for range 5 {
				added++
				start := time.Now()
				if _, err := l.AddPod(ctx, "node1", fmt.Sprintf("fb%d", added), lab.PodOptions{}); err != nil {
					b.Fatal(err)
				}
				addMs[mode] = append(addMs[mode], float64(time.Since(start).Microseconds())/1000)
			}
			c, rss, d := floodAndMeasure(ctx, b, l, srvAddr)
			cpuMs[mode], rssMiB[mode], drops[mode] = append(cpuMs[mode], c), append(rssMiB[mode], rss), append(drops[mode], d)
		}
	}
	b.StopTimer()
	for _, m := range flowModes {
		b.ReportMetric(median(tput[m]), "tput-"+m+"-MBps")
		b.ReportMetric(median(rtt[m]), "rtt-"+m+"-us")
		b.ReportMetric(median(addMs[m]), "add-"+m+"-ms")
		b.ReportMetric(median(cpuMs[m]), "flood-cpu-"+m+"-ms")
		b.ReportMetric(median(rssMiB[m]), "rss-"+m+"-MiB")
		b.ReportMetric(median(drops[m]), "drops-"+m)
		if m != "off" {
			b.ReportMetric(median(tput[m])/median(tput["off"]), "x-tput-"+m+"/off")
			b.ReportMetric(median(rtt[m])/median(rtt["off"]), "x-rtt-"+m+"/off")
			b.ReportMetric(median(addMs[m])/median(addMs["off"]), "x-add-"+m+"/off")
		}
	}
	b.Logf("per round: tput MB/s %v; rtt us %v; add ms %v; flood cpu ms %v; rss MiB %v; drops %v", tput, rtt, addMs, cpuMs, rssMiB, drops)
}

// restartWithFlowLogs restarts the agents of node1 and node3 with
// --flow-logs mode and waits until the policy admits the benchmark's
// connections again.
func restartWithFlowLogs(ctx context.Context, b *testing.B, l *lab.Lab, mode, srv string) {
	b.Helper()
	if err := l.Update(func(s *lab.State) error {
		s.AgentArgs = []string{"--firewall-backend", "nftables", "--flow-logs", mode}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	for _, n := range []string{"node1", "node3"} {
		if err := l.StopAgent(ctx, n, syscall.SIGTERM); err != nil {
			b.Fatal(err)
		}
		if err := l.StartAgent(ctx, n); err != nil {
			b.Fatal(err)
		}
	}
	if err := l.WaitEstablished(ctx); err != nil {
		b.Fatal(err)
	}
	testkit.Eventually(b, 60*time.Second, "node3's agent serves in mode "+mode, func() error {
		st, err := l.NodeStatus(ctx, "node3")
		if err != nil {
			return err
		}
		if !st.Ready {
			return fmt.Errorf("not ready")
		}
		_, err = vxlanHelper(ctx, l, "n1p1", "rtt", srv, "10")
		return err
	})
}

// floodAndMeasure sends the flood from n1p1 to dst and returns the CPU
// time (ms) node3's agent spent from its start to 3 s after its end, the
// agent's peak RSS (MiB) and the flows its flow log dropped.
func floodAndMeasure(ctx context.Context, b *testing.B, l *lab.Lab, dst netip.Addr) (cpuMs, rssMiB, drops float64) {
	b.Helper()
	pid := l.State().Node("node3").Agent.PID
	before, err := lab.ReadProcUsage(pid)
	if err != nil {
		b.Fatal(err)
	}
	if err := ns.WithNetNSPath(netnsPath(b, l, "n1p1"), func(ns.NetNS) error {
		for range 3000 {
			c, err := net.Dial("udp", netip.AddrPortFrom(dst, 9).String())
			if err != nil {
				return err
			}
			_, _ = c.Write([]byte("x"))
			c.Close()
		}
		for range 300 {
			c, err := net.DialTimeout("tcp", netip.AddrPortFrom(dst, 5201).String(), 2*time.Second)
			if err == nil {
				c.Close()
			}
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	time.Sleep(3 * time.Second) // the agent's share of the flood ends after it
	after, err := lab.ReadProcUsage(pid)
	if err != nil {
		b.Fatal(err)
	}
	cpuMs, rssMiB = (after.CPUSeconds-before.CPUSeconds)*1000, after.HWMMiB
	code, body, err := l.AgentGet(ctx, "node3", "/metrics")
	if err != nil || code != 200 {
		b.Fatalf("node3 metrics: %d %v", code, err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "tabby_flowlog_flows_dropped_total "); ok {
			drops, _ = strconv.ParseFloat(v, 64)
		}
	}
	return cpuMs, rssMiB, drops
}
