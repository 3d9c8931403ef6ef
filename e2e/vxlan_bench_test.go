package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
)

// BenchmarkPrivilegedVXLAN measures, in one lab and one run, the paths
// VXLAN adds and what it costs:
//
//   - pod↔pod TCP throughput (one stream, 2 s) and latency (1-byte
//     request/response round trips, p50) between pods on two nodes of one
//     subnet, with the pool's vxlanMode Always (through vxlan.tabby) and
//     Never (native, BGP-routed), and node↔node over the same fabric as the
//     reference — interleaved, TABBY_BENCH_ROUNDS rounds (default 5), the
//     medians reported (tput-*-MBps, rtt-*-us, and the ratios x-*);
//
//   - CNI ADD (the lab's CNI exec: tabby-lab, the tabby plugin, the agent)
//     of pods in the pool with Always against Never, interleaved batches of
//     5 pods (add-*-ms, medians);
//
//   - the time from a new node recording its tunnel on its Node to the
//     last other node having a tunnel route to its block (join-tunnel-ms),
//     and from the start of `node add` (join-total-ms), for 2 joins in a
//     two-subnet lab.
//
//     TABBY_BIN=$PWD/bin go test -run '^$' -bench PrivilegedVXLAN -benchtime 1x -timeout 20m ./e2e/
func BenchmarkPrivilegedVXLAN(b *testing.B) {
	testkit.RequirePrivileged(b, "ip", "nsenter")
	rounds := 5
	if s := os.Getenv("TABBY_BENCH_ROUNDS"); s != "" {
		rounds, _ = strconv.Atoi(s)
	}
	l := upBenchVXLANLab(b, lab.Options{Name: "vxlan-bn", Nodes: 3, PodsPerNode: 1, VXLANMode: api.VXLANModeAlways})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	pods := map[string]string{}
	for _, p := range l.State().Pods {
		pods[p.Node] = p.IPs[0].Addr().String()
	}
	setMode := func(m api.VXLANMode) {
		p, err := datastore.GetAs[*api.IPPool](ctx, l.Store(), api.KindIPPool, "", "default-ipv4-ippool")
		if err != nil {
			b.Fatal(err)
		}
		p.Spec.VXLANMode = m
		if _, err := datastore.UpdateAs(ctx, l.Store(), p); err != nil {
			b.Fatal(err)
		}
		// node1's route to node3's pod: through the tunnel, or not.
		testkit.Eventually(b, 30*time.Second, "node1's route follows the mode", func() error {
			out, err := l.Exec(ctx, "node1", "ip", "route", "get", pods["node3"])
			if err != nil {
				return err
			}
			if through := strings.Contains(string(out), "vxlan.tabby"); through != (m == api.VXLANModeAlways) {
				return fmt.Errorf("mode %s, route %s", m, out)
			}
			return nil
		})
	}
	// node1 and node3 share the first subnet.
	srvPod := startVXLANSink(b, l, "n3p1")
	srvNode := startVXLANSink(b, l, "node3")
	var tput, rtt = map[string][]float64{}, map[string][]float64{}
	measure := func(name, from, to string) {
		bps, err := vxlanHelper(ctx, l, from, "tput", to, "2s")
		if err != nil {
			b.Fatalf("%s throughput: %v", name, err)
		}
		us, err := vxlanHelper(ctx, l, from, "rtt", to, "2000")
		if err != nil {
			b.Fatalf("%s latency: %v", name, err)
		}
		tput[name] = append(tput[name], bps/1e6)
		rtt[name] = append(rtt[name], us)
	}
	var addMs = map[string][]float64{}
	added := 0
	addBatch := func(name string) {
		for range 5 {
			added++
			start := time.Now()
			if _, err := l.AddPod(ctx, "node1", fmt.Sprintf("bn%d", added), lab.PodOptions{}); err != nil {
				b.Fatal(err)
			}
			addMs[name] = append(addMs[name], float64(time.Since(start).Microseconds())/1000)
		}
	}
	b.ResetTimer()
	for r := range rounds {
		order := []api.VXLANMode{api.VXLANModeAlways, api.VXLANModeNever}
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, m := range order {
			setMode(m)
			name := map[api.VXLANMode]string{api.VXLANModeAlways: "vxlan", api.VXLANModeNever: "native"}[m]
			measure(name, "n1p1", srvPod)
			addBatch(name)
		}
		measure("node", "node1", srvNode)
	}
	b.StopTimer()
	for _, name := range []string{"vxlan", "native", "node"} {
		b.ReportMetric(median(tput[name]), "tput-"+name+"-MBps")
		b.ReportMetric(median(rtt[name]), "rtt-"+name+"-us")
	}
	b.ReportMetric(median(tput["vxlan"])/median(tput["native"]), "x-tput-vxlan/native")
	b.ReportMetric(median(tput["vxlan"])/median(tput["node"]), "x-tput-vxlan/node")
	b.ReportMetric(median(rtt["vxlan"])/median(rtt["native"]), "x-rtt-vxlan/native")
	b.ReportMetric(median(addMs["vxlan"]), "add-vxlan-ms")
	b.ReportMetric(median(addMs["native"]), "add-native-ms")
	b.ReportMetric(median(addMs["vxlan"])/median(addMs["native"]), "x-add-vxlan/native")
	b.Logf("per round: tput MB/s vxlan %v native %v node %v; rtt us vxlan %v native %v node %v; add ms vxlan %v native %v",
		tput["vxlan"], tput["native"], tput["node"], rtt["vxlan"], rtt["native"], rtt["node"], addMs["vxlan"], addMs["native"])

	joinTunnel, joinTotal := benchJoins(b)
	b.ReportMetric(median(joinTunnel), "join-tunnel-ms")
	b.ReportMetric(median(joinTotal), "join-total-ms")
	b.Logf("joins: tunnel ms %v, total ms %v", joinTunnel, joinTotal)
}

