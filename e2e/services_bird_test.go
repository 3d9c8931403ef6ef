package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
)

// Service advertisement on the plain lab (no Kubernetes): the Service
// records are written to etcd the way tabby-kube-controllers writes them,
// and BIRD in the ToR namespace is the router that learns them. Every
// address is a private test range inside the lab's namespaces:
// ClusterIPs 10.96.0.0/16, LoadBalancer IPs 198.19.0.0/24, external IPs
// 198.19.8.0/24.
const (
	svcClusterRange = "10.96.0.0/16"
	svcLBRange      = "198.19.0.0/24"
	svcExtRange     = "198.19.8.0/24"
	svcClusterLB    = "198.19.0.1/32" // of a Cluster Service
	svcLocalLB      = "198.19.0.2/32" // of a Local Service
	svcRefusedExt   = "198.19.9.9"    // outside serviceExternalIPs
)

// setServiceConfig sets the cluster's Service ranges in the lab's
// BGPConfiguration and peers every node with the ToR.
func setServiceConfig(ctx context.Context, tb testing.TB, l *lab.Lab) {
	tb.Helper()
	st := l.Store()
	bc, err := datastore.GetAs[*api.BGPConfiguration](ctx, st, api.KindBGPConfiguration, "", api.SingletonName)
	switch {
	case errors.Is(err, datastore.ErrNotFound):
		bc = &api.BGPConfiguration{Metadata: api.ObjectMeta{Name: api.SingletonName}}
	case err != nil:
		tb.Fatal(err)
	}
	bc.Spec.ServiceClusterIPs = []api.ServiceCIDR{{CIDR: svcClusterRange}}
	bc.Spec.ServiceLoadBalancerIPs = []api.ServiceCIDR{{CIDR: svcLBRange}}
	bc.Spec.ServiceExternalIPs = []api.ServiceCIDR{{CIDR: svcExtRange}}
	bc.Spec.PrefixAdvertisements = []api.PrefixAdvertisement{{CIDR: svcLBRange, Communities: []string{"65001:300"}}}
	if _, err := st.Apply(ctx, bc); err != nil {
		tb.Fatal(err)
	}
	if _, err := st.Create(ctx, &api.BGPPeer{Metadata: api.ObjectMeta{Name: "tor"}, Spec: api.BGPPeerSpec{PeerIP: torAddr, ASNumber: torASN}}); err != nil {
		tb.Fatal(err)
	}
}

// putServiceRecord writes a Service record as the controllers would.
func putServiceRecord(ctx context.Context, tb testing.TB, l *lab.Lab, name, policy string, nodes []string, lb, ext []string) {
	tb.Helper()
	rec := &api.Service{
		Metadata: api.ObjectMeta{Namespace: "default", Name: name, Annotations: map[string]string{api.AnnotationOrigin: api.OriginKubernetes}},
		Spec: api.ServiceSpec{Type: "LoadBalancer", ClusterIPs: []string{"10.96.0.10"}, LoadBalancerIPs: lb, ExternalIPs: ext,
			ExternalTrafficPolicy: policy, EndpointNodes: nodes},
	}
	if _, err := l.Store().Apply(ctx, rec); err != nil {
		tb.Fatal(err)
	}
}

// birdVia returns the next hops of BIRD's paths to prefix, sorted.
func birdVia(ctx context.Context, b *bird, prefix string) ([]string, string, error) {
	out, err := b.c(ctx, "show", "route", "for", prefix)
	if err != nil {
		return nil, out, err
	}
	var via []string
	for p, paths := range parseBIRDRoutes(out) {
		if p != prefix {
			continue
		}
		for _, path := range paths {
			via = append(via, path.via)
		}
	}
	slices.Sort(via)
	return via, out, nil
}

func nodeAddrs(nodes []lab.NodeState, names ...string) []string {
	var out []string
	for _, n := range nodes {
		if len(names) == 0 || slices.Contains(names, n.Name) {
			out = append(out, n.IP.Addr().String())
		}
	}
	slices.Sort(out)
	return out
}

