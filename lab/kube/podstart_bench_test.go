package kube

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/tabbynet/tabby/internal/image"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/kube/kubetest"
	"github.com/tabbynet/tabby/lab"
)

const (
	// podStartNodes kubelet nodes, podStartPods pods per round spread
	// evenly over them (issue 15: 30 pods on 3 nodes).
	podStartNodes = 3
	podStartPods  = 30
	// podStartLabel marks the benchmark's pods.
	podStartLabel = "tabby-bench"
	// refConflistName sorts before the lab's 10-tabby.conflist: while it
	// is in a node's /etc/cni/net.d, containerd's CRI plugin (which loads
	// the first configuration in name order and reloads on every change
	// of the directory) uses it.
	refConflistName = "00-ref-bridge.conflist"
	// refNetName is the reference network's name (host-local keeps its
	// leases in <dataDir>/<name>/).
	refNetName = "ref-bridge"
)

// refSubnets picks a /24 of the pod pool per node for the reference, from
// 10.244.250.0/24 down, none overlapping a block Tabby's IPAM claimed
// (the agents claim their first block at start, anywhere in the pool).
func refSubnets(blocks []ipam.BlockInfo, n int) []netip.Prefix {
	var out []netip.Prefix
	for x := 250; x >= 128 && len(out) < n; x-- {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(x), 0}), 24)
		if !slices.ContainsFunc(blocks, func(b ipam.BlockInfo) bool { return b.CIDR.Overlaps(p) }) {
			out = append(out, p)
		}
	}
	return out
}

// refConflist is the reference network: Debian's bridge plugin on a
// bridge of the node (no address on it, so no gateway and no route out of
// the pod's namespace; no masquerade) with host-local addresses from the
// node's subnet, and the same portmap tail as the lab's Tabby conflist
// when the lab chains one, so that the two chains differ in their first
// plugin only.
func refConflist(bridge string, subnet netip.Prefix, dataDir string, portmap bool) []byte {
	tail := ""
	if portmap {
		tail = `,
    {"type": "portmap", "snat": true, "capabilities": {"portMappings": true}}`
	}
	return fmt.Appendf(nil, `{
  "cniVersion": "1.0.0",
  "name": %q,
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": false,
      "isDefaultGateway": false,
      "ipMasq": false,
      "hairpinMode": false,
      "mtu": 1500,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q}]],
        "dataDir": %q
      }
    }%s
  ]
}
`, refNetName, bridge, subnet.String(), dataDir, tail)
}

// podSeen is what the benchmark's informer saw of a pod.
type podSeen struct {
	running time.Time // first seen Running with an address
	ip      netip.Addr
	node    string
	gone    bool
}

// podWatch records, from an informer on the benchmark's pods, when each
// was first seen Running with an address and when it was deleted.
type podWatch struct {
	mu     sync.Mutex
	pods   map[string]*podSeen
	notify chan struct{}
}

func (w *podWatch) observe(obj any, deleted bool) {
	now := time.Now()
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, deleted = d.Obj, true
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	w.mu.Lock()
	s := w.pods[p.Name]
	if s == nil {
		s = &podSeen{}
		w.pods[p.Name] = s
	}
	if deleted {
		s.gone = true
	} else if s.running.IsZero() && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
		s.running, s.node = now, p.Spec.NodeName
		s.ip, _ = netip.ParseAddr(p.Status.PodIP)
	}
	w.mu.Unlock()
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

// forget drops the names (before a new pod of the same name).
func (w *podWatch) forget(names []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, n := range names {
		delete(w.pods, n)
	}
}

// wait returns once cond, called with the records locked, holds; alive is
// checked every second (the kubelets still run).
func (w *podWatch) wait(ctx context.Context, alive func() error, cond func(map[string]*podSeen) bool) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		w.mu.Lock()
		ok := cond(w.pods)
		w.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w.notify:
		case <-tick.C:
			if err := alive(); err != nil {
				return err
			}
		}
	}
}

