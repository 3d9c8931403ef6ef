package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/lab"
)

// TestMeshCluster runs the mesh scenarios on one 3-node lab, in order: the
// ping matrix and TCP, agent restarts, an etcd outage, a node joining and
// leaving, and pod churn.
func TestMeshCluster(t *testing.T) {
	// A short resync so that the kernel reconcile test does not wait 30 s.
	l := upLab(t, lab.Options{Name: "e2em", Nodes: 3, PodsPerNode: 2, AgentArgs: []string{"--resync-interval", "3s"}})

	t.Run("PingMatrix", func(t *testing.T) { pingMatrix(t, l) })
	t.Run("HealthAndMetrics", func(t *testing.T) { testHealthAndMetrics(t, l) })
	t.Run("KernelReconcile", func(t *testing.T) { testKernelReconcile(t, l) })
	t.Run("TCPBothWays", func(t *testing.T) {
		tcpExchange(t, l, "n1p1", "n3p2") // cross node
		tcpExchange(t, l, "n3p2", "n1p1") // and back
		tcpExchange(t, l, "n2p1", "n2p2") // same node
	})
	t.Run("AgentRestart", func(t *testing.T) { testAgentRestart(t, l) })
	t.Run("EtcdOutage", func(t *testing.T) { testEtcdOutage(t, l) })
	t.Run("NodeJoinLeave", func(t *testing.T) { testNodeJoinLeave(t, l) })
	t.Run("Churn", func(t *testing.T) { testChurn(t, l) })
	t.Run("Tabbyctl", func(t *testing.T) { testTabbyctl(t, l) })
	t.Run("IdentityChange", func(t *testing.T) { testIdentityChange(t, l) })
}

var pingStats = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)

// continuousPing pings from pod to ip every 50 ms until stop is closed and
// returns sent and received counts.
func continuousPing(t *testing.T, l *lab.Lab, pod, ip string) (stop func() (sent, recv int)) {
	t.Helper()
	ns := netnsPath(t, l, pod)
	cmd := exec.Command("nsenter", "--net="+ns, "--", "ping", "-n", "-i", "0.05", "-W", "1", ip)
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return func() (int, int) {
		_ = cmd.Process.Signal(syscall.SIGINT)
		_ = cmd.Wait()
		m := pingStats.FindStringSubmatch(out.String())
		if m == nil {
			t.Fatalf("no ping statistics in %q", out.String())
		}
		s, _ := strconv.Atoi(m[1])
		r, _ := strconv.Atoi(m[2])
		return s, r
	}
}

func testAgentRestart(t *testing.T, l *lab.Lab) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	target := podIP(t, l, "n2p1").String()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		stop := continuousPing(t, l, "n1p1", target)
		time.Sleep(time.Second) // traffic before the restart, so that loss would show
		if err := l.StopAgent(ctx, "node2", sig); err != nil {
			t.Fatalf("stopping node2's agent with %v: %v", sig, err)
		}
		time.Sleep(2 * time.Second) // traffic while the agent is away
		if err := l.StartAgent(ctx, "node2"); err != nil {
			t.Fatalf("starting node2's agent: %v", err)
		}
		if err := l.WaitEstablished(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second) // traffic after the resync
		sent, recv := stop()
		loss := float64(sent-recv) / float64(sent) * 100
		t.Logf("agent restart by %v: %d pings sent, %d received, %.1f%% loss", sig, sent, recv, loss)
		if loss > 2 {
			t.Errorf("agent restart by %v lost %.1f%% of pings (target 0)", sig, loss)
		}
	}
	if err := l.WaitRoutes(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := l.AddPod(ctx, "node2", "n2new", lab.PodOptions{})
	if err != nil {
		t.Fatalf("new pod after restart: %v", err)
	}
	if err := l.Ping(ctx, "n1p1", p.IPs[0].Addr()); err != nil {
		if err := l.Ping(ctx, "n1p1", p.IPs[0].Addr()); err != nil {
			t.Errorf("new pod after restart unreachable: %v", err)
		}
	}
	if err := l.DelPod(ctx, "n2new"); err != nil {
		t.Error(err)
	}
}

