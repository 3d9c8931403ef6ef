package kube

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/kube/kubebins"
	"github.com/tabbynet/tabby/kube/kubetest"
	"github.com/tabbynet/tabby/lab"
)

// kubeProxyBenchServices is how many Services select every pod of the
// benchmark: each pod that becomes ready changes that many EndpointSlices,
// which every node's kube-proxy turns into new rules while the next pods'
// CNI ADDs run.
const kubeProxyBenchServices = 20

// BenchmarkPrivilegedPodAddKubeProxy (issue 25): what kube-proxy beside
// Tabby costs a pod's start. The Kubernetes lab as shipped (Up: control
// plane, kubelets, Tabby's DaemonSet from the manifests, no DNS) on 3
// nodes with kube-proxy in nftables mode; kubeProxyBenchServices Services
// select the benchmark's pods. A round starts podStartPods pause pods at
// once (spec.nodeName, spread evenly), waits until every one is Running
// with an address, deletes them and waits until they are gone — the
// same rounds as BenchmarkPrivilegedPodStart. Rounds with kube-proxy
// ("proxy": running on every node, its tables in place) and without
// ("noproxy": stopped, its nftables tables deleted) alternate, the order
// rotating. Each b.N iteration is one round of each; the b.N=1 run counts
// too, so -benchtime 2x gives 3 rounds of each.
//
//	proxy-p50-ms, noproxy-p50-ms   medians over the rounds of the round's p50 pod start
//	x-noproxy-p50                  proxy / noproxy
//	proxy-cni-add-p50-ms           the agents' own CNI ADD ("CNI request done" in the
//	noproxy-cni-add-p50-ms         DaemonSet pods' logs) in each configuration's rounds, pooled
//	x-noproxy-cni-add-p50          proxy / noproxy
//
//	TABBY_BIN=$PWD/bin go test -run '^$' -bench PodAddKubeProxy -benchtime 2x -timeout 40m ./lab/kube   # as root
func BenchmarkPrivilegedPodAddKubeProxy(b *testing.B) {
	s := upKubeProxyBench(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	type roundResult struct {
		cfg      string
		p50      time.Duration
		from, to time.Time
	}
	var results []roundResult
	b.Run(fmt.Sprintf("pods=%d/nodes=%d/services=%d", podStartPods, podStartNodes, kubeProxyBenchServices), func(b *testing.B) {
		for range b.N {
			k := len(results) / 2
			order := []string{"proxy", "noproxy"}
			if k%2 == 1 {
				order = []string{"noproxy", "proxy"}
			}
			for _, cfg := range order {
				if err := s.setKubeProxy(ctx, cfg == "proxy"); err != nil {
					b.Fatal(err)
				}
				names := s.names(cfg, k)
				from := time.Now()
				lat, err := s.createAndWait(ctx, names)
				if err != nil {
					b.Fatalf("round %d %s: %v", k, cfg, err)
				}
				to := time.Now()
				if err := s.recordNetns(ctx); err != nil {
					b.Fatal(err)
				}
				if err := s.deleteAndWait(ctx, cfg, names); err != nil {
					b.Fatalf("round %d %s: %v", k, cfg, err)
				}
				s.watch.forget(names)
				r := roundResult{cfg: cfg, p50: testkit.Quantile(lat, 0.5), from: from, to: to}
				results = append(results, r)
				adds := s.daemonSetCNIAdds(b, from, to)
				b.Logf("round %d %-7s: %d pods, p50 %v, p99 %v; agents' CNI ADD n=%d p50 %v; load %s", k, cfg, len(lat),
					r.p50.Round(time.Millisecond), testkit.Quantile(lat, 0.99).Round(time.Millisecond),
					len(adds), testkit.Quantile(adds, 0.5).Round(time.Millisecond), loadAvg())
			}
		}
		p50, adds := map[string][]time.Duration{}, map[string][]time.Duration{}
		for _, r := range results {
			p50[r.cfg] = append(p50[r.cfg], r.p50)
			adds[r.cfg] = append(adds[r.cfg], s.daemonSetCNIAdds(b, r.from, r.to)...)
		}
		med := func(ds []time.Duration) time.Duration { return testkit.Quantile(ds, 0.5) }
		for _, cfg := range []string{"proxy", "noproxy"} {
			b.ReportMetric(ms(med(p50[cfg])), cfg+"-p50-ms")
			b.ReportMetric(ms(med(adds[cfg])), cfg+"-cni-add-p50-ms")
		}
		if r := med(p50["noproxy"]); r > 0 {
			b.ReportMetric(float64(med(p50["proxy"]))/float64(r), "x-noproxy-p50")
		}
		if r := med(adds["noproxy"]); r > 0 {
			b.ReportMetric(float64(med(adds["proxy"]))/float64(r), "x-noproxy-cni-add-p50")
		}
		b.ReportMetric(float64(len(p50["proxy"])), "rounds")
	})
}

// upKubeProxyBench brings up the lab BenchmarkPrivilegedPodAddKubeProxy
// measures on (removed when the benchmark ends, the pods first) with its
// Services.
func upKubeProxyBench(b *testing.B) *podStartBench {
	binDir, archives := requireKubeletHost(b, []string{"pause.oci.tar", "tabby.oci.tar"}, []string{"nft"}, nil)
	kubetest.Require(b, kubebins.Names...)
	var nodes []string
	for i := 1; i <= podStartNodes; i++ {
		nodes = append(nodes, lab.NodeName(i))
	}
	name, runDir := testkit.UniqueName(b, "kpb"), b.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var log bytes.Buffer
	base, err := lab.Up(ctx, lab.Options{Name: name, Nodes: podStartNodes, RunDir: runDir, BinDir: binDir, NoAgents: true, Log: &log})
	if err != nil {
		b.Fatalf("Up: %v\n%s", err, log.String())
	}
	l := New(base)
	b.Cleanup(func() {
		if b.Failed() {
			b.Logf("lab log:\n%s", log.String())
		}
		if err := l.Down(); err != nil {
			b.Errorf("cleanup Down: %v", err)
		}
	})
	if err := l.Up(ctx, UpOptions{Kube: KubeOptions{Images: archives, KubeProxy: ProxyNFTables},
		Deploy: DeployOptions{ManifestDir: "../../manifests"}, NoDNS: true}); err != nil {
		b.Fatal(err)
	}
	caFile, certFile, keyFile := l.AdminCredentials()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: APIServerURL(), Dial: l.KubeDial(), QPS: 500, Burst: 500,
		TLSClientConfig: rest.TLSClientConfig{CAFile: caFile, CertFile: certFile, KeyFile: keyFile}})
	if err != nil {
		b.Fatal(err)
	}
	for i := range kubeProxyBenchServices {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%d", i), Namespace: "default"},
			Spec: corev1.ServiceSpec{
				Selector: map[string]string{podStartLabel: "podstart"},
				Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}},
			},
		}
		if _, err := client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	s := &podStartBench{l: l, client: client, nodes: nodes, pods: podStartPods, netns: map[string]bool{},
		watch: &podWatch{pods: map[string]*podSeen{}, notify: make(chan struct{}, 1)}}
	s.startInformer(ctx, b)
	return s

}