// podStartBench is the lab BenchmarkPrivilegedPodStart measures on.
type podStartBench struct {
	l       *Cluster
	client  kubernetes.Interface
	watch   *podWatch
	nodes   []string
	bridge  string
	portmap bool
	pods    int
	logs    []string // kubelet and agent logs, for failures
	// netns are the network namespaces the pods of this lab ran in
	// (recordNetns), which must be gone after Down.
	netns map[string]bool
	// refSubnets are the nodes' reference subnets, in node order.
	refSubnets []netip.Prefix
}

// BenchmarkPrivilegedPodStart (issue 15): pod start latency through the
// kubelet, from the test sending the pod to the API server until its
// informer sees the pod Running with an address, for 30 pause pods on 3
// lab nodes (10 each, spec.nodeName set: no scheduler), each node running
// containerd and a kubelet and Tabby's lab agent. The reference, in the
// same run and on the same nodes: Debian's bridge + host-local conflist
// (a /24 per node from 10.244.250.0/24 down, clear of Tabby's blocks),
// which containerd picks up when it is written before the Tabby conflist
// in the nodes'
// /etc/cni/net.d. A round creates the 30 pods, waits until all are
// Running with an address, deletes them and waits until they are gone;
// Tabby and reference rounds alternate, the order rotating. Each b.N
// iteration is one round of each; the b.N=1 run counts too, so
// -benchtime 2x gives 3 rounds of each.
//
//	tabby-p50-ms, tabby-p99-ms   medians over Tabby's rounds of the round's p50/p99
//	ref-p50-ms, ref-p99-ms       the same for the reference
//	x-ref-p50, x-ref-p99         Tabby / reference
//	tabby-cni-add-p50-ms         the agents' CNI ADD (log "CNI request done") in Tabby's rounds
//	tabby-sandbox-p50-ms         containerd's RunPodSandbox (runc starts the sandbox, the
//	ref-sandbox-p50-ms           CNI plugins run), from its log, all rounds pooled
//	tabby-agents-cpu-ms/pod      the three agents' CPU time (user + system) during a round,
//	ref-agents-cpu-ms/pod        per pod started and deleted (in the reference's rounds: idle)
//
// The creation timestamp the API server stores has a resolution of a
// second, so the start is the test's clock just before the Create call.
// TABBY_PODSTART_PODS changes the pod count (a multiple of 3).
//
//	TABBY_BIN=$PWD/bin go test -run '^$' -bench PodStart -benchtime 2x -timeout 30m ./lab/kube   # as root
func BenchmarkPrivilegedPodStart(b *testing.B) {
	binDir, archives := requireKubeletHost(b, []string{"pause.oci.tar"}, nil, []string{"bridge", "host-local"})
	pause := archives[0]
	bins := kubetest.Require(b, "kube-apiserver", "kubelet")
	pods := podStartPods
	if s := os.Getenv("TABBY_PODSTART_PODS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 || n%podStartNodes != 0 {
			b.Fatalf("TABBY_PODSTART_PODS=%q: want a positive multiple of %d", s, podStartNodes)
		}
		pods = n
	}
	s := upPodStartBench(b, bins["kubelet"], binDir, pause, pods)

	type roundResult struct {
		cfg      string
		p50, p99 time.Duration
		from, to time.Time
	}
	var results []roundResult
	sandbox := map[string][]time.Duration{}                     // containerd's RunPodSandbox, per configuration
	agentCPU, agentPods := map[string]int64{}, map[string]int{} // the agents' CPU ticks in each configuration's rounds
	b.Run(fmt.Sprintf("pods=%d/nodes=%d", pods, podStartNodes), func(b *testing.B) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		for range b.N {
			k := len(results) / 2
			order := []string{"tabby", "ref"}
			if k%2 == 1 {
				order = []string{"ref", "tabby"}
			}
			for _, cfg := range order {
				if err := s.use(ctx, b, cfg, k); err != nil {
					b.Fatal(err)
				}
				from, cpu0 := time.Now(), s.agentsCPU(b)
				lat, err := s.round(ctx, b, cfg, k)
				if err != nil {
					b.Fatal(err)
				}
				cpu := s.agentsCPU(b) - cpu0
				agentCPU[cfg] += cpu
				agentPods[cfg] += len(lat)
				r := roundResult{cfg: cfg, p50: testkit.Quantile(lat, 0.5), p99: testkit.Quantile(lat, 0.99), from: from, to: time.Now()}
				results = append(results, r)
				slowest := slices.Index(lat, slices.Max(lat))
				agents := ""
				if cfg == "tabby" {
					var adds []time.Duration
					for _, a := range s.cniAdds(b) {
						if !a.start.Before(r.from) && a.start.Before(r.to) {
							adds = append(adds, a.took)
						}
					}
					agents = fmt.Sprintf("; agents' CNI ADD n=%d p50 %v max %v", len(adds), testkit.Quantile(adds, 0.5).Round(time.Millisecond), slices.Max(append(adds, 0)).Round(time.Millisecond))
				}
				sandboxes := s.sandboxTimes(b)
				var sb []time.Duration
				for _, n := range s.names(cfg, k) {
					if d, ok := sandboxes[n]; ok {
						sb = append(sb, d)
					}
				}
				sandbox[cfg] = append(sandbox[cfg], sb...)
				b.Logf("round %d %-5s: %d pods, p50 %v, p99 %v, min %v, slowest %s; load %s; RunPodSandbox n=%d p50 %v max %v; agents' CPU %d ms%s", k, cfg, len(lat),
					r.p50.Round(time.Millisecond), r.p99.Round(time.Millisecond), slices.Min(lat).Round(time.Millisecond),
					s.names(cfg, k)[slowest], loadAvg(), len(sb), testkit.Quantile(sb, 0.5).Round(time.Millisecond), slices.Max(append(sb, 0)).Round(time.Millisecond),
					cpu*1000/clockTicks, agents)
			}
		}
		var p50, p99 = map[string][]time.Duration{}, map[string][]time.Duration{}
		for _, r := range results {
			p50[r.cfg] = append(p50[r.cfg], r.p50)
			p99[r.cfg] = append(p99[r.cfg], r.p99)
		}
		med := func(ds []time.Duration) time.Duration { return testkit.Quantile(ds, 0.5) }
		b.ReportMetric(ms(med(p50["tabby"])), "tabby-p50-ms")
		b.ReportMetric(ms(med(p99["tabby"])), "tabby-p99-ms")
		b.ReportMetric(ms(med(p50["ref"])), "ref-p50-ms")
		b.ReportMetric(ms(med(p99["ref"])), "ref-p99-ms")
		if r := med(p50["ref"]); r > 0 {
			b.ReportMetric(float64(med(p50["tabby"]))/float64(r), "x-ref-p50")
		}
		if r := med(p99["ref"]); r > 0 {
			b.ReportMetric(float64(med(p99["tabby"]))/float64(r), "x-ref-p99")
		}
		b.ReportMetric(float64(len(p50["tabby"])), "rounds")
		b.ReportMetric(ms(testkit.Quantile(sandbox["tabby"], 0.5)), "tabby-sandbox-p50-ms")
		b.ReportMetric(ms(testkit.Quantile(sandbox["ref"], 0.5)), "ref-sandbox-p50-ms")
		for _, cfg := range []string{"tabby", "ref"} {
			if agentPods[cfg] > 0 {
				b.ReportMetric(float64(agentCPU[cfg])*1000/clockTicks/float64(agentPods[cfg]), cfg+"-agents-cpu-ms/pod")
			}
		}
		// The agents' share: their CNI ADDs during Tabby's rounds.
		var adds []time.Duration
		for _, a := range s.cniAdds(b) {
			for _, r := range results {
				if r.cfg == "tabby" && !a.start.Before(r.from) && a.start.Before(r.to) {
					adds = append(adds, a.took)
				}
			}
		}
		if len(adds) > 0 {
			b.ReportMetric(ms(testkit.Quantile(adds, 0.5)), "tabby-cni-add-p50-ms")
			b.ReportMetric(ms(testkit.Quantile(adds, 0.99)), "tabby-cni-add-p99-ms")
		}
	})
}

