package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/kube"
	"github.com/tabbynet/tabby/kube/kubetest"
	"github.com/tabbynet/tabby/lab"
)

// The Kubernetes lab: short graces so that the GC paths finish in seconds.
const (
	kubeLabName = "k14a"
	// kubeNodeGCGrace is the agents' --node-gc-grace.
	kubeNodeGCGrace = 3 * time.Second
	// kubeAddrGCGrace and kubeAddrGCInterval are the controllers'
	// --gc-grace and --gc-interval.
	kubeAddrGCGrace    = 3 * time.Second
	kubeAddrGCInterval = 500 * time.Millisecond
	// kubePolicySamples: how many block/allow rounds the latency is
	// measured over, through the API server and, as the same run's
	// reference, by writing the Tabby policy to etcd directly.
	kubePolicySamples = 8
	// kubeDeadline bounds every wait for traffic to change: generous, the
	// figures are logged, not asserted.
	kubeDeadline = 30 * time.Second
)

// kubeLab is a lab whose pods are Kubernetes pods: each is created through
// the API server with spec.nodeName (there is no kubelet), and then gets
// its network from a real CNI ADD on that node with the Kubernetes CNI_ARGS,
// so that its agent reads the pod record tabby-kube-controllers wrote.
type kubeLab struct {
	l     *lab.Lab
	kc    kubernetes.Interface
	store *datastore.Store
}

// TestKubernetes runs a 3-node lab, a real kube-apiserver and
// tabby-kube-controllers (the binary, as a process) on the lab's etcd, and
// shows with real TCP connections between lab pods that Kubernetes objects
// written through client-go move packets: a NetworkPolicy blocks and then
// allows (write → effect latency logged), pod and namespace labels move a
// pod in and out of a policy, a pod deleted without DEL gets its address
// back after the controllers' grace, and a deleted Node's blocks are
// released.
func TestKubernetes(t *testing.T) {
	testkit.RequirePrivileged(t, "ip", "nsenter", "ping")
	srv := kubetest.Start(t) // skips, saying how to build it, without the binary
	l := upLab(t, lab.Options{Name: kubeLabName, Nodes: 3,
		AgentArgs: []string{"--node-gc-grace", kubeNodeGCGrace.String(), "--resync-interval", "3s"}})
	k := &kubeLab{l: l, kc: srv.Client, store: l.Store()}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// The controllers run as their own user with the manifests' RBAC.
	kubetest.ApplyControllersRBAC(t, srv.Client, "../manifests/tabby-kube-controllers.yaml")
	for _, ns := range []string{"k14-srv", "k14-cli"} {
		k.createNamespace(ctx, t, ns)
	}
	for _, n := range l.State().Nodes {
		if _, err := k.kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating Kubernetes node %s: %v", n.Name, err)
		}
	}
	startKubeControllers(t, l, srv)
	testkit.EventuallyEvery(t, kubeDeadline, 100*time.Millisecond, "the controllers' marker and every Tabby node marked as a Kubernetes node", func() error {
		if _, err := k.store.GetKV(ctx, datastore.KubeMarkerKey); err != nil {
			return fmt.Errorf("marker: %w", err)
		}
		for _, n := range l.State().Nodes {
			tn, err := datastore.GetAs[*api.Node](ctx, k.store, api.KindNode, "", n.Name)
			if err != nil {
				return err
			}
			if tn.Metadata.Annotations[api.AnnotationKubeNode] != n.Name {
				return fmt.Errorf("node %s not marked", n.Name)
			}
		}
		return nil
	})

	web := k.addPod(ctx, t, "k14-srv", "web", "node2", map[string]string{"app": "web"})
	k.addPod(ctx, t, "k14-cli", "cli", "node1", map[string]string{"app": "client"})
	startPolicyServer(t, l, "web", "web", []int{8080}, nil)
	w := startConnWatch(t, l, "cli", netip.AddrPortFrom(web, 8080))
	if _, err := w.await(time.Now(), true, kubeDeadline); err != nil {
		t.Fatalf("cli -> web:8080 before any policy: %v", err)
	}

	t.Run("NetworkPolicyLatency", func(t *testing.T) { k.testPolicyLatency(ctx, t, w) })
	t.Run("PodAndNamespaceLabels", func(t *testing.T) { k.testLabels(ctx, t, w) })
	t.Run("AddressGC", func(t *testing.T) { k.testAddressGC(ctx, t) })
	t.Run("NodeDeleted", func(t *testing.T) { k.testNodeDeleted(ctx, t) })

	// Both GCs left IPAM consistent: no leak, no orphan handle.
	rep, err := ipam.New(k.store, ipam.WithLeakGrace(0)).Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Errorf("ipam check: leaks %v, orphan handles %v, inconsistencies %v", rep.Leaks, rep.OrphanHandles, rep.Inconsistencies)
	}
}

