package kube_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/kube"
	"github.com/tabbynet/tabby/kube/kubetest"
)

func testConfig(id string) kube.Config {
	cfg := kube.Default()
	cfg.Identity = id
	cfg.LeaseNamespace = "tabby-system"
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 4*time.Second, 3*time.Second, 500*time.Millisecond
	cfg.GCInterval, cfg.GCGrace = 300*time.Millisecond, 2*time.Second
	cfg.Resync = 5 * time.Second
	return cfg
}

func logger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return nil
}

// startControllers runs one replica until the returned stop is called.
func startControllers(t *testing.T, cfg kube.Config, kc kubernetes.Interface, store *datastore.Store) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- kube.RunWith(ctx, cfg, kc, store, logger(t)) }()
	var stopped bool
	var err error
	stop = func() error {
		if !stopped {
			cancel()
			err, stopped = <-done, true
		}
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// eventually is testkit.EventuallyEvery (every 20 ms) for a condition that
// says what it saw when it does not hold yet.
func eventually(t *testing.T, what string, within time.Duration, ok func() (bool, string)) time.Duration {
	t.Helper()
	return testkit.EventuallyEvery(t, within, 20*time.Millisecond, what, func() error {
		if done, last := ok(); !done {
			return errors.New(last)
		}
		return nil
	})
}

func record[T any](store *datastore.Store, key string) (*T, error) {
	kv, err := store.GetKV(context.Background(), key)
	if err != nil {
		return nil, err
	}
	var v T
	return &v, json.Unmarshal(kv.Value, &v)
}

func mustCreate[T any](t *testing.T, what string, fn func() (T, error)) T {
	t.Helper()
	v, err := fn()
	if err != nil {
		t.Fatalf("creating %s: %v", what, err)
	}
	return v
}

func pod(ns, name, node string, lbls map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls,
			Annotations: map[string]string{"cni.projectcalico.org/ipv4pools": `["pool1"]`}},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "default", Containers: []corev1.Container{{
			Name: "c", Image: "none", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
		}}},
	}
}