// upPodStartBench brings up the API server, a 3-node lab with agents, and
// containerd and a kubelet on every node, all removed when the benchmark
// ends (also after a failure: pods deleted first, then the lab down).
func upPodStartBench(b *testing.B, kubelet, binDir, pause string, pods int) *podStartBench {
	var nodes []string
	for i := 1; i <= podStartNodes; i++ {
		nodes = append(nodes, lab.NodeName(i))
	}
	api := kubetest.StartWith(b, kubetest.Options{Nodes: nodes})
	// 30 pods created at once: client-go's default rate limit (5/s)
	// would spread the creations over seconds.
	rc := rest.CopyConfig(api.Config)
	rc.QPS, rc.Burst = 500, 500
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		b.Fatal(err)
	}

	name, runDir := testkit.UniqueName(b, "h15p"), b.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var log bytes.Buffer
	base, err := lab.Up(ctx, lab.Options{Name: name, Nodes: podStartNodes, RunDir: runDir, BinDir: binDir, Log: &log})
	if err != nil {
		b.Fatalf("Up: %v\n%s", err, log.String())
	}
	l := New(base)
	s := &podStartBench{l: l, client: client, nodes: nodes, bridge: "br-" + name, portmap: lab.PluginDir("portmap") != "", pods: pods,
		netns: map[string]bool{},
		watch: &podWatch{pods: map[string]*podSeen{}, notify: make(chan struct{}, 1)}}
	b.Cleanup(func() {
		if b.Failed() {
			for _, f := range s.logs {
				bs, _ := os.ReadFile(f)
				if len(bs) > 4000 {
					bs = bs[len(bs)-4000:]
				}
				b.Logf("%s (tail):\n%s", f, bs)
			}
		}
		if err := l.Down(); err != nil {
			b.Errorf("cleanup Down: %v", err)
		}
		if _, err := net.InterfaceByName(s.bridge); err == nil {
			b.Errorf("the reference bridge %s is in the host's namespace", s.bridge)
		}
		// Only the namespaces of this lab's pods: other labs (other
		// tests running at the same time) make and remove their own.
		for ns := range s.netns {
			if _, err := os.Stat(filepath.Join(lab.NetNSDir, ns)); err == nil {
				b.Errorf("pod network namespace %s left after Down", ns)
			}
		}
	})
	for _, n := range nodes {
		ln, err := lab.ListenIn(l.State().Node(n).NetNS, "127.0.0.1:6443")
		if err != nil {
			b.Fatal(err)
		}
		proxied := make(chan error, 1)
		go func() { proxied <- lab.Proxy(ln, strings.TrimPrefix(api.URL, "https://")) }()
		b.Cleanup(func() {
			ln.Close()
			if err := <-proxied; err != nil {
				b.Errorf("proxy: %v", err)
			}
		})
		if err := l.StartContainerd(ctx, n); err != nil {
			b.Fatalf("StartContainerd %s: %v\n%s", n, err, log.String())
		}
		if err := l.ImportImages(ctx, n, pause); err != nil {
			b.Fatal(err)
		}
		if err := l.StartKubelet(ctx, n, kubelet, KubeletOptions{Server: "https://127.0.0.1:6443", Token: api.Tokens["node:"+n]}); err != nil {
			b.Fatalf("StartKubelet %s: %v\n%s", n, err, log.String())
		}
		st := l.State().Node(n)
		s.logs = append(s.logs, st.Kubelet.Log, st.Agent.Log)
	}

	blocks, err := ipam.New(l.Store()).Blocks(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if s.refSubnets = refSubnets(blocks, len(nodes)); len(s.refSubnets) < len(nodes) {
		b.Fatalf("no %d /24s in 10.244.128.0/17 free of Tabby's blocks %v", len(nodes), blocks)
	}
	var claimed []netip.Prefix
	for _, bl := range blocks {
		claimed = append(claimed, bl.CIDR)
	}
	b.Logf("reference subnets %v; Tabby's blocks %v", s.refSubnets, claimed)

	s.startInformer(ctx, b)
	err = lab.Poll(ctx, 250*time.Millisecond, func() (bool, error) {
		if err := s.alive(); err != nil {
			return false, err
		}
		for _, n := range nodes {
			if ready, _ := nodeReady(ctx, client, n); !ready {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		for _, n := range nodes {
			_, msg := nodeReady(ctx, client, n)
			b.Logf("%s: %s", n, msg)
		}
		b.Fatalf("nodes not Ready: %v", err)
	}
	return s
}

// startInformer runs an informer on the benchmark's pods (s.watch sees
// each from now on) until the benchmark ends, and registers a cleanup
// that first deletes the pods through the kubelets (CNI DEL) while
// everything still runs: registered after Down's cleanup, it runs before.
func (s *podStartBench) startInformer(ctx context.Context, b *testing.B) {
	// The informer: every pod of the benchmark, from now on.
	client := s.client
	informer := cache.NewSharedIndexInformer(cache.NewFilteredListWatchFromClient(client.CoreV1().RESTClient(), "pods", "default",
		func(o *metav1.ListOptions) { o.LabelSelector = podStartLabel + "=podstart" }),
		&corev1.Pod{}, 0, cache.Indexers{})
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { s.watch.observe(o, false) },
		UpdateFunc: func(_, o any) { s.watch.observe(o, false) },
		DeleteFunc: func(o any) { s.watch.observe(o, true) },
	}); err != nil {
		b.Fatal(err)
	}
	stop := make(chan struct{})
	go informer.Run(stop)
	// Registered after Down's cleanup, so run before it: the pods go
	// through the kubelets (CNI DEL) while everything still runs.
	b.Cleanup(func() {
		defer close(stop)
		dctx, dcancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer dcancel()
		sel := metav1.ListOptions{LabelSelector: podStartLabel + "=podstart"}
		if err := client.CoreV1().Pods("default").DeleteCollection(dctx, metav1.DeleteOptions{}, sel); err != nil {
			b.Errorf("deleting the benchmark's pods: %v", err)
			return
		}
		err := lab.Poll(dctx, 250*time.Millisecond, func() (bool, error) {
			list, err := client.CoreV1().Pods("default").List(dctx, sel)
			return err == nil && len(list.Items) == 0, nil
		})
		if err != nil {
			b.Errorf("the benchmark's pods not gone: %v", err)
		}
	})
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		b.Fatal("the pod informer did not sync")
	}
}