func testEtcdOutage(t *testing.T, l *lab.Lab) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	stop := continuousPing(t, l, "n1p2", podIP(t, l, "n3p1").String())
	if err := l.StopEtcd(ctx); err != nil {
		t.Fatal(err)
	}
	etcdUp := false
	defer func() {
		if !etcdUp {
			_ = l.StartEtcd(context.Background())
		}
	}()
	start := time.Now()
	_, err := l.AddPod(ctx, "node1", "n1down", lab.PodOptions{})
	took := time.Since(start)
	if err == nil {
		t.Fatal("ADD succeeded with etcd down")
	}
	t.Logf("ADD with etcd down failed after %s: %v", took.Round(time.Millisecond), err)
	// The lab runs DEL after a failed ADD, as a runtime does; both must
	// fail fast rather than wait out their 30 s deadlines.
	if took > 30*time.Second {
		t.Errorf("ADD (and the DEL after it) with etcd down took %s, want well under the 30 s ADD deadline", took)
	}
	if !strings.Contains(err.Error(), "etcd") && !strings.Contains(err.Error(), "datastore") {
		t.Errorf("ADD error does not say the datastore is the problem: %v", err)
	}
	time.Sleep(3 * time.Second) // existing traffic must go on while etcd is away
	if err := l.StartEtcd(ctx); err != nil {
		t.Fatal(err)
	}
	etcdUp = true
	sent, recv := stop()
	t.Logf("during the etcd outage: %d pings sent, %d received", sent, recv)
	if recv < sent-1 {
		t.Errorf("existing pod traffic lost %d of %d pings during the etcd outage", sent-recv, sent)
	}
	// Everything recovers without a manual step: a new pod works.
	var p *lab.PodState
	testkit.EventuallyEvery(t, 60*time.Second, time.Second, "ADD after etcd returned", func() (err error) {
		p, err = l.AddPod(ctx, "node1", "n1back", lab.PodOptions{})
		return err
	})
	if err := l.Ping(ctx, "n3p1", p.IPs[0].Addr()); err != nil {
		if err := l.Ping(ctx, "n3p1", p.IPs[0].Addr()); err != nil {
			t.Errorf("pod added after the outage unreachable: %v", err)
		}
	}
	if err := l.DelPod(ctx, "n1back"); err != nil {
		t.Error(err)
	}
	// When the DEL after the failed ADD failed too, the lab kept n1down's
	// record (no address) for a DEL that can now succeed.
	for _, p := range l.State().Pods {
		if p.Name == "n1down" {
			if err := l.DelPod(ctx, p.Name); err != nil {
				t.Errorf("DEL of the pod whose ADD failed during the outage: %v", err)
			}
		}
	}
}

func testNodeJoinLeave(t *testing.T, l *lab.Lab) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := l.AddNode(ctx, "node4"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.AddPod(ctx, "node4", "n4p1", lab.PodOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := l.WaitEstablished(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.WaitRoutes(ctx); err != nil {
		t.Fatal(err)
	}
	for _, from := range []string{"n1p1", "n2p1", "n3p1"} {
		if err := l.Ping(ctx, from, podIP(t, l, "n4p1")); err != nil {
			if err := l.Ping(ctx, from, podIP(t, l, "n4p1")); err != nil {
				t.Errorf("%s cannot reach the new node's pod: %v", from, err)
			}
		}
	}
	if err := l.Ping(ctx, "n4p1", podIP(t, l, "n1p1")); err != nil {
		t.Errorf("the new node's pod cannot reach n1p1: %v", err)
	}
	var node4IP string
	for _, n := range l.State().Nodes {
		if n.Name == "node4" {
			node4IP = n.IP.Addr().String()
		}
	}
	if err := l.RemoveNode(ctx, "node4"); err != nil {
		t.Fatal(err)
	}
	// Its routes are withdrawn everywhere.
	testkit.EventuallyEvery(t, 30*time.Second, 200*time.Millisecond, "routes via the removed node withdrawn", func() error {
		var left []string
		for _, n := range []string{"node1", "node2", "node3"} {
			out, err := l.Exec(ctx, n, "ip", "-4", "route", "show", "proto", "81")
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(out), "via "+node4IP+" ") {
				left = append(left, n+": "+strings.TrimSpace(string(out)))
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("routes via the removed node remain:\n%s", strings.Join(left, "\n"))
		}
		return nil
	})
	if err := l.WaitEstablished(ctx); err != nil {
		t.Error(err)
	}
}

func testChurn(t *testing.T, l *lab.Lab) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	const pods, workers = 100, 4
	nodes := []string{"node1", "node2", "node3"}
	names := make(chan int)
	var mu sync.Mutex
	var errs []string
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range names {
				name := fmt.Sprintf("churn%d", i)
				if _, err := l.AddPod(ctx, nodes[i%len(nodes)], name, lab.PodOptions{Namespace: "churn"}); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Sprintf("add %s: %v", name, err))
					mu.Unlock()
					continue
				}
				if err := l.DelPod(ctx, name); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Sprintf("del %s: %v", name, err))
					mu.Unlock()
				}
			}
		}()
	}
	start := time.Now()
	for i := range pods {
		names <- i
	}
	close(names)
	wg.Wait()
	t.Logf("churn: %d pods added and deleted in %s", pods, time.Since(start).Round(time.Millisecond))
	if len(errs) > 0 {
		t.Fatalf("%d churn errors:\n%s", len(errs), strings.Join(errs, "\n"))
	}

	// No leaked addresses.
	rep, err := ipam.New(l.Store(), ipam.WithLeakGrace(0)).Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Errorf("ipam check after churn: leaks %v, orphan handles %v, inconsistencies %v", rep.Leaks, rep.OrphanHandles, rep.Inconsistencies)
	}
	// No stale routes or links: each node has exactly its remaining pods.
	want := map[string][]string{}
	for _, p := range l.State().Pods {
		if len(p.IPs) > 0 {
			want[p.Node] = append(want[p.Node], p.IPs[0].Addr().String())
		}
	}
	for _, n := range nodes {
		out, err := l.Exec(ctx, n, "ip", "-4", "route", "show", "proto", "80")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.Fields(line)
			if len(f) > 0 && f[0] != "blackhole" {
				got = append(got, strings.TrimSuffix(f[0], "/32"))
			}
		}
		slices.Sort(got)
		w := slices.Clone(want[n])
		slices.Sort(w)
		if !slices.Equal(got, w) {
			t.Errorf("%s workload routes after churn: %v, want %v", n, got, w)
		}
		links, err := l.Exec(ctx, n, "ip", "-o", "link", "show")
		if err != nil {
			t.Fatal(err)
		}
		if c := strings.Count(string(links), ": cali"); c != len(w) {
			t.Errorf("%s has %d cali links after churn, want %d", n, c, len(w))
		}
	}
}

