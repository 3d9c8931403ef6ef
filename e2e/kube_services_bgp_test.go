package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/image"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
	"github.com/tabbynet/tabby/lab/kube"
)

// The first "Must show", end to end: the Kubernetes lab as
// shipped (kube-proxy in nftables mode, Tabby from the manifests,
// tabby-kube-controllers reading Services), BIRD as the ToR, the
// LoadBalancer address given by Tabby's LB IPAM from a pool of the test
// range 198.19.0.0/28, and a client in the ToR's namespace.
const (
	kbgpNS     = "k25"
	kbgpPool   = "198.19.0.0/28"
	kbgpConns  = 60 // connections per spread check
	kbgpLBPool = "lb-k25"
	// kbgpDarkPool is a LoadBalancer pool outside serviceLoadBalancerIPs.
	kbgpDarkPool = "198.19.1.0/30"
)

// kbgpManifest: the echo backend, 3 replicas spread over the 3 nodes,
// behind a LoadBalancer Service asking for Tabby's pool by annotation.
const kbgpManifest = `apiVersion: v1
kind: Namespace
metadata: {name: ` + kbgpNS + `}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: ` + kbgpNS + `}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: web}}}
      containers:
      - name: echo
        image: ` + image.EchoName + `
        imagePullPolicy: Never
        ports: [{containerPort: 8080}]
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: ` + kbgpNS + `
  annotations: {tabby.dev/ipv4pools: '["` + kbgpLBPool + `"]'}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Cluster
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
`

// setKubeServiceConfig writes the BGPConfiguration's Service ranges
// (serviceClusterIPs only when clusterIPs), the ToR peer and the
// LoadBalancer pool, each idempotently.
func setKubeServiceConfig(ctx context.Context, tb testing.TB, st *datastore.Store, clusterIPs bool) {
	tb.Helper()
	bc, err := datastore.GetAs[*api.BGPConfiguration](ctx, st, api.KindBGPConfiguration, "", api.SingletonName)
	switch {
	case errors.Is(err, datastore.ErrNotFound):
		bc = &api.BGPConfiguration{Metadata: api.ObjectMeta{Name: api.SingletonName}}
	case err != nil:
		tb.Fatal(err)
	}
	bc.Spec.ServiceLoadBalancerIPs = []api.ServiceCIDR{{CIDR: svcLBRange}}
	bc.Spec.ServiceClusterIPs = nil
	if clusterIPs {
		bc.Spec.ServiceClusterIPs = []api.ServiceCIDR{{CIDR: kube.ServiceCIDR}}
	}
	if _, err := st.Apply(ctx, bc); err != nil {
		tb.Fatal(err)
	}
	if _, err := st.Apply(ctx, &api.BGPPeer{Metadata: api.ObjectMeta{Name: "tor"}, Spec: api.BGPPeerSpec{PeerIP: torAddr, ASNumber: torASN}}); err != nil {
		tb.Fatal(err)
	}
	if _, err := st.Apply(ctx, &api.IPPool{Metadata: api.ObjectMeta{Name: kbgpLBPool},
		Spec: api.IPPoolSpec{CIDR: kbgpPool, AllowedUses: []api.IPPoolUse{api.UseLoadBalancer}}}); err != nil {
		tb.Fatal(err)
	}
}

// upKubeBGPLab brings a 3-node Kubernetes lab (kube-proxy nftables, Tabby
// from the manifests, CoreDNS) and BIRD as its ToR, with the nodes peered
// with it. It skips, saying why, without BIRD, the Kubernetes binaries or
// the images.
func upKubeBGPLab(ctx context.Context, tb testing.TB, prefix string) (*kube.Cluster, *bird) {
	tb.Helper()
	requireBIRD(tb)
	l := upKubeProxyLab(ctx, tb, prefix, 3)
	b := startBIRD(tb, l.Lab)
	setKubeServiceConfig(ctx, tb, l.Store(), false)
	// The agents are the DaemonSet's (their status sockets are in the
	// nodes' host paths, not the lab's): the sessions are checked at BIRD.
	testkit.EventuallyEvery(tb, 60*time.Second, 200*time.Millisecond, "BIRD's sessions to every node", func() error {
		out, err := b.c(ctx, "show", "protocols")
		if err != nil {
			return err
		}
		for _, n := range l.State().Nodes {
			if st := birdProtocolState(out, n.Name); st != "Established" {
				return fmt.Errorf("BIRD protocol %s is %q, want Established:\n%s", n.Name, st, out)
			}
		}
		return nil
	})
	return l, b
}

