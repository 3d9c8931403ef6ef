package lab

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/kube/kubetest"
)

// daemonSetNodes is how many kubelet nodes TestPrivilegedDaemonSet runs.
const daemonSetNodes = 3

// TestPrivilegedDaemonSet: Tabby deployed as manifests/README.md tells an
// operator, on three lab nodes sharing one control plane (kube-apiserver,
// kube-controller-manager, kube-scheduler). Each node runs containerd and a
// kubelet; the images are imported with `ctr -n k8s.io images import`; the
// README's plain-HTTP variant is applied with kubectl (empty Secret, the
// etcd endpoint set with the README's sed, the TLS file keys emptied).
// The DaemonSet's install-cni writes the conflist and the plugin into each
// node's CNI directories, the agents come up Ready, every node reports
// Ready (NetworkReady), and a pod per node gets an address from Tabby's
// pool that the other nodes reach.
func TestPrivilegedDaemonSet(t *testing.T) {
	skipUnlessRoot(t)
	bins := kubetest.Require(t, "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")
	binDir := os.Getenv("TABBY_BIN")
	if binDir == "" {
		t.Skip("TABBY_BIN is not set: run `make images` and set TABBY_BIN=$PWD/bin")
	}
	archives := []string{filepath.Join(binDir, "images", "pause.oci.tar"), filepath.Join(binDir, "images", "tabby.oci.tar")}
	for _, a := range archives {
		if _, err := os.Stat(a); err != nil {
			t.Skipf("image archive missing (%v): run `make images`", err)
		}
	}
	for _, b := range []string{"containerd", "ctr", "unshare", "findmnt", "kubectl"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s not installed (apt-get install containerd util-linux kubectl): %v", b, err)
		}
	}
	if _, err := os.Stat(filepath.Join(cniPluginDir, "loopback")); err != nil {
		t.Skipf("containerd's CRI needs the loopback plugin (apt-get install containernetworking-plugins): %v", err)
	}
	if _, err := cgroupHierarchies(); err != nil {
		t.Skipf("cgroups: %v", err)
	}
	var nodes []string
	for i := 1; i <= daemonSetNodes; i++ {
		nodes = append(nodes, nodeName(i))
	}
	hostPathsBefore := map[string]error{}
	for _, p := range daemonSetHostPaths {
		_, hostPathsBefore[p] = os.Stat(p)
	}
	podNetnsBefore := podNetns(t)

	api := kubetest.StartWith(t, kubetest.Options{Nodes: nodes})
	work := t.TempDir()
	kubeconfigPath := filepath.Join(work, "admin.kubeconfig")
	if err := os.WriteFile(kubeconfigPath, []byte(kubeconfig(api.URL, api.Tokens["admin"])), 0o600); err != nil {
		t.Fatal(err)
	}
	// The control plane's controllers: DaemonSets, Deployments and their
	// ReplicaSets, garbage collection, and node lifecycle, which lifts the
	// not-ready taint a node registers with once it is Ready (the
	// DaemonSet tolerates it, other pods wait); the scheduler places the
	// pods.
	kcm := exec.Command(bins["kube-controller-manager"], "--kubeconfig="+kubeconfigPath, "--leader-elect=false", "--secure-port=0",
		"--controllers=daemonset-controller,deployment-controller,replicaset-controller,garbage-collector-controller,namespace-controller,node-lifecycle-controller",
		"--allocate-node-cidrs=false", "--v=1")
	kcmExited := kubetest.StartDaemon(t, "kube-controller-manager", kcm, filepath.Join(work, "kube-controller-manager.log"), nil)
	sched := exec.Command(bins["kube-scheduler"], "--kubeconfig="+kubeconfigPath, "--leader-elect=false", "--secure-port=0", "--v=1")
	schedExited := kubetest.StartDaemon(t, "kube-scheduler", sched, filepath.Join(work, "kube-scheduler.log"), nil)

	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	name, runDir := "k15b"+hex.EncodeToString(b[:]), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var log bytes.Buffer
	l, err := Up(ctx, Options{Name: name, Nodes: daemonSetNodes, RunDir: runDir, BinDir: binDir, NoAgents: true, Log: &log})
	if err != nil {
		t.Fatalf("Up: %v\n%s", err, log.String())
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range nodes {
				for _, f := range []string{"containerd/containerd.log", "kubelet/kubelet.log"} {
					b, _ := os.ReadFile(filepath.Join(runDir, name, n, f))
					if len(b) > 4000 {
						b = b[len(b)-4000:]
					}
					t.Logf("%s/%s (tail):\n%s", n, f, b)
				}
			}
		}
		if err := l.Down(); err != nil {
			t.Errorf("cleanup Down: %v", err)
		}
		for _, p := range daemonSetHostPaths {
			if _, err := os.Stat(p); err == nil && errors.Is(hostPathsBefore[p], os.ErrNotExist) {
				t.Errorf("the lab made the host's %s", p)
			}
		}
		for _, ns := range podNetns(t) {
			if !slices.Contains(podNetnsBefore, ns) {
				t.Errorf("pod network namespace %s left after Down", ns)
			}
		}
	})
	for _, n := range nodes {
		ln, err := ListenIn(l.State().node(n).NetNS, "127.0.0.1:6443")
		if err != nil {
			t.Fatal(err)
		}
		proxied := make(chan error, 1)
		go func() { proxied <- Proxy(ln, strings.TrimPrefix(api.URL, "https://")) }()
		t.Cleanup(func() {
			ln.Close()
			if err := <-proxied; err != nil {
				t.Errorf("proxy: %v", err)
			}
		})
		// An operator's node has no CNI configuration before Tabby's
		// install-cni writes one; the lab wrote one for its own agents.
		if err := os.Remove(l.conflistPath(n)); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		if err := l.StartContainerd(ctx, n); err != nil {
			t.Fatalf("StartContainerd %s: %v\n%s", n, err, log.String())
		}
		// manifests/README.md, "Build the image": ctr -n k8s.io images import.
		if err := l.ImportImages(ctx, n, archives...); err != nil {
			t.Fatal(err)
		}
		if err := l.StartKubelet(ctx, n, bins["kubelet"], KubeletOptions{Server: "https://127.0.0.1:6443", Token: api.Tokens["node:"+n]}); err != nil {
			t.Fatalf("StartKubelet %s: %v\n%s", n, err, log.String())
		}
	}
	err = poll(ctx, 200*time.Millisecond, func() (bool, error) {
		list, err := api.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) == daemonSetNodes, nil
	})
	if err != nil {
		t.Fatalf("%d nodes not registered: %v", daemonSetNodes, err)
	}
	for _, n := range nodes {
		if ready, msg := nodeReady(ctx, t, api, n); ready {
			t.Errorf("%s Ready before Tabby is deployed: %s", n, msg)
		}
	}

	// manifests/README.md, "Configure", plain HTTP; then "Apply and check".
	manifest, err := os.ReadFile(filepath.Join("..", "..", "manifests", "tabby-etcd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	applied := filepath.Join(work, "tabby-etcd.yaml")
	if err := os.WriteFile(applied, plainHTTPManifest(t, manifest, strings.Join(l.State().EtcdEndpoints(), ",")), 0o644); err != nil {
		t.Fatal(err)
	}
	kubectl := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, "kubectl", append([]string{"--kubeconfig", kubeconfigPath}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	kubectl("create", "namespace", "tabby-system")
	kubectl("-n", "tabby-system", "create", "secret", "generic", "tabby-etcd-secrets")
	applyStart := time.Now()
	t.Log(kubectl("apply", "-f", applied))
	rctx, rcancel := context.WithTimeout(ctx, 4*time.Minute)
	defer rcancel()
	err = poll(rctx, 500*time.Millisecond, func() (bool, error) {
		select {
		case err := <-kcmExited:
			return false, fmt.Errorf("kube-controller-manager exited: %v", err)
		case err := <-schedExited:
			return false, fmt.Errorf("kube-scheduler exited: %v", err)
		default:
		}
		ds, err := api.Client.AppsV1().DaemonSets("tabby-system").Get(ctx, "tabby-node", metav1.GetOptions{})
		return err == nil && ds.Status.DesiredNumberScheduled == daemonSetNodes && ds.Status.NumberReady == daemonSetNodes, nil
	})
	if err != nil {
		pods, _ := api.Client.CoreV1().Pods("tabby-system").List(ctx, metav1.ListOptions{})
		for _, p := range pods.Items {
			t.Logf("pod %s on %s: %s %+v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.ContainerStatuses)
			out, _ := exec.Command("kubectl", "--kubeconfig", kubeconfigPath, "-n", "tabby-system", "logs", "--all-containers", p.Name).CombinedOutput()
			if len(out) > 3000 {
				out = out[len(out)-3000:]
			}
			t.Logf("logs of %s:\n%s", p.Name, out)
		}
		t.Fatalf("DaemonSet tabby-node not ready on %d nodes: %v", daemonSetNodes, err)
	}
	t.Logf("DaemonSet tabby-node ready on %d nodes %v after kubectl apply", daemonSetNodes, time.Since(applyStart).Round(time.Millisecond))

	for _, n := range nodes {
		// install-cni wrote the plugin and the conflist into the node's
		// directories (the lab put neither there: no lab agents).
		if _, err := os.Stat(filepath.Join(l.nodeCNIBinDir(n), binCNI)); err != nil {
			t.Errorf("%s: install-cni did not write the plugin: %v", n, err)
		} else if fi, _ := os.Lstat(filepath.Join(l.nodeCNIBinDir(n), binCNI)); fi.Mode()&os.ModeSymlink != 0 {
			t.Errorf("%s: %s is the lab's link, not install-cni's copy", n, binCNI)
		}
		if b, err := os.ReadFile(l.conflistPath(n)); err != nil || !strings.Contains(string(b), "/var/run/tabby/cni.sock") {
			t.Errorf("%s: install-cni's conflist: %v\n%s", n, err, b)
		}
		if _, err := os.Stat(filepath.Join(l.NodeHostDir(n, "/var/run/tabby"), "cni.sock")); err != nil {
			t.Errorf("%s: the agent's CNI socket is not in the node's /var/run/tabby: %v", n, err)
		}
	}
	err = poll(rctx, 500*time.Millisecond, func() (bool, error) {
		for _, n := range nodes {
			if ready, _ := nodeReady(ctx, t, api, n); !ready {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		for _, n := range nodes {
			_, msg := nodeReady(ctx, t, api, n)
			t.Logf("%s: %s", n, msg)
		}
		t.Fatalf("nodes not Ready with Tabby deployed: %v", err)
	}

	// Workloads through Kubernetes only: a Deployment spread over the
	// nodes, pods on the pause image; addresses from Tabby's pool; every
	// pod reaches a pod on each other node.
	deployment := filepath.Join(work, "web.yaml")
	if err := os.WriteFile(deployment, []byte(webDeployment), 0o644); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	kubectl("apply", "-f", deployment)
	var pods []corev1.Pod
	err = poll(rctx, 250*time.Millisecond, func() (bool, error) {
		list, err := api.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return false, nil
		}
		pods = pods[:0]
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				pods = append(pods, p)
			}
		}
		return len(pods) == webReplicas, nil
	})
	if err != nil {
		t.Fatalf("%d of %d web pods Running with an address: %v\n%s\n%s", len(pods), webReplicas, err, kubectl("get", "pods", "-o", "wide"),
			kubectl("get", "pods", "-o", "jsonpath={range .items[*]}{.metadata.name}: {.status.conditions}{\"\\n\"}{end}"))
	}
	t.Logf("%d web pods Running with addresses %v after kubectl apply", webReplicas, time.Since(created).Round(time.Millisecond))
	byNode := map[string][]netip.Addr{}
	for _, p := range pods {
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil || !netip.MustParsePrefix(PodPool).Contains(ip) {
			t.Errorf("pod %s address %q is not from Tabby's pool %s", p.Name, p.Status.PodIP, PodPool)
			continue
		}
		byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], ip)
	}
	if len(byNode) != daemonSetNodes {
		t.Errorf("web pods on %d nodes, want %d: %v", len(byNode), daemonSetNodes, byNode)
	}
	netnsOf := podNetnsByAddr(t)
	var failed, tried int
	for _, from := range nodes {
		for _, to := range nodes {
			if from == to || len(byNode[from]) == 0 || len(byNode[to]) == 0 {
				continue
			}
			src, dst := byNode[from][0], byNode[to][0]
			ns, ok := netnsOf[src]
			if !ok {
				t.Errorf("no pod network namespace holds %s", src)
				continue
			}
			tried++
			out, err := exec.CommandContext(ctx, "nsenter", "--net="+filepath.Join(netnsDir, ns), "--", "ping", "-c", "1", "-W", "3", dst.String()).CombinedOutput()
			if err != nil {
				failed++
				t.Errorf("pod %s on %s → pod %s on %s: %v\n%s", src, from, dst, to, err, out)
			}
		}
	}
	t.Logf("ping matrix: %d of %d pod pairs across nodes answered", tried-failed, tried)

	// kubectl delete pod: the agent of its node releases the address (the
	// CNI DEL removes the pod's route); the ReplicaSet's new pod gets one.
	var victim corev1.Pod
	for _, p := range pods {
		if p.Spec.NodeName == "node1" {
			victim = p
		}
	}
	if victim.Name == "" {
		t.Fatal("no web pod on node1")
	}
	kubectl("delete", "pod", victim.Name, "--wait=true")
	err = poll(rctx, 100*time.Millisecond, func() (bool, error) {
		out, err := l.Exec(ctx, "node1", "ip", "route", "show", victim.Status.PodIP+"/32")
		return err == nil && strings.TrimSpace(string(out)) == "", nil
	})
	if err != nil {
		t.Errorf("the route to %s stays on node1 after kubectl delete pod %s: %v", victim.Status.PodIP, victim.Name, err)
	}
	err = poll(rctx, 250*time.Millisecond, func() (bool, error) {
		list, err := api.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return false, nil
		}
		n := 0
		for _, p := range list.Items {
			if p.Name != victim.Name && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				n++
			}
		}
		return n == webReplicas, nil
	})
	if err != nil {
		t.Errorf("the Deployment did not get back to %d pods with addresses: %v", webReplicas, err)
	}
	t.Log(kubectl("get", "nodes,pods", "-A", "-o", "wide"))
}