// alive fails when a kubelet or containerd exited.
func (s *podStartBench) alive() error {
	for _, n := range s.nodes {
		st := s.l.State().Node(n)
		if !st.Kubelet.Alive() {
			return fmt.Errorf("the kubelet of %s exited: %s", n, logTail(st.Kubelet.Log))
		}
		if !st.Containerd.Alive() {
			return fmt.Errorf("the containerd of %s exited: %s", n, logTail(st.Containerd.Log))
		}
	}
	return nil
}

// refDataDir is host-local's directory on the node (its leases).
func (s *podStartBench) refDataDir(node string) string {
	return filepath.Join(s.l.NodeDir(node), "ref-ipam")
}

// expected reports whether ip is what cfg gives a pod on node i (0-based).
func (s *podStartBench) expected(cfg string, i int, ip netip.Addr) bool {
	if cfg == "ref" {
		return s.refSubnets[i].Contains(ip)
	}
	for _, p := range s.refSubnets {
		if p.Contains(ip) {
			return false
		}
	}
	return netip.MustParsePrefix(lab.PodPool).Contains(ip)
}

// checkRefSubnets fails when Tabby's IPAM claimed a block overlapping a
// reference subnet since they were picked.
func (s *podStartBench) checkRefSubnets(ctx context.Context) error {
	blocks, err := ipam.New(s.l.Store()).Blocks(ctx)
	if err != nil {
		return err
	}
	for _, b := range blocks {
		for _, p := range s.refSubnets {
			if b.CIDR.Overlaps(p) {
				return fmt.Errorf("Tabby's IPAM claimed %s (node %q), inside the reference subnet %s", b.CIDR, b.Affinity, p)
			}
		}
	}
	return nil
}