// TestKubeServicesBGP: on the Kubernetes lab with kube-proxy and BIRD as
// the ToR, a LoadBalancer Service of a 3-replica Deployment gets its
// address from Tabby's LB IPAM; with externalTrafficPolicy Cluster every
// node advertises it (ECMP in the ToR's kernel) and connections from the
// ToR's namespace reach every backend; with Local only the nodes with a
// ready backend advertise it, scaling the Deployment moves the
// announcements, and the backend sees the client's own address; a
// NetworkPolicy blocks the external client after kube-proxy's DNAT and
// then lets it in by its address; with serviceClusterIPs set, the ToR
// reaches the Service's ClusterIP.
func TestKubeServicesBGP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	l, b := upKubeBGPLab(ctx, t, "sbgp")
	nodes := l.State().Nodes
	all := nodeAddrs(nodes)
	tor, err := l.ResolveNetNS("tor")
	if err != nil {
		t.Fatal(err)
	}
	// The ToR hashes flows by ports too (a per-namespace sysctl of the
	// lab's own ToR), so that connections spread over the ECMP paths.
	if out, err := l.Exec(ctx, "tor", "sysctl", "-w", "net.ipv4.fib_multipath_hash_policy=1"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}

	created := time.Now()
	kubectl := labKubectl(ctx, t, l, kbgpManifest)
	var lb netip.Addr
	assigned := testkit.EventuallyEvery(t, 60*time.Second, 100*time.Millisecond, "the LoadBalancer address of web", func() error {
		out, err := l.Kubectl(ctx, "-n", kbgpNS, "get", "service", "web", "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}")
		if err != nil {
			return err
		}
		if lb, err = netip.ParseAddr(strings.TrimSpace(string(out))); err != nil {
			return fmt.Errorf("ingress %q: %w", out, err)
		}
		return nil
	})
	if !netip.MustParsePrefix(kbgpPool).Contains(lb) {
		t.Fatalf("web got %s, outside the LoadBalancer pool %s", lb, kbgpPool)
	}
	lbPrefix := netip.PrefixFrom(lb, 32).String()
	waitBIRDVia(ctx, t, b, map[string][]string{lbPrefix: all})
	t.Logf("Service created → %s assigned %v → BIRD has it from every node %v", lb,
		assigned.Round(time.Millisecond), time.Since(created).Round(time.Millisecond))
	kubectl("-n", kbgpNS, "rollout", "status", "deployment/web", "--timeout=3m")
	webs := kbgpPods(ctx, t, l, 3)

	t.Run("ClusterECMPAndSpread", func(t *testing.T) {
		testkit.EventuallyEvery(t, 10*time.Second, 100*time.Millisecond, "ECMP at the ToR", func() error {
			out, err := l.Exec(ctx, "tor", "ip", "-4", "route", "show", lb.String())
			if err != nil {
				return err
			}
			for _, a := range all {
				if !strings.Contains(string(out), "via "+a) {
					return fmt.Errorf("the ToR's route to %s lacks next hop %s:\n%s", lb, a, out)
				}
			}
			return nil
		})
		// kube-proxy on a node sees the Service's slice a moment after
		// the rollout: eventually every backend answers.
		testkit.EventuallyEvery(t, 30*time.Second, 500*time.Millisecond, "connections from the ToR spread over every backend", func() error {
			byPod, bySrc, err := torConnect(ctx, tor, netip.AddrPortFrom(lb, 80), kbgpConns)
			if err != nil {
				return err
			}
			t.Logf("%d connections to %s:80: by backend %v, by source the backends saw %v", kbgpConns, lb, byPod, bySrc)
			for _, p := range webs {
				if byPod[p.Name] == 0 {
					return fmt.Errorf("backend %s on %s never answered: %v", p.Name, p.Node, byPod)
				}
			}
			// Cluster: the node a connection came in by masquerades it,
			// so the sources the backends saw are the ECMP paths taken.
			for _, a := range all {
				if bySrc[a] == 0 {
					return fmt.Errorf("no connection came in through node %s: sources %v", a, bySrc)
				}
			}
			return nil
		})
	})

	t.Run("LocalFollowsBackends", func(t *testing.T) {
		kubectl("-n", kbgpNS, "patch", "service", "web", "-p", `{"spec":{"externalTrafficPolicy":"Local"}}`)
		// Every node has a backend: every node still advertises it.
		waitBIRDVia(ctx, t, b, map[string][]string{lbPrefix: all})
		for _, replicas := range []int{1, 2} {
			start := time.Now()
			kubectl("-n", kbgpNS, "scale", "deployment/web", fmt.Sprintf("--replicas=%d", replicas))
			kubectl("-n", kbgpNS, "rollout", "status", "deployment/web", "--timeout=2m")
			pods := kbgpPods(ctx, t, l, replicas)
			var at []string
			for _, p := range pods {
				at = append(at, p.Node)
			}
			waitBIRDVia(ctx, t, b, map[string][]string{lbPrefix: nodeAddrs(nodes, at...)})
			t.Logf("scaled to %d (backends on %v): BIRD has %s from those nodes only, %v after the scale", replicas, at, lb,
				time.Since(start).Round(time.Millisecond))
			testkit.EventuallyEvery(t, 30*time.Second, 500*time.Millisecond, "the backends see the ToR's own address", func() error {
				byPod, bySrc, err := torConnect(ctx, tor, netip.AddrPortFrom(lb, 80), 20)
				if err != nil {
					return err
				}
				if len(bySrc) != 1 || bySrc[torAddr] == 0 {
					return fmt.Errorf("the backends saw sources %v, want only the client's own %s", bySrc, torAddr)
				}
				for p := range byPod {
					if !slices.ContainsFunc(pods, func(x lab.PodState) bool { return x.Name == p }) {
						return fmt.Errorf("answered by %s, not a current backend %v", p, pods)
					}
				}
				return nil
			})
		}
	})

	t.Run("PolicyOnExternalClient", func(t *testing.T) {
		nps := kubeAdminClient(t, l).NetworkingV1().NetworkPolicies(kbgpNS)
		// Ingress to web from the pod network only: not the ToR.
		np := &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: kbgpNS, Name: "edge"},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.244.0.0/16"}}}}},
			},
		}
		if _, err := nps.Create(ctx, np, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		blocked := testkit.EventuallyEvery(t, kubeDeadline, 200*time.Millisecond, "the policy drops the ToR's client at the LoadBalancer address", func() error {
			c, err := torDial(ctx, tor, netip.AddrPortFrom(lb, 80))
			if err == nil {
				c.Close()
				return errors.New("still answered")
			}
			if !errors.Is(err, errServiceBlocked) {
				return err
			}
			return nil
		})
		// The client's address, as the pod sees it (Local), on the
		// backend's port after kube-proxy's DNAT.
		port := intstr.FromInt32(8080)
		cur, err := nps.Get(ctx, "edge", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Spec.Ingress = append(cur.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{
			From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: torAddr + "/32"}}},
			Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
		})
		if _, err := nps.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		allowed := testkit.EventuallyEvery(t, kubeDeadline, 200*time.Millisecond, "the policy lets the ToR's client in", func() error {
			_, bySrc, err := torConnect(ctx, tor, netip.AddrPortFrom(lb, 80), 5)
			if err != nil {
				return err
			}
			if bySrc[torAddr] != 5 {
				return fmt.Errorf("sources %v, want the client's own", bySrc)
			}
			return nil
		})
		if err := nps.Delete(ctx, "edge", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Logf("external client through %s: blocked %v after the policy's create, allowed %v after its update",
			lb, blocked.Round(time.Millisecond), allowed.Round(time.Millisecond))
	})

	t.Run("RefusedAddressEvent", func(t *testing.T) {
		// A LoadBalancer pool outside serviceLoadBalancerIPs: its address
		// is assigned, advertised by no node, and the Service says why.
		if _, err := l.Store().Apply(ctx, &api.IPPool{Metadata: api.ObjectMeta{Name: "lb-k25-dark"},
			Spec: api.IPPoolSpec{CIDR: kbgpDarkPool, AllowedUses: []api.IPPoolUse{api.UseLoadBalancer}}}); err != nil {
			t.Fatal(err)
		}
		kc := kubeAdminClient(t, l)
		dark := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "dark", Namespace: kbgpNS, Annotations: map[string]string{"tabby.dev/ipv4pools": `["lb-k25-dark"]`}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": "web"},
				Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
		}
		if _, err := kc.CoreV1().Services(kbgpNS).Create(ctx, dark, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		want := "not advertised over BGP: 198.19.1.0 is outside serviceLoadBalancerIPs [" + svcLBRange + "]"
		testkit.EventuallyEvery(t, 30*time.Second, 250*time.Millisecond, "the event on Service dark", func() error {
			evs, err := kc.CoreV1().Events(kbgpNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=dark,reason=ServiceAddressNotAdvertised"})
			if err != nil {
				return err
			}
			for _, e := range evs.Items {
				if e.Type == corev1.EventTypeWarning && e.Message == want {
					return nil
				}
			}
			return fmt.Errorf("no Warning %q among %d events", want, len(evs.Items))
		})
		waitBIRDVia(ctx, t, b, map[string][]string{"198.19.1.0/32": nil, lbPrefix: nodeAddrs(nodes, kbgpNodes(ctx, t, l)...)})
		if err := kc.CoreV1().Services(kbgpNS).Delete(ctx, "dark", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("ClusterIPRangeFromToR", func(t *testing.T) {
		clusterIP := netip.MustParseAddr(kubectl("-n", kbgpNS, "get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"))
		// Not set: nobody advertises the range, the ToR has no route.
		waitBIRDVia(ctx, t, b, map[string][]string{kube.ServiceCIDR: nil})
		if _, err := torDial(ctx, tor, netip.AddrPortFrom(clusterIP, 80)); err == nil {
			t.Fatalf("the ToR reached %s without serviceClusterIPs", clusterIP)
		}
		setKubeServiceConfig(ctx, t, l.Store(), true)
		waitBIRDVia(ctx, t, b, map[string][]string{kube.ServiceCIDR: all})
		testkit.EventuallyEvery(t, 30*time.Second, 500*time.Millisecond, "the ToR reaches web's ClusterIP", func() error {
			byPod, _, err := torConnect(ctx, tor, netip.AddrPortFrom(clusterIP, 80), 10)
			if err != nil {
				return err
			}
			t.Logf("10 connections to %s:80 from the ToR: by backend %v", clusterIP, byPod)
			return nil
		})
	})
}

// kbgpPods waits until the web Deployment has exactly n Running pods
// (those terminating gone) and returns them.
func kbgpPods(ctx context.Context, t *testing.T, l *kube.Cluster, n int) []lab.PodState {
	t.Helper()
	var pods []lab.PodState
	testkit.EventuallyEvery(t, 60*time.Second, 250*time.Millisecond, fmt.Sprintf("%d web pods", n), func() error {
		var err error
		if pods, err = l.KubePods(ctx, kbgpNS, "app=web"); err != nil {
			return err
		}
		if len(pods) != n {
			return fmt.Errorf("%d web pods, want %d: %+v", len(pods), n, pods)
		}
		return nil
	})
	return pods
}

// kbgpNodes returns the nodes of the web Deployment's Running pods.
func kbgpNodes(ctx context.Context, t *testing.T, l *kube.Cluster) []string {
	t.Helper()
	pods, err := l.KubePods(ctx, kbgpNS, "app=web")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range pods {
		out = append(out, p.Node)
	}
	return out
}

// torDial connects from the ToR's namespace; a connection that times out
// is errServiceBlocked.
func torDial(ctx context.Context, tor string, to netip.AddrPort) (net.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	c, err := lab.DialIn(dctx, tor, "tcp4", to.String())
	if err != nil && dctx.Err() != nil && ctx.Err() == nil {
		return nil, fmt.Errorf("%w: %v", errServiceBlocked, err)
	}
	return c, err
}

// torConnect opens n connections from the ToR's namespace to to, one
// after the other, and counts the echo backends' answers by pod name and
// by the client address they saw.
func torConnect(ctx context.Context, tor string, to netip.AddrPort, n int) (byPod, bySrc map[string]int, err error) {
	byPod, bySrc = map[string]int{}, map[string]int{}
	for i := range n {
		c, err := torDial(ctx, tor, to)
		if err != nil {
			return nil, nil, fmt.Errorf("connection %d to %s: %w", i, to, err)
		}
		_ = c.SetDeadline(time.Now().Add(probeTimeout))
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil {
			return nil, nil, fmt.Errorf("connection %d to %s: reading: %w", i, to, err)
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, nil, fmt.Errorf("connection %d to %s: answer %q", i, to, line)
		}
		ap, err := netip.ParseAddrPort(f[1])
		if err != nil {
			return nil, nil, fmt.Errorf("connection %d to %s: answer %q: %w", i, to, line, err)
		}
		byPod[f[0]]++
		bySrc[ap.Addr().String()]++
	}
	return byPod, bySrc, nil
}

// BenchmarkKubeServiceLBToToR measures, on the Kubernetes lab with BIRD
// as the ToR, a LoadBalancer Service (externalTrafficPolicy Cluster, no
// backends needed) from its creation through the API server until BIRD
// has its address from every node. Each iteration creates one Service,
// deletes it once measured and waits for the withdrawal. Reported:
//
//	assign-p50-ms, assign-p99-ms  created → status.loadBalancer.ingress set
//	                              (tabby-kube-controllers' LB IPAM)
//	route-p50-ms, route-p99-ms    created → BIRD has the /32 from all 3 nodes
//	direct-p50-ms                 the reference, same run: a Service record
//	                              written to etcd directly (as the
//	                              controllers write it) → BIRD has it from
//	                              all 3 nodes (the agents' and BGP's share)
//	x-direct                      route-p50 / direct-p50
//
// Polling: the API server every 5 ms, birdc every 2 ms after the last
// answered. Run it with:
//
//	TABBY_BIN=$PWD/bin go test -run '^$' -bench KubeServiceLBToToR -benchtime 20x ./e2e/
func BenchmarkKubeServiceLBToToR(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	l, bd := upKubeBGPLab(ctx, b, "sbgpb")
	all := nodeAddrs(l.State().Nodes)
	kc := kubeAdminClient(b, l)
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kbgpNS}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	svcs := kc.CoreV1().Services(kbgpNS)
	poll := func(what string, start time.Time, every time.Duration, done func() bool) time.Duration {
		for time.Since(start) < 30*time.Second {
			if done() {
				return time.Since(start)
			}
			time.Sleep(every)
		}
		b.Fatalf("%s: not within 30 s", what)
		return 0
	}
	routed := func(prefix string, want []string) func() bool {
		return func() bool {
			via, _, err := birdVia(ctx, bd, prefix)
			// birdc fails on a prefix it has no route for.
			return (err == nil || len(want) == 0) && slices.Equal(via, want)
		}
	}
	const directLB = "198.19.0.200" // in serviceLoadBalancerIPs, outside the pool
	var assigns, routes, directs []time.Duration
	b.ResetTimer()
	for i := range b.N {
		name := fmt.Sprintf("bench%d", i)
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: kbgpNS, Annotations: map[string]string{"tabby.dev/ipv4pools": `["` + kbgpLBPool + `"]`}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster,
				Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
		}
		start := time.Now()
		if _, err := svcs.Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		var lb string
		assigns = append(assigns, poll("ingress set", start, 5*time.Millisecond, func() bool {
			s, err := svcs.Get(ctx, name, metav1.GetOptions{})
			if err != nil || len(s.Status.LoadBalancer.Ingress) == 0 {
				return false
			}
			lb = s.Status.LoadBalancer.Ingress[0].IP
			return true
		}))
		routes = append(routes, poll(lb+" from every node", start, 2*time.Millisecond, routed(lb+"/32", all)))
		if err := svcs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			b.Fatal(err)
		}
		poll(lb+" withdrawn", time.Now(), 10*time.Millisecond, routed(lb+"/32", nil))

		start = time.Now()
		putServiceRecord(ctx, b, l.Lab, "direct", api.TrafficPolicyCluster, nil, []string{directLB}, nil)
		directs = append(directs, poll("the direct record's address from every node", start, 2*time.Millisecond, routed(directLB+"/32", all)))
		if err := l.Store().Delete(ctx, api.KindService, "default", "direct", ""); err != nil {
			b.Fatal(err)
		}
		poll("the direct record's address withdrawn", time.Now(), 10*time.Millisecond, routed(directLB+"/32", nil))
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(testkit.Quantile(assigns, 0.5)), "assign-p50-ms")
	b.ReportMetric(ms(testkit.Quantile(assigns, 0.99)), "assign-p99-ms")
	b.ReportMetric(ms(testkit.Quantile(routes, 0.5)), "route-p50-ms")
	b.ReportMetric(ms(testkit.Quantile(routes, 0.99)), "route-p99-ms")
	b.ReportMetric(ms(testkit.Quantile(directs, 0.5)), "direct-p50-ms")
	if d := testkit.Quantile(directs, 0.5); d > 0 {
		b.ReportMetric(float64(testkit.Quantile(routes, 0.5))/float64(d), "x-direct")
	}
	b.ReportMetric(0, "ns/op")
}