// startKubeControllers runs bin/tabby-kube-controllers against the API
// server (as kubetest.ControllersUser, whom the manifests' least-privilege
// RBAC must allow everything it does) and the lab's etcd, until the test
// ends.
func startKubeControllers(t *testing.T, l *lab.Lab, srv *kubetest.APIServer) {
	t.Helper()
	bin := filepath.Join(l.State().BinDir, "tabby-kube-controllers")
	if _, err := os.Stat(bin); err != nil {
		bin = filepath.Join(t.TempDir(), "tabby-kube-controllers")
		out, err := exec.Command("go", "build", "-o", bin, "github.com/tabbynet/tabby/cmd/tabby-kube-controllers").CombinedOutput()
		if err != nil {
			t.Fatalf("building tabby-kube-controllers (or run `make build` and set TABBY_BIN): %v\n%s", err, out)
		}
	}
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster: {server: %q, insecure-skip-tls-verify: true}
users:
- name: controllers
  user: {token: %q}
contexts:
- name: lab
  context: {cluster: lab, user: controllers}
current-context: lab
`, srv.URL, srv.Tokens["controllers"])
	if err := os.WriteFile(kubeconfig, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var eps []string
	for _, m := range l.State().Etcd {
		eps = append(eps, "unix://"+l.EtcdSocket(m.Name))
	}
	cmd := exec.Command(bin, "--kubeconfig", kubeconfig, "--etcd-endpoints", strings.Join(eps, ","),
		"--lease-namespace", "tabby-system", "--identity", kubeLabName,
		"--gc-grace", kubeAddrGCGrace.String(), "--gc-interval", kubeAddrGCInterval.String())
	kubetest.StartDaemon(t, "tabby-kube-controllers", cmd, filepath.Join(dir, "tabby-kube-controllers.log"), func(err error, termed bool) {
		switch {
		case !termed:
			t.Errorf("tabby-kube-controllers did not stop within 10 s of SIGTERM")
		case err != nil:
			t.Errorf("tabby-kube-controllers exited: %v", err)
		}
	})
}

func (k *kubeLab) createNamespace(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	if _, err := k.kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
}

// addPod creates the pod in Kubernetes on node, waits for its record in
// etcd (the agent waits 2 s for it at ADD, not more) and adds it in the
// lab with a real CNI ADD. It returns the pod's address.
func (k *kubeLab) addPod(ctx context.Context, t *testing.T, ns, name, node string, lbls map[string]string) netip.Addr {
	t.Helper()
	p, err := k.kc.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "none",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s/%s: %v", ns, name, err)
	}
	testkit.EventuallyEvery(t, kubeDeadline, 100*time.Millisecond, "the record of pod "+ns+"/"+name, func() error {
		kv, err := k.store.GetKV(ctx, datastore.KubePodKey(ns, name))
		if err != nil {
			return err
		}
		var r api.KubePod
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			return err
		}
		if r.UID != string(p.UID) {
			return fmt.Errorf("record of uid %s, want %s", r.UID, p.UID)
		}
		return nil
	})
	ps, err := k.l.AddPod(ctx, node, name, lab.PodOptions{Namespace: ns})
	if err != nil {
		t.Fatalf("CNI ADD of pod %s/%s: %v", ns, name, err)
	}
	// The endpoint carries the Kubernetes labels, taken from the record.
	w := k.endpointOf(ctx, t, ns, name)
	if w == nil {
		t.Fatalf("pod %s/%s has no endpoint after ADD", ns, name)
	}
	for key, v := range lbls {
		if w.Metadata.Labels[key] != v {
			t.Errorf("endpoint of %s/%s: labels %v, want %v from Kubernetes", ns, name, w.Metadata.Labels, lbls)
		}
	}
	return ps.IPs[0].Addr()
}

// endpointOf returns the pod's endpoint in etcd, nil when it has none.
func (k *kubeLab) endpointOf(ctx context.Context, t *testing.T, ns, pod string) *api.WorkloadEndpoint {
	t.Helper()
	objs, _, err := k.store.List(ctx, api.KindWorkloadEndpoint, ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if w, ok := o.(*api.WorkloadEndpoint); ok && w.Spec.Pod == pod {
			return w
		}
	}
	return nil
}

// transition waits for the watched connections to become allowed or
// dropped after since, failing the test when they do not in time.
func transition(t *testing.T, w *connWatch, what string, since time.Time, allowed bool) time.Duration {
	t.Helper()
	d, err := w.await(since, allowed, kubeDeadline)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return d
}

// gatePolicy isolates the web pod for ingress; allow adds a rule letting
// the k14-cli namespace's clients in on port 8080.
func gatePolicy(allow bool) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "k14-srv", Name: "gate"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}
	if allow {
		port := intstr.FromInt32(8080)
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "k14-cli"}},
				PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}},
			}},
			Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
		}}
	}
	return np
}

// The same gate as a Tabby policy written to etcd directly: the reference
// (the agents' share of the latency, without the API server and the
// controllers).
func directGatePolicy(allow bool) *api.NetworkPolicy {
	p := &api.NetworkPolicy{Metadata: api.ObjectMeta{Namespace: "k14-srv", Name: "direct-gate"}, Spec: api.NetworkPolicySpec{
		PodSelector: *labels("app", "web"), PolicyTypes: []api.PolicyType{api.PolicyTypeIngress},
	}}
	if allow {
		p.Spec.Ingress = []api.NetworkPolicyIngressRule{{
			From:  []api.NetworkPolicyPeer{{NamespaceSelector: nsName("k14-cli"), PodSelector: labels("app", "client")}},
			Ports: []api.NetworkPolicyPort{{Protocol: strp("TCP"), Port: &api.IntOrString{IntVal: 8080}}},
		}}
	}
	return p
}

func (k *kubeLab) testPolicyLatency(ctx context.Context, t *testing.T, w *connWatch) {
	nps := k.kc.NetworkingV1().NetworkPolicies("k14-srv")
	var block, allow, refBlock, refAllow []time.Duration
	for i := range kubePolicySamples {
		// Through Kubernetes: create (blocks), update (allows), delete.
		start := time.Now()
		if _, err := nps.Create(ctx, gatePolicy(false), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		block = append(block, transition(t, w, "NetworkPolicy created: cli -> web dropped", start, false))
		cur, err := nps.Get(ctx, "gate", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		upd := gatePolicy(true)
		upd.ResourceVersion = cur.ResourceVersion
		start = time.Now()
		if _, err := nps.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		allow = append(allow, transition(t, w, "NetworkPolicy updated: cli -> web allowed", start, true))
		if err := nps.Delete(ctx, "gate", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testkit.EventuallyEvery(t, kubeDeadline, 100*time.Millisecond, "the translated policy deleted", func() error {
			_, err := k.store.Get(ctx, api.KindNetworkPolicy, "k14-srv", kube.PolicyName("gate"))
			if errors.Is(err, datastore.ErrNotFound) {
				return nil
			}
			return fmt.Errorf("still there (%v)", err)
		})

		// The reference: the same policy written to etcd.
		start = time.Now()
		if _, err := k.store.Apply(ctx, directGatePolicy(false)); err != nil {
			t.Fatal(err)
		}
		refBlock = append(refBlock, transition(t, w, "Tabby policy created: cli -> web dropped", start, false))
		start = time.Now()
		if _, err := k.store.Apply(ctx, directGatePolicy(true)); err != nil {
			t.Fatal(err)
		}
		refAllow = append(refAllow, transition(t, w, "Tabby policy updated: cli -> web allowed", start, true))
		if err := k.store.Delete(ctx, api.KindNetworkPolicy, "k14-srv", "direct-gate", ""); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: Kubernetes block %v allow %v; etcd block %v allow %v", i+1,
			block[i].Round(time.Millisecond), allow[i].Round(time.Millisecond),
			refBlock[i].Round(time.Millisecond), refAllow[i].Round(time.Millisecond))
	}
	// With no policy left, traffic flows.
	transition(t, w, "no policy: cli -> web allowed", time.Now(), true)
	pct := func(ds []time.Duration) string {
		return fmt.Sprintf("p50 %v p99 %v", testkit.Quantile(ds, 0.5).Round(time.Millisecond), testkit.Quantile(ds, 0.99).Round(time.Millisecond))
	}
	t.Logf("NetworkPolicy API write → packets dropped (n=%d): %s; reference, Tabby policy written to etcd: %s",
		len(block), pct(block), pct(refBlock))
	t.Logf("NetworkPolicy API write → packets allowed (n=%d): %s; reference, Tabby policy written to etcd: %s",
		len(allow), pct(allow), pct(refAllow))
}

// testLabels moves pods in and out of policies by their own labels and by
// their namespace's labels.
func (k *kubeLab) testLabels(ctx context.Context, t *testing.T, w *connWatch) {
	nps := k.kc.NetworkingV1().NetworkPolicies("k14-srv")
	// Pods labelled locked=true take no ingress at all.
	lock := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "k14-srv", Name: "lock"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"locked": "true"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}
	if _, err := nps.Create(ctx, lock, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.EventuallyEvery(t, kubeDeadline, 100*time.Millisecond, "policy lock in etcd", func() error {
		_, err := k.store.Get(ctx, api.KindNetworkPolicy, "k14-srv", kube.PolicyName("lock"))
		return err
	})
	// It selects no pod yet.
	transition(t, w, "lock selects nothing: cli -> web allowed", time.Now(), true)

	patchLabels := func(what string, patch func(p []byte) error, labels map[string]any) time.Time {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
		start := time.Now()
		if err := patch(b); err != nil {
			t.Fatalf("patching %s: %v", what, err)
		}
		return start
	}
	podLabels := func(ns, name string, labels map[string]any) time.Time {
		return patchLabels("pod "+ns+"/"+name, func(b []byte) error {
			_, err := k.kc.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, b, metav1.PatchOptions{})
			return err
		}, labels)
	}
	nsLabels := func(ns string, labels map[string]any) time.Time {
		return patchLabels("namespace "+ns, func(b []byte) error {
			_, err := k.kc.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, b, metav1.PatchOptions{})
			return err
		}, labels)
	}

	// The server's own labels move it into the policy and out again.
	d := transition(t, w, "web labelled locked: cli -> web dropped", podLabels("k14-srv", "web", map[string]any{"locked": "true"}), false)
	t.Logf("pod label added → pod in the policy, packets dropped: %v", d.Round(time.Millisecond))
	d = transition(t, w, "web unlabelled: cli -> web allowed", podLabels("k14-srv", "web", map[string]any{"locked": nil}), true)
	t.Logf("pod label removed → pod out of the policy, packets allowed: %v", d.Round(time.Millisecond))

	// The client's labels and its namespace's labels move it into an
	// allow rule: web isolated, open to role=trusted pods of team=blue
	// namespaces.
	trusted := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "k14-srv", Name: "trusted"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "blue"}},
				PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"role": "trusted"}},
			}}}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}
	start := time.Now()
	if _, err := nps.Create(ctx, trusted, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	transition(t, w, "web isolated, cli neither trusted nor blue: dropped", start, false)
	// Half the peer (a trusted pod, its namespace not blue) stays out.
	podLabels("k14-cli", "cli", map[string]any{"role": "trusted"})
	testkit.EventuallyEvery(t, kubeDeadline, 100*time.Millisecond, "the endpoint of cli labelled role=trusted", func() error {
		if w := k.endpointOf(ctx, t, "k14-cli", "cli"); w == nil || w.Metadata.Labels["role"] != "trusted" {
			return errors.New("not yet")
		}
		return nil
	})
	if err := w.staysDropped(time.Now(), time.Second); err != nil {
		t.Errorf("cli trusted, its namespace not blue: %v", err)
	}
	d = transition(t, w, "namespace k14-cli labelled team=blue: allowed", nsLabels("k14-cli", map[string]any{"team": "blue"}), true)
	t.Logf("namespace label added → peer in the rule, packets allowed: %v", d.Round(time.Millisecond))
	d = transition(t, w, "namespace k14-cli unlabelled: dropped", nsLabels("k14-cli", map[string]any{"team": nil}), false)
	t.Logf("namespace label removed → peer out of the rule, packets dropped: %v", d.Round(time.Millisecond))
	nsLabels("k14-cli", map[string]any{"team": "blue"})
	transition(t, w, "namespace labelled again: allowed", time.Now(), true)
	d = transition(t, w, "cli no longer trusted: dropped", podLabels("k14-cli", "cli", map[string]any{"role": nil}), false)
	t.Logf("peer pod label removed → peer out of the rule, packets dropped: %v", d.Round(time.Millisecond))

	for _, name := range []string{"lock", "trusted"} {
		if err := nps.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	transition(t, w, "policies deleted: allowed", time.Now(), true)
}

// testAddressGC deletes a pod in Kubernetes and never runs its CNI DEL:
// the controllers release its address and endpoint after their grace, and
// the DEL that finally comes is still a success.
func (k *kubeLab) testAddressGC(ctx context.Context, t *testing.T) {
	addr := k.addPod(ctx, t, "k14-cli", "lost", "node3", nil)
	al := ipam.New(k.store)
	if a, held, err := al.Lookup(ctx, addr); err != nil || !held || a.Pod != "lost" {
		t.Fatalf("address %s of pod lost: held %v by %+v (%v)", addr, held, a, err)
	}
	start := time.Now()
	if err := k.kc.CoreV1().Pods("k14-cli").Delete(ctx, "lost", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	testkit.EventuallyEvery(t, kubeAddrGCGrace+kubeDeadline, 100*time.Millisecond, "the address of the deleted pod released", func() error {
		a, held, err := al.Lookup(ctx, addr)
		switch {
		case err != nil:
			return err
		case held:
			return fmt.Errorf("%s still held by %s/%s", addr, a.Namespace, a.Pod)
		}
		return nil
	})
	took := time.Since(start)
	t.Logf("pod deleted in Kubernetes without DEL → address released: %v (grace %v, GC every %v)",
		took.Round(time.Millisecond), kubeAddrGCGrace, kubeAddrGCInterval)
	if took < kubeAddrGCGrace {
		t.Errorf("released after %v, before the grace of %v", took, kubeAddrGCGrace)
	}
	if w := k.endpointOf(ctx, t, "k14-cli", "lost"); w != nil {
		t.Errorf("the endpoint of the deleted pod is still there: %s", w.Metadata.Name)
	}
	// The live pods keep theirs.
	for _, p := range []struct{ ns, name string }{{"k14-srv", "web"}, {"k14-cli", "cli"}} {
		if w := k.endpointOf(ctx, t, p.ns, p.name); w == nil {
			t.Errorf("live pod %s/%s lost its endpoint", p.ns, p.name)
		} else if a, held, err := al.Lookup(ctx, netip.MustParsePrefix(w.Spec.IPNetworks[0]).Addr()); err != nil || !held || a.Pod != p.name {
			t.Errorf("live pod %s/%s lost its address: held %v by %+v (%v)", p.ns, p.name, held, a, err)
		}
	}
	if err := k.l.DelPod(ctx, "lost"); err != nil {
		t.Errorf("the late CNI DEL of a pod whose address GC released: %v", err)
	}
}

// testNodeDeleted stops node3's agent (the machine is gone) and deletes its
// Kubernetes Node: the controllers delete the Tabby Node, the other agents'
// node GC releases its blocks and addresses after --node-gc-grace, and its
// block's route leaves the other nodes.
func (k *kubeLab) testNodeDeleted(ctx context.Context, t *testing.T) {
	addr := k.addPod(ctx, t, "k14-cli", "onnode3", "node3", nil)
	al := ipam.New(k.store)
	a, held, err := al.Lookup(ctx, addr)
	if err != nil || !held {
		t.Fatalf("address %s of pod onnode3: held %v (%v)", addr, held, err)
	}
	block := a.Block
	if err := k.l.WaitRoutes(ctx); err != nil {
		t.Fatal(err)
	}
	if !nodeHasRouteTo(ctx, t, k.l, "node1", block) {
		t.Fatalf("node1 has no route to node3's block %s", block)
	}
	if err := k.l.StopAgent(ctx, "node3", syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := k.kc.CoreV1().Nodes().Delete(ctx, "node3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.EventuallyEvery(t, kubeDeadline, 100*time.Millisecond, "the Tabby node node3 deleted", func() error {
		_, err := k.store.Get(ctx, api.KindNode, "", "node3")
		if errors.Is(err, datastore.ErrNotFound) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
	tabbyGone := time.Since(start)
	testkit.EventuallyEvery(t, kubeNodeGCGrace+kubeDeadline, 100*time.Millisecond, "node3's blocks and addresses released", func() error {
		blocks, err := al.Blocks(ctx)
		if err != nil {
			return err
		}
		for _, b := range blocks {
			if b.Affinity == "node3" {
				return fmt.Errorf("block %s still affine to node3", b.CIDR)
			}
		}
		allocs, err := al.Allocations(ctx)
		if err != nil {
			return err
		}
		for _, x := range allocs {
			if x.Node == "node3" {
				return fmt.Errorf("%s still allocated to %s on node3", x.Addr, x.Pod)
			}
		}
		return nil
	})
	released := time.Since(start)
	if released < kubeNodeGCGrace {
		t.Errorf("node3 released %v after its Node was deleted, before the grace of %v", released, kubeNodeGCGrace)
	}
	testkit.EventuallyEvery(t, kubeDeadline, 100*time.Millisecond, "node1's route to node3's block withdrawn", func() error {
		if nodeHasRouteTo(ctx, t, k.l, "node1", block) {
			return fmt.Errorf("node1 still routes %s", block)
		}
		return nil
	})
	t.Logf("Kubernetes Node deleted → Tabby node deleted %v, blocks released %v (node GC grace %v)",
		tabbyGone.Round(time.Millisecond), released.Round(time.Millisecond), kubeNodeGCGrace)
	// The other nodes carry on.
	for _, n := range []string{"node1", "node2"} {
		if _, err := k.store.Get(ctx, api.KindNode, "", n); err != nil {
			t.Errorf("node %s: %v", n, err)
		}
	}
	if w := k.endpointOf(ctx, t, "k14-srv", "web"); w == nil {
		t.Error("pod web on node2 lost its endpoint")
	}
}

// nodeHasRouteTo reports whether node's kernel has a route for prefix.
func nodeHasRouteTo(ctx context.Context, t *testing.T, l *lab.Lab, node string, prefix netip.Prefix) bool {
	t.Helper()
	out, err := l.Exec(ctx, node, "ip", "-4", "route", "show", "exact", prefix.String())
	if err != nil {
		t.Fatalf("routes of %s: %v", node, err)
	}
	return strings.TrimSpace(string(out)) != ""
}