// TestRouteReflectors: mesh off, 2 reflectors, 4 clients; the full matrix
// works and clients hold sessions only to the reflectors.
func TestRouteReflectors(t *testing.T) {
	l := upLab(t, lab.Options{Name: "e2err", Nodes: 6, RouteReflectors: 2, PodsPerNode: 1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := l.State()
	rrs := map[string]bool{}
	for _, n := range st.Nodes[:2] {
		rrs[n.IP.Addr().String()] = true
	}
	for _, n := range st.Nodes[2:] {
		s, err := l.NodeStatus(ctx, n.Name)
		if err != nil {
			t.Fatal(err)
		}
		var peers []string
		for _, p := range s.Peers {
			peers = append(peers, p.Address)
			if !rrs[p.Address] {
				t.Errorf("client %s has a session to %s, which is not a reflector", n.Name, p.Address)
			}
		}
		if len(peers) != 2 {
			t.Errorf("client %s has sessions %v, want one to each reflector", n.Name, peers)
		}
	}
	pingMatrix(t, l)
}

// testIdentityChange makes node1 a route reflector while it runs: its
// agent restarts its speaker with the new identity and the cluster keeps
// working.
func testIdentityChange(t *testing.T, l *lab.Lab) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := l.Store()
	obj, err := s.Get(ctx, api.KindNode, "", "node1")
	if err != nil {
		t.Fatal(err)
	}
	n := obj.(*api.Node)
	n.Spec.BGP.RouteReflectorClusterID = "244.0.0.9"
	changed := time.Now()
	if _, err := s.Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	// node1 restarts its speaker with the new identity: node2 sees the
	// session come back up after the change.
	testkit.EventuallyEvery(t, 60*time.Second, 200*time.Millisecond, "node2's session with node1 re-established after the identity change", func() error {
		st, err := l.NodeStatus(ctx, "node2")
		if err != nil {
			return err
		}
		for _, p := range st.Peers {
			if p.Address == "198.18.0.11" && p.State == "Established" && p.Since.After(changed) {
				return nil
			}
		}
		return fmt.Errorf("node2's status: %+v", st)
	})
	if err := l.WaitEstablished(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.WaitRoutes(ctx); err != nil {
		t.Fatal(err)
	}
	pingMatrix(t, l)
}

// testKernelReconcile: the agents diff against the kernel: a learned route
// deleted by hand comes back, a stale one with our protocol goes, and a
// route without our protocol number is never touched.
func testKernelReconcile(t *testing.T, l *lab.Lab) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	routes := func() string {
		out, err := l.Exec(ctx, "node2", "ip", "-4", "route", "show")
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	var node1Block string
	st, err := l.NodeStatus(ctx, "node1")
	if err != nil || len(st.Blocks) == 0 {
		t.Fatalf("node1 status: %+v %v", st, err)
	}
	node1Block = st.Blocks[0]
	mustExec := func(argv ...string) {
		t.Helper()
		if out, err := l.Exec(ctx, "node2", argv...); err != nil {
			t.Fatalf("%v: %v: %s", argv, err, out)
		}
	}
	mustExec("ip", "route", "del", node1Block, "proto", "81")
	mustExec("ip", "route", "add", "10.244.250.0/24", "via", "198.18.0.13", "proto", "81")
	mustExec("ip", "route", "add", "10.99.0.0/24", "via", "198.18.0.1", "proto", "static")
	defer func() { _, _ = l.Exec(context.Background(), "node2", "ip", "route", "del", "10.99.0.0/24") }()

	testkit.EventuallyEvery(t, 45*time.Second, 250*time.Millisecond, "the deleted route restored and the stale one removed", func() error {
		r := routes()
		restored := strings.Contains(r, node1Block+" via 198.18.0.11")
		staleGone := !strings.Contains(r, "10.244.250.0/24")
		if restored && staleGone {
			return nil
		}
		return fmt.Errorf("deleted route restored %v, stale route removed %v:\n%s", restored, staleGone, r)
	})
	if r := routes(); !regexp.MustCompile(`(?m)^10\.99\.0\.0/24 via 198\.18\.0\.1 .*proto static`).MatchString(r) {
		t.Errorf("the foreign route was touched:\n%s", r)
	}
}
