package kube_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/kube"
	"github.com/tabbynet/tabby/kube/kubetest"
)

// BenchmarkKubeSyncLag: the real tabby-kube-controllers process (built by
// `make build`, found through TABBY_BIN) against a real kube-apiserver, as
// the manifests' least-privilege user. Each iteration creates 1,000 pods
// in 10 namespaces and 100 NetworkPolicies through client-go (8 writers)
// and waits until every pod record and translated policy is in etcd.
//
//	create-s     client-go's time to create everything (the reference)
//	in-etcd-s    first create → the last record in etcd
//	lag-ms       the last create → the last record in etcd
//	rss-MiB      the controllers' VmRSS once everything is in etcd
//	hwm-MiB      their VmHWM (peak resident) by then
//	idle-rss-MiB their VmRSS once leading, before any object
//
//	make build && TABBY_BIN=$PWD/bin go test -run '^$' -bench KubeSyncLag -benchtime 3x ./kube/
func BenchmarkKubeSyncLag(b *testing.B) {
	binDir := os.Getenv("TABBY_BIN")
	bin := filepath.Join(binDir, "tabby-kube-controllers")
	if _, err := os.Stat(bin); binDir == "" || err != nil {
		b.Skipf("needs TABBY_BIN=<dir with tabby-kube-controllers> (make build): %v", err)
	}
	srv := kubetest.Start(b)
	ctx := context.Background()
	kc := srv.Client
	store, etcd := storetest.NewWithEtcd(b)
	kubetest.ApplyControllersRBAC(b, kc, "../manifests/tabby-kube-controllers.yaml")

	dir := b.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	kcfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: k, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: c, user: {token: %q}}]
contexts: [{name: k, context: {cluster: k, user: c}}]
current-context: k
`, srv.URL, srv.Tokens["controllers"])
	if err := os.WriteFile(kubeconfig, []byte(kcfg), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "--kubeconfig", kubeconfig, "--etcd-endpoints", strings.Join(etcd.Endpoints(), ","),
		"--identity", "bench", "--lease-namespace", "tabby-system", "--log-level", "warn")
	exited := kubetest.StartDaemon(b, "tabby-kube-controllers", cmd, filepath.Join(dir, "controllers.log"), nil)
	pollUntil(b, "the controllers lead", 60*time.Second, exited, func() (bool, error) {
		_, err := store.GetKV(ctx, datastore.KubeMarkerKey)
		if err == nil {
			return true, nil
		}
		return false, ignoreNotFound(err)
	})
	idle := procStatus(b, cmd.Process.Pid)

	const nsPerRound, podsPerNS, policies = 10, 100, 100
	var creates, inEtcd, lags []float64
	var last map[string]float64
	b.ResetTimer()
	for round := range b.N {
		start := time.Now()
		var nss []string
		for i := range nsPerRound {
			nss = append(nss, fmt.Sprintf("bench-%d-%d", round, i))
		}
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(8)
		for _, ns := range nss {
			if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
				Labels: map[string]string{"round": strconv.Itoa(round)}}}, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		for i := range nsPerRound * podsPerNS {
			ns := nss[i%nsPerRound]
			g.Go(func() error {
				_, err := kc.CoreV1().Pods(ns).Create(gctx, benchPod(ns, i), metav1.CreateOptions{})
				return err
			})
		}
		for i := range policies {
			ns := nss[i%nsPerRound]
			g.Go(func() error {
				_, err := kc.NetworkingV1().NetworkPolicies(ns).Create(gctx, benchPolicy(ns, i), metav1.CreateOptions{})
				return err
			})
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		created := time.Now()
		prefix := fmt.Sprintf("bench-%d-", round)
		pollUntil(b, "every pod record and policy in etcd", 5*time.Minute, exited, func() (bool, error) {
			pods, err := countKV(ctx, store, datastore.KubePodsPrefix, prefix)
			if err != nil {
				return false, err
			}
			pols, err := countPolicies(ctx, store, prefix)
			return pods == nsPerRound*podsPerNS && pols == policies, err
		})
		done := time.Now()
		creates = append(creates, created.Sub(start).Seconds())
		inEtcd = append(inEtcd, done.Sub(start).Seconds())
		lags = append(lags, float64(done.Sub(created).Milliseconds()))
		last = procStatus(b, cmd.Process.Pid)
	}
	b.StopTimer()
	b.ReportMetric(median(creates), "create-s")
	b.ReportMetric(median(inEtcd), "in-etcd-s")
	b.ReportMetric(median(lags), "lag-ms")
	b.ReportMetric(last["VmRSS"]/1024, "rss-MiB")
	b.ReportMetric(last["VmHWM"]/1024, "hwm-MiB")
	b.ReportMetric(idle["VmRSS"]/1024, "idle-rss-MiB")
}

func benchPod(ns string, i int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("pod-%04d", i),
			Labels: map[string]string{"app": fmt.Sprintf("app-%d", i%20), "tier": "web"}},
		Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%d", i%50), Containers: []corev1.Container{{Name: "c", Image: "none",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
	}
}

func benchPolicy(ns string, i int) *networkingv1.NetworkPolicy {
	port := intstr.FromString("http")
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("np-%03d", i)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%d", i%20)}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
				From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "web"}}},
					{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}}},
			}},
		},
	}
}

// countKV counts the keys under prefix whose next path element (the
// namespace) starts with nsPrefix.
func countKV(ctx context.Context, s *datastore.Store, prefix, nsPrefix string) (int, error) {
	kvs, _, err := s.ListKV(ctx, prefix)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, kv := range kvs {
		if strings.HasPrefix(strings.TrimPrefix(kv.Key, prefix), nsPrefix) {
			n++
		}
	}
	return n, nil
}

// countPolicies counts the translated policies in namespaces starting with
// nsPrefix.
func countPolicies(ctx context.Context, s *datastore.Store, nsPrefix string) (int, error) {
	objs, _, err := s.List(ctx, api.KindNetworkPolicy, "")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, o := range objs {
		m := o.GetMeta()
		if strings.HasPrefix(m.Namespace, nsPrefix) && strings.HasPrefix(m.Name, kube.PolicyPrefix) {
			n++
		}
	}
	return n, nil
}

func pollUntil(b *testing.B, what string, within time.Duration, exited <-chan error, ok func() (bool, error)) {
	b.Helper()
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			b.Fatalf("%s: tabby-kube-controllers exited: %v", what, err)
		default:
		}
		done, err := ok()
		if done {
			return
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	b.Fatalf("%s: not within %s (last error: %v)", what, within, last)
}

// procStatus returns the kB figures of /proc/<pid>/status.
func procStatus(b *testing.B, pid int) map[string]float64 {
	b.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		fields := strings.Fields(v)
		if !ok || len(fields) != 2 || fields[1] != "kB" {
			continue
		}
		if n, err := strconv.ParseFloat(fields[0], 64); err == nil {
			out[k] = n
		}
	}
	return out
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func ignoreNotFound(err error) error {
	if errors.Is(err, datastore.ErrNotFound) {
		return nil
	}
	return err
}