// use makes cfg ("tabby" or "ref") the nodes' pod network: the reference
// conflist written into (or removed from) each node's /etc/cni/net.d, then
// one probe pod per node must get an address of cfg (containerd reloads
// its CNI configuration asynchronously: a probe that got the other one is
// deleted and tried again).
func (s *podStartBench) use(ctx context.Context, b *testing.B, cfg string, round int) error {
	if err := s.checkRefSubnets(ctx); err != nil {
		return err
	}
	for i, n := range s.nodes {
		p := filepath.Join(filepath.Dir(s.l.ConflistPath(n)), refConflistName)
		if cfg == "tabby" {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			continue
		}
		if err := os.MkdirAll(s.refDataDir(n), 0o755); err != nil {
			return err
		}
		// Written aside and renamed: containerd must never read half a file.
		tmp := p + ".tmp"
		if err := os.WriteFile(tmp, refConflist(s.bridge, s.refSubnets[i], s.refDataDir(n), s.portmap), 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, p); err != nil {
			return err
		}
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for try := 0; ; try++ {
		names := make([]string, len(s.nodes))
		for i := range s.nodes {
			names[i] = fmt.Sprintf("probe-%s-%d-%d-%d", cfg, round, try, i+1)
		}
		if _, err := s.createAndWait(pctx, names); err != nil {
			return fmt.Errorf("%s probe pods: %w", cfg, err)
		}
		wrong := ""
		s.watch.mu.Lock()
		for i, name := range names {
			if ip := s.watch.pods[name].ip; !s.expected(cfg, i, ip) {
				wrong += fmt.Sprintf(" %s on %s got %s;", name, s.nodes[i], ip)
			}
		}
		s.watch.mu.Unlock()
		if err := s.deleteAndWait(pctx, cfg, names); err != nil {
			return err
		}
		if wrong == "" {
			break
		}
		b.Logf("%s not in effect yet:%s trying again", cfg, wrong)
		if try == 4 {
			return fmt.Errorf("the nodes do not use %s:%s", cfg, wrong)
		}
	}
	if cfg == "ref" {
		// The bridge is the node's, never the host's.
		for _, n := range s.nodes {
			if out, err := s.l.Exec(ctx, n, "ip", "link", "show", s.bridge); err != nil {
				return fmt.Errorf("the reference bridge %s is not in %s's namespace: %v %s", s.bridge, n, err, out)
			}
		}
		if _, err := net.InterfaceByName(s.bridge); err == nil {
			return fmt.Errorf("the reference bridge %s is in the host's namespace", s.bridge)
		}
	}
	return nil
}

// names are a round's pod names; the i-th (0-based) runs on node i%3+1.
func (s *podStartBench) names(cfg string, round int) []string {
	names := make([]string, s.pods)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d-%d-%d", cfg, round, i, i%podStartNodes+1)
	}
	return names
}