// setKubeProxy runs kube-proxy on every node (on) or none: stopped, and
// its nftables tables deleted, as on a node that never ran it.
func (s *podStartBench) setKubeProxy(ctx context.Context, on bool) error {
	for _, n := range s.nodes {
		st := s.l.State().Node(n)
		if on {
			if !st.KubeProxy.Alive() {
				if err := s.l.StartKubeProxy(ctx, n, ProxyNFTables); err != nil {
					return err
				}
			}
			continue
		}
		if err := s.l.StopKubeProxy(ctx, n); err != nil {
			return err
		}
		for _, family := range []string{"ip", "ip6"} {
			out, err := exec.CommandContext(ctx, "ip", "netns", "exec", st.NetNS, "nft", "delete", "table", family, "kube-proxy").CombinedOutput()
			if err != nil && !strings.Contains(string(out), "No such file or directory") {
				return fmt.Errorf("%s: deleting kube-proxy's %s table: %v: %s", n, family, err, out)
			}
		}
	}
	return nil
}

// daemonSetCNIAdds are the CNI ADDs that the nodes' agents (the DaemonSet's
// tabby-node containers, their logs under the kubelets' pod log
// directories) started between from and to.
func (s *podStartBench) daemonSetCNIAdds(b *testing.B, from, to time.Time) []time.Duration {
	var out []time.Duration
	for _, n := range s.nodes {
		logs, err := filepath.Glob(filepath.Join(s.l.KubeletDir(n), "pod-logs", "tabby-system_tabby-node-*", "tabby-node", "*.log"))
		if err != nil || len(logs) == 0 {
			b.Fatalf("%s: no tabby-node log (%v)", n, err)
		}
		for _, p := range logs {
			f, err := os.Open(p)
			if err != nil {
				b.Fatal(err)
			}
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				// CRI log lines: <time> <stream> <tag> <line>.
				fs := strings.SplitN(sc.Text(), " ", 4)
				if len(fs) < 4 {
					continue
				}
				m := cniAddDone.FindStringSubmatch(fs[3])
				if m == nil {
					continue
				}
				end, err1 := time.Parse(time.RFC3339Nano, m[1])
				d, err2 := time.ParseDuration(m[2])
				if start := end.Add(-d); err1 == nil && err2 == nil && !start.Before(from) && start.Before(to) {
					out = append(out, d)
				}
			}
			f.Close()
		}
	}
	return out
}
