package kube_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/kube"
)

// BenchmarkLoadBalancerAssign: Service created → status.loadBalancer.ingress
// set, with the controllers in process (the manifests' least-privilege
// user) against a real kube-apiserver and etcd. Each iteration creates 200
// type LoadBalancer Services in a namespace of its own, one after the
// other without waiting, and a watch of the test's own times each:
//
//	seen-p50-ms, seen-p99-ms     create → the test's watch sees the Service
//	                             (the reference: what any controller waits
//	                             for before it can act)
//	assign-p50-ms, assign-p99-ms create → the watch sees the ingress address
//	assign/seen-p50              the ratio of the p50s
//
// Quantiles are over the iteration's Services; reported is the median over
// iterations.
//
//	go test -run '^$' -bench LoadBalancerAssign -benchtime 5x ./kube/
func BenchmarkLoadBalancerAssign(b *testing.B) {
	c := newLBCluster(b, map[string]string{"lb": "198.19.0.0/20"})
	ctx, cancel := context.WithCancel(context.Background())
	ran, exited := make(chan error, 1), make(chan error, 1)
	go func() {
		err := kube.RunWith(ctx, testConfig("bench"), c.ctrl, c.store, nil)
		ran <- err
		exited <- err
	}()
	b.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			b.Errorf("controllers: %v", err)
		}
	})
	// Leading and synced before the first Service.
	pollUntil(b, "the controllers lead", time.Minute, exited, func() (bool, error) {
		_, err := c.store.GetKV(ctx, datastore.KubeMarkerKey)
		return err == nil, ignoreNotFound(err)
	})
	const perRound = 200
	var seen50, seen99, asg50, asg99 []float64
	b.ResetTimer()
	for round := range b.N {
		ns := fmt.Sprintf("lbbench-%d", round)
		if _, err := c.kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		w, err := c.kc.CoreV1().Services(ns).Watch(ctx, metav1.ListOptions{})
		if err != nil {
			b.Fatal(err)
		}
		var mu sync.Mutex
		created := map[string]time.Time{}
		seen, assigned := map[string]time.Time{}, map[string]time.Time{}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for ev := range w.ResultChan() {
				s, ok := ev.Object.(*corev1.Service)
				if !ok || ev.Type == watch.Deleted {
					continue
				}
				now := time.Now()
				mu.Lock()
				if _, ok := seen[s.Name]; !ok {
					seen[s.Name] = now
				}
				if _, ok := assigned[s.Name]; !ok && len(s.Status.LoadBalancer.Ingress) > 0 {
					assigned[s.Name] = now
				}
				n := len(assigned)
				mu.Unlock()
				if n == perRound {
					return
				}
			}
		}()
		for i := range perRound {
			name := fmt.Sprintf("svc-%03d", i)
			mu.Lock()
			created[name] = time.Now()
			mu.Unlock()
			if _, err := c.kc.CoreV1().Services(ns).Create(ctx, lbService(ns, name), metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			mu.Lock()
			b.Fatalf("after 2 minutes %d of %d Services have an address", len(assigned), perRound)
		}
		w.Stop()
		var ds, da []time.Duration
		for name, t0 := range created {
			ds = append(ds, seen[name].Sub(t0))
			da = append(da, assigned[name].Sub(t0))
		}
		seen50 = append(seen50, ms(testkit.Quantile(ds, 0.5)))
		seen99 = append(seen99, ms(testkit.Quantile(ds, 0.99)))
		asg50 = append(asg50, ms(testkit.Quantile(da, 0.5)))
		asg99 = append(asg99, ms(testkit.Quantile(da, 0.99)))
		b.StopTimer()
		// Empty the pool for the next round (no namespace controller
		// runs, so the Services go one by one).
		for name := range created {
			if err := c.kc.CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		deadline := time.Now().Add(time.Minute)
		for {
			allocs, err := c.alloc.LBAllocations(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if len(allocs) == 0 {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%d addresses still held a minute after their Services were deleted", len(allocs))
			}
			time.Sleep(50 * time.Millisecond)
		}
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(median(seen50), "seen-p50-ms")
	b.ReportMetric(median(seen99), "seen-p99-ms")
	b.ReportMetric(median(asg50), "assign-p50-ms")
	b.ReportMetric(median(asg99), "assign-p99-ms")
	b.ReportMetric(median(asg50)/median(seen50), "assign/seen-p50")
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