// createAndWait creates the named pause pods at once, the i-th on node
// i%3+1, and waits until the informer saw each Running with an address;
// it returns each pod's latency from just before its Create call.
func (s *podStartBench) createAndWait(ctx context.Context, names []string) ([]time.Duration, error) {
	s.watch.forget(names)
	sent := make([]time.Time, len(names))
	errs := make([]error, len(names))
	no, one := false, int64(1)
	var wg sync.WaitGroup
	for i, name := range names {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{podStartLabel: "podstart"}},
			Spec: corev1.PodSpec{
				NodeName:                      s.nodes[i%len(s.nodes)],
				AutomountServiceAccountToken:  &no,
				TerminationGracePeriodSeconds: &one,
				Containers:                    []corev1.Container{{Name: "pause", Image: image.PauseName, ImagePullPolicy: corev1.PullNever}},
			},
		}
		wg.Go(func() {
			sent[i] = time.Now()
			_, errs[i] = s.client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	err := s.watch.wait(wctx, s.alive, func(m map[string]*podSeen) bool {
		for _, n := range names {
			if p := m[n]; p == nil || p.running.IsZero() {
				return false
			}
		}
		return true
	})
	if err != nil {
		n := 0
		s.watch.mu.Lock()
		for _, name := range names {
			if p := s.watch.pods[name]; p != nil && !p.running.IsZero() {
				n++
			}
		}
		s.watch.mu.Unlock()
		return nil, fmt.Errorf("%d of %d pods Running with an address: %w", n, len(names), err)
	}
	lat := make([]time.Duration, len(names))
	s.watch.mu.Lock()
	defer s.watch.mu.Unlock()
	for i, name := range names {
		p := s.watch.pods[name]
		if p.node != s.nodes[i%len(s.nodes)] {
			return nil, fmt.Errorf("pod %s ran on %s, want %s", name, p.node, s.nodes[i%len(s.nodes)])
		}
		lat[i] = p.running.Sub(sent[i])
	}
	return lat, nil
}

// deleteAndWait deletes the named pods and waits until they are gone from
// the API server; for the reference, also until host-local released every
// address (the CNI DEL ran).
func (s *podStartBench) deleteAndWait(ctx context.Context, cfg string, names []string) error {
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() { errs[i] = s.client.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{}) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	err := s.watch.wait(wctx, s.alive, func(m map[string]*podSeen) bool {
		for _, n := range names {
			if p := m[n]; p == nil || !p.gone {
				return false
			}
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("%d pods not gone: %w", len(names), err)
	}
	if cfg != "ref" {
		return nil
	}
	return lab.Poll(wctx, 100*time.Millisecond, func() (bool, error) {
		for _, n := range s.nodes {
			entries, err := os.ReadDir(filepath.Join(s.refDataDir(n), refNetName))
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return false, err
			}
			for _, e := range entries {
				if _, err := netip.ParseAddr(e.Name()); err == nil {
					return false, nil // a lease left
				}
			}
		}
		return true, nil
	})
}

// round starts the round's pods, checks their addresses are cfg's, and
// deletes them; it returns their start latencies.
func (s *podStartBench) round(ctx context.Context, b *testing.B, cfg string, round int) ([]time.Duration, error) {
	names := s.names(cfg, round)
	lat, err := s.createAndWait(ctx, names)
	if err != nil {
		return nil, fmt.Errorf("round %d %s: %w", round, cfg, err)
	}
	s.watch.mu.Lock()
	var wrong []string
	for i, name := range names {
		if ip := s.watch.pods[name].ip; !s.expected(cfg, i%len(s.nodes), ip) {
			wrong = append(wrong, fmt.Sprintf("%s: %s", name, ip))
		}
	}
	s.watch.mu.Unlock()
	if len(wrong) > 0 {
		return nil, fmt.Errorf("round %d %s: pods with another network's address: %v", round, cfg, wrong)
	}
	if err := s.recordNetns(ctx); err != nil {
		return nil, err
	}
	if err := s.deleteAndWait(ctx, cfg, names); err != nil {
		return nil, fmt.Errorf("round %d %s: %w", round, cfg, err)
	}
	s.watch.forget(names)
	return lat, nil
}

// cniAdd is one CNI ADD an agent logged.
type cniAdd struct {
	start time.Time
	took  time.Duration
}

var cniAddDone = regexp.MustCompile(`^time=(\S+) .*msg="CNI request done" .*cmd=ADD .*dur=(\S+)`)

// cniAdds reads the agents' logs for their CNI ADDs.
func (s *podStartBench) cniAdds(b *testing.B) []cniAdd {
	var out []cniAdd
	for _, n := range s.nodes {
		f, err := os.Open(s.l.State().Node(n).Agent.Log)
		if err != nil {
			b.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			m := cniAddDone.FindStringSubmatch(sc.Text())
			if m == nil {
				continue
			}
			end, err1 := time.Parse(time.RFC3339Nano, m[1])
			d, err2 := time.ParseDuration(m[2])
			if err1 == nil && err2 == nil {
				out = append(out, cniAdd{end.Add(-d), d})
			}
		}
		f.Close()
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// loadAvg is /proc/loadavg's 1-minute figure.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

// recordNetns adds the network namespaces holding a task of the nodes'
// containerds to s.netns.
func (s *podStartBench) recordNetns(ctx context.Context) error {
	nss, err := s.l.KubePodNetns(ctx)
	if err != nil {
		return err
	}
	for _, ns := range nss {
		s.netns[ns] = true
	}
	if len(s.netns) == 0 {
		return errors.New("no task of the nodes' containerds runs in a pod network namespace: the check after Down would prove nothing")
	}
	return nil
}

var (
	runSandboxStart = regexp.MustCompile(`^time="(\S+)" level=info msg="RunPodSandbox for &PodSandboxMetadata\{Name:([^,]+),.*\}"$`)
	runSandboxDone  = regexp.MustCompile(`^time="(\S+)" level=info msg="RunPodSandbox for &PodSandboxMetadata\{Name:([^,]+),.*\} returns sandbox id`)
)

// sandboxTimes reads the nodes' containerd logs for how long each pod's
// RunPodSandbox took (the first attempt), by pod name.
func (s *podStartBench) sandboxTimes(b *testing.B) map[string]time.Duration {
	start, out := map[string]time.Time{}, map[string]time.Duration{}
	for _, n := range s.nodes {
		f, err := os.Open(s.l.State().Node(n).Containerd.Log)
		if err != nil {
			b.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if m := runSandboxDone.FindStringSubmatch(line); m != nil {
				if t, err := time.Parse(time.RFC3339Nano, m[1]); err == nil && !start[m[2]].IsZero() {
					if _, seen := out[m[2]]; !seen {
						out[m[2]] = t.Sub(start[m[2]])
					}
				}
			} else if m := runSandboxStart.FindStringSubmatch(line); m != nil {
				if t, err := time.Parse(time.RFC3339Nano, m[1]); err == nil && start[m[2]].IsZero() {
					start[m[2]] = t
				}
			}
		}
		f.Close()
	}
	return out
}

// clockTicks is USER_HZ, 100 on every Linux this runs on.
const clockTicks = 100

// agentsCPU is the agents' CPU time so far (user + system), in clock ticks.
func (s *podStartBench) agentsCPU(b *testing.B) int64 {
	var sum int64
	for _, n := range s.nodes {
		f, err := lab.ProcStat(s.l.State().Node(n).Agent.PID)
		if err != nil || len(f) < 13 {
			b.Fatalf("the agent of %s: %v", n, err)
		}
		// f[0] is field 3 (state): utime is field 14, stime 15.
		u, err1 := strconv.ParseInt(f[11], 10, 64)
		st, err2 := strconv.ParseInt(f[12], 10, 64)
		if err1 != nil || err2 != nil {
			b.Fatalf("the agent of %s: /proc stat fields %q %q", n, f[11], f[12])
		}
		sum += u + st
	}
	return sum
}