// webReplicas is the size of TestPrivilegedDaemonSet's Deployment.
const webReplicas = 6

// webDeployment spreads pause pods evenly over the nodes.
const webDeployment = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: default
spec:
  replicas: 6
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: kubernetes.io/hostname
          whenUnsatisfiable: DoNotSchedule
          labelSelector:
            matchLabels:
              app: web
      containers:
        - name: pause
          image: registry.k8s.io/pause:3.10
          imagePullPolicy: Never
`

// podNetnsByAddr maps each IPv4 address of a pod network namespace
// (/run/netns/cni-…) to the namespace's name.
func podNetnsByAddr(t *testing.T) map[netip.Addr]string {
	t.Helper()
	out := map[netip.Addr]string{}
	for _, ns := range podNetns(t) {
		b, err := exec.Command("ip", "-n", ns, "-4", "-o", "addr", "show", "scope", "global").Output()
		if err != nil {
			continue // another lab's, gone meanwhile
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			for i := 0; i+1 < len(f); i++ {
				if f[i] == "inet" {
					if p, err := netip.ParsePrefix(f[i+1]); err == nil {
						out[p.Addr()] = ns
					}
				}
			}
		}
	}
	return out
}

// nodeReady reports the node's Ready condition and its message.
func nodeReady(ctx context.Context, t *testing.T, api *kubetest.APIServer, node string) (bool, string) {
	t.Helper()
	n, err := api.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return false, err.Error()
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue, c.Message
		}
	}
	return false, "no Ready condition"
}

// plainHTTPManifest is manifests/tabby-etcd.yaml as the README's plain
// HTTP variant makes it: the endpoint placeholder replaced (the README's
// sed), the TLS file keys of the ConfigMap set to "".
func plainHTTPManifest(t *testing.T, manifest []byte, endpoints string) []byte {
	t.Helper()
	const placeholder = "https://<ETCD_IP>:<ETCD_PORT>"
	if !bytes.Contains(manifest, []byte(placeholder)) {
		t.Fatalf("manifests/tabby-etcd.yaml has no %s for the README's sed", placeholder)
	}
	out := bytes.ReplaceAll(manifest, []byte(placeholder), []byte(endpoints))
	for _, k := range []string{"etcd_ca", "etcd_cert", "etcd_key"} {
		var n int
		lines := strings.Split(string(out), "\n")
		for i, line := range lines {
			if strings.HasPrefix(strings.TrimSpace(line), k+": ") && strings.Contains(line, "/tabby-secrets/") {
				lines[i] = line[:strings.Index(line, k+": ")] + k + `: ""`
				n++
			}
		}
		if n != 1 {
			t.Fatalf("manifests/tabby-etcd.yaml: %d ConfigMap lines %s with a /tabby-secrets path, want 1", n, k)
		}
		out = []byte(strings.Join(lines, "\n"))
	}
	return out
}