// benchJoins adds two nodes to a two-subnet Always lab of two nodes and
// times, for each, from its Node recording a tunnel (and from the start of
// the add) to every other node routing its first block through the tunnel.
func benchJoins(b *testing.B) (tunnelMs, totalMs []float64) {
	l := upBenchVXLANLab(b, lab.Options{Name: "vxlan-bj", Nodes: 2, TwoSubnets: true, VXLANMode: api.VXLANModeAlways})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for i := range 2 {
		name := fmt.Sprintf("join%d", i+1)
		recorded := make(chan time.Time, 1)
		wctx, wcancel := context.WithCancel(ctx)
		go func() { // the first moment the Node shows its tunnel
			for wctx.Err() == nil {
				if n, err := datastore.GetAs[*api.Node](wctx, l.Store(), api.KindNode, "", name); err == nil {
					if _, _, ok := n.VXLANTunnel(false); ok {
						recorded <- time.Now()
						return
					}
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
		start := time.Now()
		if err := l.AddNode(ctx, name); err != nil {
			b.Fatal(err)
		}
		var rec time.Time
		select {
		case rec = <-recorded:
		case <-time.After(60 * time.Second):
			b.Fatalf("%s never recorded its tunnel", name)
		}
		wcancel()
		n, err := datastore.GetAs[*api.Node](ctx, l.Store(), api.KindNode, "", name)
		if err != nil {
			b.Fatal(err)
		}
		tun, _, _ := n.VXLANTunnel(false)
		var done time.Time
		testkit.EventuallyEvery(b, 60*time.Second, 5*time.Millisecond, "every node routes "+name+" through the tunnel", func() error {
			for _, o := range l.State().Nodes {
				if o.Name == name {
					continue
				}
				out, err := l.Exec(ctx, o.Name, "ip", "route", "show", "dev", "vxlan.tabby")
				if err != nil {
					return err
				}
				if !strings.Contains(string(out), "via "+tun.String()+" ") {
					return fmt.Errorf("%s has no route via %s", o.Name, tun)
				}
			}
			done = time.Now()
			return nil
		})
		tunnelMs = append(tunnelMs, float64(done.Sub(rec).Microseconds())/1000)
		totalMs = append(totalMs, float64(done.Sub(start).Microseconds())/1000)
	}
	return tunnelMs, totalMs
}

func upBenchVXLANLab(b *testing.B, o lab.Options) *lab.Lab {
	b.Helper()
	o.RunDir, o.BinDir, o.Log = runDir, os.Getenv("TABBY_BIN"), io.Discard
	_ = lab.Teardown(context.Background(), runDir, o.Name, io.Discard)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l, err := lab.Up(ctx, o)
	if err != nil {
		_ = lab.Teardown(context.Background(), runDir, o.Name, io.Discard)
		b.Fatalf("lab up: %v", err)
	}
	b.Cleanup(func() {
		if err := l.Down(); err != nil {
			b.Errorf("lab down: %v", err)
		}
	})
	return l
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

const vxlanHelperEnv = "TABBY_E2E_VXLAN_HELPER"

// startVXLANSink runs the helper's sink in target's namespace on port
// 5201 until the benchmark ends and returns its address.
func startVXLANSink(b testing.TB, l *lab.Lab, target string) string {
	b.Helper()
	ns, err := l.ResolveNetNS(target)
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command("nsenter", "--net=/run/netns/"+ns, "--", os.Args[0], "-test.run=^TestVXLANHelperProcess$", "--", "sink", "5201")
	cmd.Env = append(os.Environ(), vxlanHelperEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		b.Fatalf("sink in %s: %q %v", target, line, err)
	}
	for _, n := range l.State().Nodes {
		if n.NetNS == ns {
			return n.IP.Addr().String()
		}
	}
	for _, p := range l.State().Pods {
		if p.NetNS == ns {
			return p.IPs[0].Addr().String()
		}
	}
	b.Fatalf("no address for %s", target)
	return ""
}

// vxlanHelper runs the helper's client in from's namespace and returns
// the number it prints.
func vxlanHelper(ctx context.Context, l *lab.Lab, from string, args ...string) (float64, error) {
	ns, err := l.ResolveNetNS(from)
	if err != nil {
		return 0, err
	}
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=/run/netns/" + ns, "--", os.Args[0], "-test.run=^TestVXLANHelperProcess$", "--"}, args...)...)
	cmd.Env = append(os.Environ(), vxlanHelperEnv+"=1")
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("%v: %s", err, out)
	}
	return strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
}

// TestVXLANHelperProcess is the benchmark's traffic helper, run in a lab
// namespace: "sink PORT" serves throughput ('T': read and discard) and
// latency ('L': echo every byte) connections; "echo ADDR BYTES" sends
// BYTES in full-sized segments and prints how many came back within 15 s;
// "hold ADDR DURATION" keeps one connection, a byte echoed every 20 ms, and
// prints the longest wait for an echo in milliseconds (an error if the
// connection broke); "tput ADDR DURATION" prints
// bytes per second written to ADDR:5201; "rtt ADDR N" prints the median of
// N one-byte round trips in microseconds.
func TestVXLANHelperProcess(t *testing.T) {
	if os.Getenv(vxlanHelperEnv) != "1" {
		t.Skip("helper process for BenchmarkPrivilegedVXLAN, not a test")
	}
	args := flagArgs()
	err := fmt.Errorf("bad arguments %q", args)
	switch {
	case len(args) == 2 && args[0] == "sink":
		err = vxlanSink(args[1])
	case len(args) == 3 && args[0] == "tput":
		err = vxlanTput(args[1], args[2])
	case len(args) == 3 && args[0] == "rtt":
		err = vxlanRTT(args[1], args[2])
	case len(args) == 3 && args[0] == "echo":
		err = vxlanEcho(args[1], args[2])
	case len(args) == 3 && args[0] == "hold":
		err = vxlanHold(args[1], args[2])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "vxlan helper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func vxlanSink(port string) error {
	ln, err := net.Listen("tcp", ":"+port)
	if err != nil {
		return err
	}
	fmt.Println("ready")
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			kind := make([]byte, 1)
			if _, err := io.ReadFull(c, kind); err != nil {
				return
			}
			if kind[0] == 'T' {
				_, _ = io.Copy(io.Discard, c)
				return
			}
			_, _ = io.Copy(c, c)
		}()
	}
}

func vxlanTput(addr, dur string) error {
	d, err := time.ParseDuration(dur)
	if err != nil {
		return err
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort(addr, "5201"), 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write([]byte{'T'}); err != nil {
		return err
	}
	buf := make([]byte, 128<<10)
	start := time.Now()
	n := 0
	for time.Since(start) < d {
		w, err := c.Write(buf)
		n += w
		if err != nil {
			return err
		}
	}
	fmt.Println(float64(n) / time.Since(start).Seconds())
	return nil
}

func vxlanRTT(addr, count string) error {
	n, err := strconv.Atoi(count)
	if err != nil {
		return err
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort(addr, "5201"), 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if _, err := c.Write([]byte{'L'}); err != nil {
		return err
	}
	one := make([]byte, 1)
	rtts := make([]float64, 0, n)
	for range n {
		start := time.Now()
		if _, err := c.Write(one); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, one); err != nil {
			return err
		}
		rtts = append(rtts, float64(time.Since(start).Nanoseconds())/1e3)
	}
	fmt.Println(median(rtts))
	return nil
}

func vxlanEcho(addr, count string) error {
	n, err := strconv.Atoi(count)
	if err != nil {
		return err
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort(addr, "5201"), 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := c.Write([]byte{'L'}); err != nil {
		return err
	}
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, n))
		werr <- err
	}()
	got, err := io.ReadFull(c, make([]byte, n))
	if err != nil {
		return fmt.Errorf("%d of %d bytes came back: %w", got, n, err)
	}
	if err := <-werr; err != nil {
		return err
	}
	fmt.Println(got)
	return nil
}

func vxlanHold(addr, dur string) error {
	d, err := time.ParseDuration(dur)
	if err != nil {
		return err
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort(addr, "5201"), 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if _, err := c.Write([]byte{'L'}); err != nil {
		return err
	}
	one := make([]byte, 1)
	var longest time.Duration
	for start := time.Now(); time.Since(start) < d; time.Sleep(20 * time.Millisecond) {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		t0 := time.Now()
		if _, err := c.Write(one); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, one); err != nil {
			return fmt.Errorf("after %v: %w", time.Since(start).Round(time.Millisecond), err)
		}
		longest = max(longest, time.Since(t0))
	}
	fmt.Println(float64(longest.Microseconds()) / 1000)
	return nil
}