// waitBIRDVia waits until BIRD's paths to each prefix go via exactly the
// given next hops (none: no route).
func waitBIRDVia(ctx context.Context, tb testing.TB, b *bird, want map[string][]string) {
	tb.Helper()
	testkit.EventuallyEvery(tb, 20*time.Second, 50*time.Millisecond, "BIRD's Service routes", func() error {
		var errs []error
		for prefix, hops := range want {
			got, out, err := birdVia(ctx, b, prefix)
			if err != nil && len(hops) > 0 {
				return err
			}
			if !slices.Equal(got, hops) {
				errs = append(errs, fmt.Errorf("BIRD's paths to %s go via %v, want %v:\n%s", prefix, got, hops, out))
			}
		}
		return errors.Join(errs...)
	})
}

// requireBIRD skips tb when not root or when BIRD 2 (bird, birdc) is not installed.
func requireBIRD(tb testing.TB) {
	tb.Helper()
	testkit.RequirePrivileged(tb, "ip", "nsenter", "ping")
	for _, bin := range []string{"bird", "birdc"} {
		if _, err := exec.LookPath(bin); err != nil {
			tb.Skipf("BIRD test skipped: %s not installed (Debian package bird2)", bin)
		}
	}
}

// TestPrivilegedServiceAdvertisementBIRD: BIRD as the ToR learns the
// ClusterIP range from every node, a Cluster LoadBalancer IP from every
// node (ECMP in the ToR's kernel) and a Local one only from the node with
// the endpoint, moving when the record's node set changes; an external IP
// outside serviceExternalIPs is advertised by nobody and reported; a
// node's own BGPConfiguration narrows what it advertises; no node installs
// another's Service advertisement as a learned route, and each blackholes
// what it advertises.
func TestPrivilegedServiceAdvertisementBIRD(t *testing.T) {
	requireBIRD(t)
	l := upLab(t, lab.Options{Name: "svcadv", Nodes: 3, PodsPerNode: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	b := startBIRD(t, l)
	nodes := l.State().Nodes
	setServiceConfig(ctx, t, l)
	waitToRSessions(ctx, t, l, nodes, 30*time.Second, "Established", func(p api.PeerStatus) bool { return p.Type == "global" && p.State == "Established" })
	putServiceRecord(ctx, t, l, "web", api.TrafficPolicyCluster, nil, []string{"198.19.0.1"}, nil)
	putServiceRecord(ctx, t, l, "db", api.TrafficPolicyLocal, []string{"node1"}, []string{"198.19.0.2"}, nil)
	putServiceRecord(ctx, t, l, "bad", api.TrafficPolicyCluster, nil, nil, []string{svcRefusedExt})

	all := nodeAddrs(nodes)
	waitBIRDVia(ctx, t, b, map[string][]string{
		svcClusterRange: all, svcClusterLB: all, svcLocalLB: nodeAddrs(nodes, "node1"), svcRefusedExt + "/32": nil,
	})
	out, err := b.c(ctx, "show", "route", "for", svcClusterLB, "all")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "(65001,300)") {
		t.Errorf("the LoadBalancer IP lacks the community of its prefixAdvertisement:\n%s", out)
	}
	if strings.Contains(out, "4294967295") {
		t.Errorf("the speaker's Service tag reached the router:\n%s", out)
	}
	// The ToR's kernel spreads the Cluster address over every node.
	testkit.EventuallyEvery(t, 10*time.Second, 100*time.Millisecond, "ECMP at the ToR", func() error {
		out, err := l.Exec(ctx, "tor", "ip", "-4", "route", "show", svcClusterLB)
		if err != nil {
			return err
		}
		for _, a := range all {
			if !strings.Contains(string(out), "via "+a) {
				return fmt.Errorf("the ToR's route to %s lacks next hop %s:\n%s", svcClusterLB, a, out)
			}
		}
		return nil
	})

	t.Run("RefusedIsReported", func(t *testing.T) {
		testkit.EventuallyEvery(t, 10*time.Second, 100*time.Millisecond, "node1's status", func() error {
			s, err := l.NodeStatus(ctx, "node1")
			if err != nil {
				return err
			}
			for _, d := range s.Services {
				if d.Service == "default/bad" && d.Refused && strings.Contains(d.Reason, "outside serviceExternalIPs") {
					return nil
				}
			}
			return fmt.Errorf("node1 reports no refusal of default/bad: %+v", s.Services)
		})
	})

	t.Run("NoNodeLearnsServiceRoutes", func(t *testing.T) {
		for _, n := range nodes {
			out, err := l.Exec(ctx, n.Name, "ip", "-4", "route", "show", "proto", "81")
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{"10.96.", "198.19.0.", "198.19.8.", "198.19.9."} {
				if strings.Contains(string(out), p) {
					t.Errorf("%s installed a learned route to a Service address:\n%s", n.Name, out)
				}
			}
			out, err = l.Exec(ctx, n.Name, "ip", "-4", "route", "show", "type", "blackhole")
			if err != nil {
				t.Fatal(err)
			}
			want := []string{svcClusterRange, strings.TrimSuffix(svcClusterLB, "/32")}
			if n.Name == "node1" {
				want = append(want, strings.TrimSuffix(svcLocalLB, "/32"))
			}
			for _, w := range want {
				if !strings.Contains(string(out), "blackhole "+w+" proto 80") {
					t.Errorf("%s has no Service blackhole for %s:\n%s", n.Name, w, out)
				}
			}
		}
	})

	t.Run("Tabbyctl", func(t *testing.T) {
		// A Service whose ready endpoint is pod n1p1 (on node1).
		rec := &api.Service{Metadata: api.ObjectMeta{Namespace: "default", Name: "api"},
			Spec: api.ServiceSpec{Type: "LoadBalancer", ClusterIPs: []string{"10.96.0.20"}, LoadBalancerIPs: []string{"198.19.0.3"},
				ExternalTrafficPolicy: api.TrafficPolicyLocal, EndpointNodes: []string{"node1"}, EndpointAddresses: []string{podIP(t, l, "n1p1").String()}}}
		if _, err := l.Store().Apply(ctx, rec); err != nil {
			t.Fatal(err)
		}
		waitBIRDVia(ctx, t, b, map[string][]string{"198.19.0.3/32": nodeAddrs(nodes, "node1")})
		checks := []struct {
			args []string
			want []string
		}{
			{[]string{"get", "services", "-A"}, []string{"198.19.0.1 from all 3 nodes", "198.19.0.2 from node1",
				"10.96.0.10 in 10.96.0.0/16 from all 3 nodes", "198.19.9.9: REFUSED: 198.19.9.9 is outside serviceExternalIPs [198.19.8.0/24] (on node1,node2,node3)"}},
			{[]string{"node", "status", "--node", "node2"}, []string{"Service advertisements", "198.19.0.1/32        loadBalancerIP of default/web, advertised",
				"198.19.0.2/32        loadBalancerIP of default/db, not advertised: externalTrafficPolicy Local and no ready endpoint on this node"}},
			{[]string{"explain", "pod", "default/n1p1"}, []string{"Services leading here", "default/api (LoadBalancer, externalTrafficPolicy Local, ready endpoints on node1)",
				"198.19.0.3 (loadBalancerIP): from node1", "10.96.0.20 (clusterIP): in 10.96.0.0/16 from all 3 nodes"}},
		}
		for _, c := range checks {
			// The agents publish their status every 2 s.
			testkit.EventuallyEvery(t, 15*time.Second, 500*time.Millisecond, "tabbyctl "+strings.Join(c.args, " "), func() error {
				out, err := tabbyctl(t, l, c.args...)
				if err != nil {
					return fmt.Errorf("%w: %s", err, out)
				}
				for _, w := range c.want {
					if !strings.Contains(out, w) {
						return fmt.Errorf("want %q in:\n%s", w, out)
					}
				}
				return nil
			})
		}
		if err := l.Store().Delete(ctx, api.KindService, "default", "api", ""); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("LocalMovesWithItsEndpoint", func(t *testing.T) {
		start := time.Now()
		putServiceRecord(ctx, t, l, "db", api.TrafficPolicyLocal, []string{"node2", "node3"}, []string{"198.19.0.2"}, nil)
		waitBIRDVia(ctx, t, b, map[string][]string{svcLocalLB: nodeAddrs(nodes, "node2", "node3")})
		t.Logf("Local endpoint moved node1 → node2,node3: BIRD follows in %s", time.Since(start))
		putServiceRecord(ctx, t, l, "db", api.TrafficPolicyLocal, nil, []string{"198.19.0.2"}, nil)
		waitBIRDVia(ctx, t, b, map[string][]string{svcLocalLB: nil, svcClusterLB: all})
	})

	t.Run("NodeConfigurationNarrows", func(t *testing.T) {
		if _, err := l.Store().Create(ctx, &api.BGPConfiguration{Metadata: api.ObjectMeta{Name: api.NodeConfigName("node3")},
			Spec: api.BGPConfigurationSpec{ServiceLoadBalancerIPs: []api.ServiceCIDR{{CIDR: "198.19.0.128/25"}}}}); err != nil {
			t.Fatal(err)
		}
		waitBIRDVia(ctx, t, b, map[string][]string{svcClusterLB: nodeAddrs(nodes, "node1", "node2"), svcClusterRange: all})
		if err := l.Store().Delete(ctx, api.KindBGPConfiguration, "", api.NodeConfigName("node3"), ""); err != nil {
			t.Fatal(err)
		}
		waitBIRDVia(ctx, t, b, map[string][]string{svcClusterLB: all})
	})

	t.Run("ExportFiltersApply", func(t *testing.T) {
		st := l.Store()
		if _, err := st.Create(ctx, &api.BGPFilter{Metadata: api.ObjectMeta{Name: "tor-out"}, Spec: api.BGPFilterSpec{
			ExportV4: []api.BGPFilterRule{{CIDR: svcLBRange, MatchOperator: api.MatchOperatorIn, Action: api.FilterActionReject}}}}); err != nil {
			t.Fatal(err)
		}
		setFilters := func(fs ...string) {
			t.Helper()
			peer, err := datastore.GetAs[*api.BGPPeer](ctx, st, api.KindBGPPeer, "", "tor")
			if err != nil {
				t.Fatal(err)
			}
			peer.Spec.Filters = fs
			if _, err := datastore.UpdateAs(ctx, st, peer); err != nil {
				t.Fatal(err)
			}
		}
		setFilters("tor-out")
		waitBIRDVia(ctx, t, b, map[string][]string{svcClusterLB: nil, svcClusterRange: all})
		setFilters()
		waitBIRDVia(ctx, t, b, map[string][]string{svcClusterLB: all})
	})

	t.Run("ServiceGoneIsWithdrawn", func(t *testing.T) {
		if err := l.Store().Delete(ctx, api.KindService, "default", "web", ""); err != nil {
			t.Fatal(err)
		}
		waitBIRDVia(ctx, t, b, map[string][]string{svcClusterLB: nil, svcClusterRange: all})
	})
}

// BenchmarkPrivilegedServiceLocalMove measures, on a 3-node lab with BIRD
// as the ToR, how long the announcement of a Local Service's
// LoadBalancer IP takes to follow its record when the endpoint moves from
// one node to the other (node1 ↔ node2): from the record's write
// returning until BIRD has the path from the new node only. Reported:
//
//	p50-ms, p99-ms, max-ms   record written → BIRD's path set changed
//	                         (withdrawn from the old node, learned from
//	                         the new one)
//	local-p50-ms             record written → the new node's own Service
//	                         blackhole for the address (its local pass:
//	                         the reference, measured in the same run)
//	x-local                  p50 / local-p50
//	poll-p50-ms              one birdc call: the resolution of p50-ms
//
// Each is polled by its own loop, a command every 2 ms after the last
// answered (birdc for BIRD, ip route in the node): the resolution is
// poll-p50-ms plus 2 ms. Run it with:
//
//	TABBY_BIN=$PWD/bin go test -run '^$' -bench ServiceLocalMove -benchtime 30x ./e2e/
func BenchmarkPrivilegedServiceLocalMove(b *testing.B) {
	requireBIRD(b)
	const name = "svcadvb"
	_ = lab.Teardown(context.Background(), runDir, name, io.Discard)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	l, err := lab.Up(ctx, lab.Options{Name: name, Nodes: 3, RunDir: runDir, BinDir: os.Getenv("TABBY_BIN")})
	if err != nil {
		_ = lab.Teardown(context.Background(), runDir, name, io.Discard)
		b.Fatalf("lab up: %v", err)
	}
	b.Cleanup(func() {
		if err := l.Down(); err != nil {
			b.Errorf("lab down: %v", err)
		}
	})
	if err := l.WaitEstablished(ctx); err != nil {
		b.Fatal(err)
	}
	bd := startBIRD(b, l)
	nodes := l.State().Nodes
	setServiceConfig(ctx, b, l)
	waitToRSessions(ctx, b, l, nodes, 30*time.Second, "Established", func(p api.PeerStatus) bool { return p.Type == "global" && p.State == "Established" })
	at := []string{"node1"}
	putServiceRecord(ctx, b, l, "db", api.TrafficPolicyLocal, at, []string{"198.19.0.2"}, nil)
	waitBIRDVia(ctx, b, bd, map[string][]string{svcLocalLB: nodeAddrs(nodes, at...)})

	var moves, locals, polls []time.Duration
	b.ResetTimer()
	for range b.N {
		next := "node2"
		if at[0] == "node2" {
			next = "node1"
		}
		want := nodeAddrs(nodes, next)
		putServiceRecord(ctx, b, l, "db", api.TrafficPolicyLocal, []string{next}, []string{"198.19.0.2"}, nil)
		start := time.Now()
		// Two pollers, one per condition, each as fast as its command
		// answers: the resolution is one birdc (one ip route) call.
		poll := func(done func() bool, polls *[]time.Duration) time.Duration {
			for time.Since(start) < 20*time.Second {
				t0 := time.Now()
				ok := done()
				*polls = append(*polls, time.Since(t0))
				if ok {
					return time.Since(start)
				}
				time.Sleep(2 * time.Millisecond) // leave the agents the CPU
			}
			return 0
		}
		var local time.Duration
		var localPolls, birdPolls []time.Duration
		localDone := make(chan struct{})
		go func() {
			defer close(localDone)
			local = poll(func() bool {
				out, err := l.Exec(ctx, next, "ip", "-4", "route", "show", "type", "blackhole", strings.TrimSuffix(svcLocalLB, "/32"))
				return err == nil && strings.Contains(string(out), "blackhole")
			}, &localPolls)
		}()
		moved := poll(func() bool {
			via, _, err := birdVia(ctx, bd, svcLocalLB)
			return err == nil && slices.Equal(via, want)
		}, &birdPolls)
		<-localDone
		if moved == 0 || local == 0 {
			b.Fatalf("the announcement did not follow the endpoint to %s within 20s", next)
		}
		polls = append(polls, birdPolls...)
		moves, locals = append(moves, moved), append(locals, local)
		at = []string{next}
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	p50, local50 := testkit.Quantile(moves, 0.5), testkit.Quantile(locals, 0.5)
	b.ReportMetric(ms(p50), "p50-ms")
	b.ReportMetric(ms(testkit.Quantile(moves, 0.99)), "p99-ms")
	b.ReportMetric(ms(slices.Max(moves)), "max-ms")
	b.ReportMetric(ms(local50), "local-p50-ms")
	b.ReportMetric(ms(testkit.Quantile(polls, 0.5)), "poll-p50-ms")
	if local50 > 0 {
		b.ReportMetric(float64(p50)/float64(local50), "x-local")
	}
	b.ReportMetric(0, "ns/op")
}