// endpointFor writes the endpoint (and address) an agent's ADD would.
func endpointFor(t *testing.T, store *datastore.Store, alloc *ipam.Allocator, ns, podName, node string) *api.WorkloadEndpoint {
	t.Helper()
	ctx := context.Background()
	handle := "k8s-pod-network." + ns + "-" + podName
	asg, err := alloc.Assign(ctx, ipam.AssignRequest{Node: node, Handle: handle,
		Attrs: ipam.Attributes{Node: node, Namespace: ns, Pod: podName, ContainerID: ns + "-" + podName, Time: time.Now()}})
	if err != nil {
		t.Fatal(err)
	}
	wep := &api.WorkloadEndpoint{
		Metadata: api.ObjectMeta{Name: node + "-k8s-" + podName + "-eth0", Namespace: ns},
		Spec: api.WorkloadEndpointSpec{Node: node, Orchestrator: "k8s", Pod: podName, ContainerID: ns + "-" + podName,
			Endpoint: "eth0", InterfaceName: "cali0123456789a", IPNetworks: []string{netip.PrefixFrom(asg.Addr, 32).String()}, IPAMHandle: handle},
	}
	out, err := datastore.CreateAs(ctx, store, wep)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestControllersAgainstRealAPIServer(t *testing.T) {
	srv := kubetest.Start(t)
	ctx := context.Background()
	kc := srv.Client
	store := storetest.New(t)
	alloc := ipam.New(store)
	if _, err := store.Create(ctx, &api.IPPool{Metadata: api.ObjectMeta{Name: "pool1"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16"}}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"n1", "n2"} {
		if _, err := store.Create(ctx, &api.Node{Metadata: api.ObjectMeta{Name: n}, Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: "198.18.0.1/24"}}}); err != nil {
			t.Fatal(err)
		}
		mustCreate(t, "node", func() (*corev1.Node, error) {
			return kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{})
		})
	}
	// The controllers run with the manifests' least-privilege RBAC, as
	// their own user.
	kubetest.ApplyControllersRBAC(t, kc, "../manifests/tabby-kube-controllers.yaml")
	ctrlClient := srv.As(t, "controllers")
	stopA := startControllers(t, testConfig("a"), ctrlClient, store)
	outer := t // replica b outlives the subtest that starts it

	mustCreate(t, "namespace", func() (*corev1.Namespace, error) {
		return kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "w14",
			Labels: map[string]string{"team": "red"}}}, metav1.CreateOptions{})
	})
	p1 := mustCreate(t, "pod", func() (*corev1.Pod, error) {
		return kc.CoreV1().Pods("w14").Create(ctx, pod("w14", "web", "n1", map[string]string{"app": "web"}), metav1.CreateOptions{})
	})

	t.Run("pod and namespace records", func(t *testing.T) {
		eventually(t, "pod record", 10*time.Second, func() (bool, string) {
			r, err := record[api.KubePod](store, datastore.KubePodKey("w14", "web"))
			if err != nil {
				return false, err.Error()
			}
			return r.UID == string(p1.UID) && r.Labels["app"] == "web" && r.Node == "n1" && len(r.Ports) == 1 &&
				r.Annotations["cni.projectcalico.org/ipv4pools"] != "", "record " + string(mustJSON(r))
		})
		// Its copy under its node's prefix, which that node's agent watches.
		eventually(t, "pod record under its node", 10*time.Second, func() (bool, string) {
			r, err := record[api.KubePod](store, datastore.KubeNodePodKey("n1", "w14", "web"))
			if err != nil {
				return false, err.Error()
			}
			return r.UID == string(p1.UID) && r.Labels["app"] == "web", "record " + string(mustJSON(r))
		})
		eventually(t, "namespace record", 10*time.Second, func() (bool, string) {
			r, err := record[api.KubeNamespace](store, datastore.KubeNamespaceKey("w14"))
			if err != nil {
				return false, err.Error()
			}
			return r.Labels["team"] == "red", "record " + string(mustJSON(r))
		})
		if _, err := store.GetKV(ctx, datastore.KubeMarkerKey); err != nil {
			t.Errorf("marker: %v", err)
		}
	})

	wep := endpointFor(t, store, alloc, "w14", "web", "n1")
	wepOK := func(want func(w *api.WorkloadEndpoint) bool) func() (bool, string) {
		return func() (bool, string) {
			w, err := datastore.GetAs[*api.WorkloadEndpoint](ctx, store, api.KindWorkloadEndpoint, "w14", wep.Metadata.Name)
			if err != nil {
				return false, err.Error()
			}
			return want(w), string(mustJSON(w))
		}
	}
	t.Run("endpoint follows pod and namespace labels", func(t *testing.T) {
		eventually(t, "endpoint labels, ports, namespace labels", 10*time.Second, wepOK(func(w *api.WorkloadEndpoint) bool {
			return w.Metadata.Labels["app"] == "web" && w.Metadata.Labels[api.LabelServiceAccount] == "default" &&
				len(w.Spec.Ports) == 1 && w.Spec.NamespaceLabels["team"] == "red"
		}))
		p, _ := kc.CoreV1().Pods("w14").Get(ctx, "web", metav1.GetOptions{})
		p.Labels = map[string]string{"app": "db"}
		if _, err := kc.CoreV1().Pods("w14").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		d := eventually(t, "new pod labels", 10*time.Second, wepOK(func(w *api.WorkloadEndpoint) bool { return w.Metadata.Labels["app"] == "db" }))
		t.Logf("pod label change → endpoint: %s", d)
		n, _ := kc.CoreV1().Namespaces().Get(ctx, "w14", metav1.GetOptions{})
		n.Labels["team"] = "blue"
		if _, err := kc.CoreV1().Namespaces().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		d = eventually(t, "new namespace labels", 10*time.Second, wepOK(func(w *api.WorkloadEndpoint) bool { return w.Spec.NamespaceLabels["team"] == "blue" }))
		t.Logf("namespace label change → endpoint: %s", d)
	})

	t.Run("NetworkPolicy", func(t *testing.T) {
		np := &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: "w14", Name: "allow-web"},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
					{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "blue"}}},
					{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}},
				}}},
				Egress: []networkingv1.NetworkPolicyEgressRule{},
			},
		}
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
		start := time.Now()
		if _, err := kc.NetworkingV1().NetworkPolicies("w14").Create(ctx, np, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "translated policy", 10*time.Second, func() (bool, string) {
			p, err := datastore.GetAs[*api.NetworkPolicy](ctx, store, api.KindNetworkPolicy, "w14", "k8s.allow-web")
			if err != nil {
				return false, err.Error()
			}
			return len(p.Spec.Ingress) == 1 && len(p.Spec.Ingress[0].From) == 2 && len(p.Spec.PolicyTypes) == 2 &&
				p.Metadata.Annotations[api.AnnotationOrigin] == api.OriginKubernetes, string(mustJSON(p))
		})
		t.Logf("NetworkPolicy create → etcd: %s", time.Since(start))
		if err := kc.NetworkingV1().NetworkPolicies("w14").Delete(ctx, "allow-web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "translated policy deleted", 10*time.Second, func() (bool, string) {
			_, err := store.Get(ctx, api.KindNetworkPolicy, "w14", "k8s.allow-web")
			return errors.Is(err, datastore.ErrNotFound), errString(err)
		})
	})

	t.Run("nodes", func(t *testing.T) {
		eventually(t, "Tabby node marked", 10*time.Second, func() (bool, string) {
			n, err := datastore.GetAs[*api.Node](ctx, store, api.KindNode, "", "n2")
			if err != nil {
				return false, err.Error()
			}
			return n.Metadata.Annotations[api.AnnotationKubeNode] == "n2", string(mustJSON(n))
		})
		if _, err := store.PutKV(ctx, datastore.NodeStatusKey("n1"), []byte(`{"node":"n1"}`), 0); err != nil {
			t.Fatal(err)
		}
		eventually(t, "NetworkUnavailable cleared on n1", 15*time.Second, func() (bool, string) {
			n, err := kc.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeNetworkUnavailable {
					return c.Status == corev1.ConditionFalse && c.Reason == kube.ReasonTabbyUp, string(mustJSON(c))
				}
			}
			return false, "no condition"
		})
		if err := kc.CoreV1().Nodes().Delete(ctx, "n2", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "Tabby node n2 deleted", 10*time.Second, func() (bool, string) {
			_, err := store.Get(ctx, api.KindNode, "", "n2")
			return errors.Is(err, datastore.ErrNotFound), errString(err)
		})
		if _, err := store.Get(ctx, api.KindNode, "", "n1"); err != nil {
			t.Errorf("node n1: %v", err)
		}
	})

	t.Run("failover loses nothing and releases nothing wrongly", func(t *testing.T) {
		startControllers(outer, testConfig("b"), ctrlClient, store)
		if err := stopA(); err != nil {
			t.Fatalf("replica a: %v", err)
		}
		start := time.Now()
		p, _ := kc.CoreV1().Pods("w14").Get(ctx, "web", metav1.GetOptions{})
		p.Labels = map[string]string{"app": "after-failover"}
		if _, err := kc.CoreV1().Pods("w14").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "replica b applies a label change", 20*time.Second, wepOK(func(w *api.WorkloadEndpoint) bool {
			return w.Metadata.Labels["app"] == "after-failover"
		}))
		t.Logf("failover (a stopped → b applied a change): %s", time.Since(start))
		// Past the grace, the live pod's address is still held.
		time.Sleep(testConfig("x").GCGrace + time.Second)
		if addrs, err := alloc.AddressesByHandle(ctx, wep.Spec.IPAMHandle); err != nil || len(addrs) != 1 {
			t.Errorf("live pod's address: %v, %v", addrs, err)
		}
	})

	t.Run("address GC of a pod deleted without DEL", func(t *testing.T) {
		mustCreate(t, "pod", func() (*corev1.Pod, error) {
			return kc.CoreV1().Pods("w14").Create(ctx, pod("w14", "gone", "n1", nil), metav1.CreateOptions{})
		})
		gone := endpointFor(t, store, alloc, "w14", "gone", "n1")
		if err := kc.CoreV1().Pods("w14").Delete(ctx, "gone", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		eventually(t, "address released", 30*time.Second, func() (bool, string) {
			addrs, err := alloc.AddressesByHandle(ctx, gone.Spec.IPAMHandle)
			return err == nil && len(addrs) == 0, errString(err)
		})
		took := time.Since(start)
		t.Logf("pod deleted → address released: %s (grace %s)", took, testConfig("x").GCGrace)
		if took < testConfig("x").GCGrace {
			t.Errorf("released after %s, before the grace", took)
		}
		if _, err := store.Get(ctx, api.KindWorkloadEndpoint, "w14", gone.Metadata.Name); !errors.Is(err, datastore.ErrNotFound) {
			t.Errorf("orphaned endpoint still there: %v", err)
		}
		if addrs, _ := alloc.AddressesByHandle(ctx, wep.Spec.IPAMHandle); len(addrs) != 1 {
			t.Errorf("the live pod lost its address")
		}
	})
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
