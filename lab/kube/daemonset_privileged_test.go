package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/internal/image"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/kube/kubebins"
	"github.com/tabbynet/tabby/kube/kubetest"
	"github.com/tabbynet/tabby/lab"
)

// daemonSetNodes is how many kubelet nodes TestPrivilegedDaemonSet runs.
const daemonSetNodes = 3

// kubeClient is an admin client of the lab's API server.
func kubeClient(t *testing.T, l *Cluster) *kubernetes.Clientset {
	t.Helper()
	caFile, certFile, keyFile := l.AdminCredentials()
	kc, err := kubernetes.NewForConfig(&rest.Config{Host: APIServerURL(), Dial: l.KubeDial(), QPS: 100, Burst: 200,
		TLSClientConfig: rest.TLSClientConfig{CAFile: caFile, CertFile: certFile, KeyFile: keyFile}})
	if err != nil {
		t.Fatal(err)
	}
	return kc
}

// TestPrivilegedDaemonSet: Tabby deployed as manifests/README.md tells an
// operator, on three lab nodes of a Kubernetes cluster of the lab's own
// (StartKubernetes: kube-apiserver, kube-controller-manager and
// kube-scheduler on the fabric; containerd and a kubelet per node, images
// imported with `ctr -n k8s.io images import`), with kubectl only
// (DeployTabby: the README's plain-HTTP variant of tabby-etcd.yaml and
// tabby-kube-controllers.yaml). Then, through Kubernetes only: a
// Deployment spread over the nodes gets addresses from Tabby's pool and
// every node's pods reach the others'; a NetworkPolicy applied with kubectl
// (tabby-kube-controllers carries it to etcd) drops pings and its deletion
// lets them through; kubectl delete pod releases the address; a rolling
// update of the DaemonSet to a new image tag loses no packet of
// continuous cross-node pings; a drained, powered-off and deleted node's
// blocks are released.
func TestPrivilegedDaemonSet(t *testing.T) {
	binDir, archives := requireKubeletHost(t, []string{"pause.oci.tar", "tabby.oci.tar"}, []string{"ping"}, nil)
	kubetest.Require(t, kubebins.Names...)
	var nodes []string
	for i := 1; i <= daemonSetNodes; i++ {
		nodes = append(nodes, lab.NodeName(i))
	}
	hostPathsBefore := map[string]error{}
	for _, p := range daemonSetHostPaths {
		_, hostPathsBefore[p] = os.Stat(p)
	}
	// The namespaces of this lab's pods, recorded while they run: each
	// must be gone after Down (other labs may run meanwhile).
	ownNetns := map[string]bool{}
	recordNetns := func(ctx context.Context, l *Cluster) {
		t.Helper()
		nss, err := l.KubePodNetns(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, ns := range nss {
			ownNetns[ns] = true
		}
	}
	// The image of the rolling update: the same files under a new tag.
	v2 := filepath.Join(t.TempDir(), "tabby-v2.oci.tar")
	if err := image.Write(v2, image.Tabby("v2"), binDir); err != nil {
		t.Fatal(err)
	}

	name, runDir := testkit.UniqueName(t, "k15b"), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	var log bytes.Buffer
	base, err := lab.Up(ctx, lab.Options{Name: name, Nodes: daemonSetNodes, RunDir: runDir, BinDir: binDir, NoAgents: true, Log: &log})
	if err != nil {
		t.Fatalf("Up: %v\n%s", err, log.String())
	}
	l := New(base)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("lab log:\n%s", log.String())
			for _, f := range []string{"kube/kube-apiserver.log", "kube/kube-controller-manager.log"} {
				t.Logf("%s (tail):\n%s", f, logTail(filepath.Join(runDir, name, f)))
			}
			for _, n := range nodes {
				for _, f := range []string{"containerd/containerd.log", "kubelet/kubelet.log"} {
					t.Logf("%s/%s (tail):\n%s", n, f, logTail(filepath.Join(runDir, name, n, f)))
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
		for ns := range ownNetns {
			if _, err := os.Stat(filepath.Join(lab.NetNSDir, ns)); err == nil {
				t.Errorf("pod network namespace %s left after Down", ns)
			}
		}
	})
	if err := l.StartKubernetes(ctx, KubeOptions{Images: append(archives, v2)}); err != nil {
		t.Fatalf("StartKubernetes: %v", err)
	}
	kc := kubeClient(t, l)
	for _, n := range nodes {
		if ready, msg := nodeReady(ctx, kc, n); ready {
			t.Errorf("%s Ready before Tabby is deployed: %s", n, msg)
		}
	}
	kubectl := func(args ...string) string {
		t.Helper()
		out, err := l.Kubectl(ctx, args...)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}

	// manifests/README.md: configure (plain HTTP), apply, check.
	applyStart := time.Now()
	err = l.DeployTabby(ctx, DeployOptions{ManifestDir: filepath.Join("..", "..", "manifests"), NodeGCGrace: "10s"})
	if err != nil {
		pods, _ := kc.CoreV1().Pods("tabby-system").List(ctx, metav1.ListOptions{})
		for _, p := range pods.Items {
			t.Logf("pod %s on %s: %s %+v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.ContainerStatuses)
			out, _ := l.Kubectl(ctx, "-n", "tabby-system", "logs", "--all-containers", "--tail=40", p.Name)
			t.Logf("logs of %s:\n%s", p.Name, out)
		}
		t.Fatalf("DeployTabby: %v", err)
	}
	t.Logf("Tabby ready (DaemonSet on %d nodes, controllers available, nodes Ready) %v after kubectl apply", daemonSetNodes, time.Since(applyStart).Round(time.Millisecond))
	ctrl, err := kc.CoreV1().Pods("tabby-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=tabby-kube-controllers"})
	if err != nil {
		t.Fatal(err)
	}
	ctrlNodes := map[string]bool{}
	for _, p := range ctrl.Items {
		ctrlNodes[p.Spec.NodeName] = true
	}
	t.Logf("tabby-kube-controllers: %d replicas on %d nodes", len(ctrl.Items), len(ctrlNodes))
	// kubectl logs goes through the API server to the kubelet.
	if out, err := l.Kubectl(ctx, "-n", "tabby-system", "logs", "deployment/tabby-kube-controllers", "--tail=5"); err != nil {
		t.Errorf("kubectl logs of the controllers: %v", err)
	} else {
		t.Logf("kubectl logs deployment/tabby-kube-controllers --tail=5:\n%s", out)
	}
	for _, n := range nodes {
		// install-cni wrote the plugin and the conflist into the node's
		// directories (the lab put neither there: no lab agents).
		if _, err := os.Stat(filepath.Join(l.nodeCNIBinDir(n), lab.BinCNI)); err != nil {
			t.Errorf("%s: install-cni did not write the plugin: %v", n, err)
		} else if fi, _ := os.Lstat(filepath.Join(l.nodeCNIBinDir(n), lab.BinCNI)); fi.Mode()&os.ModeSymlink != 0 {
			t.Errorf("%s: %s is the lab's link, not install-cni's copy", n, lab.BinCNI)
		}
		if b, err := os.ReadFile(l.ConflistPath(n)); err != nil || !strings.Contains(string(b), "/var/run/tabby/cni.sock") {
			t.Errorf("%s: install-cni's conflist: %v\n%s", n, err, b)
		}
		if _, err := os.Stat(filepath.Join(l.NodeHostDir(n, "/var/run/tabby"), "cni.sock")); err != nil {
			t.Errorf("%s: the agent's CNI socket is not in the node's /var/run/tabby: %v", n, err)
		}
	}

	// Workloads through Kubernetes only: a Deployment spread over the
	// nodes, pods on the pause image; addresses from Tabby's pool; every
	// pod reaches a pod on each other node.
	deployment := filepath.Join(t.TempDir(), "web.yaml")
	if err := os.WriteFile(deployment, []byte(DemoDeployment), 0o644); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	kubectl("apply", "-f", deployment)
	pods := waitWebPods(ctx, t, kc, l, DemoReplicas, "")
	recordNetns(ctx, l)
	if len(ownNetns) < DemoReplicas {
		t.Fatalf("%d pod network namespaces hold a task of the lab's containerds, want at least %d: the check after Down would prove little", len(ownNetns), DemoReplicas)
	}
	t.Logf("%d web pods Running with addresses %v after kubectl apply", DemoReplicas, time.Since(created).Round(time.Millisecond))
	byNode := podsByNode(t, pods)
	if len(byNode) != daemonSetNodes {
		t.Errorf("web pods on %d nodes, want %d: %v", len(byNode), daemonSetNodes, byNode)
	}
	pairs := crossNodePairs(ctx, t, l, nodes, byNode)
	if failed := pingPairs(ctx, t, pairs, 3); len(failed) > 0 {
		t.Errorf("ping matrix: %d of %d pod pairs across nodes do not answer: %v", len(failed), len(pairs), failed)
		diagnosePairs(ctx, t, l, failed)
	} else {
		t.Logf("ping matrix: %d of %d pod pairs across nodes answered", len(pairs), len(pairs))
	}

	// A Kubernetes NetworkPolicy, applied with kubectl: the controllers
	// write it to etcd, the agents drop the pings; deleted, they pass.
	policy := filepath.Join(t.TempDir(), "deny.yaml")
	if err := os.WriteFile(policy, []byte(webDenyIngress), 0o644); err != nil {
		t.Fatal(err)
	}
	probe := pairs[0]
	applied := time.Now()
	kubectl("apply", "-f", policy)
	err = lab.Poll(ctx, 50*time.Millisecond, func() (bool, error) { return len(pingPairs(ctx, t, []podPair{probe}, 1)) == 1, nil })
	if err != nil {
		t.Fatalf("pings still answered after the NetworkPolicy: %v", err)
	}
	t.Logf("NetworkPolicy applied with kubectl → pings dropped: %v", time.Since(applied).Round(time.Millisecond))
	if answered := len(pairs) - len(pingPairs(ctx, t, pairs, 1)); answered > 0 {
		t.Errorf("%d pod pairs still answer pings under an ingress-denying NetworkPolicy", answered)
	}
	deleted := time.Now()
	kubectl("delete", "-f", policy)
	err = lab.Poll(ctx, 50*time.Millisecond, func() (bool, error) { return len(pingPairs(ctx, t, []podPair{probe}, 1)) == 0, nil })
	if err != nil {
		t.Fatalf("pings still dropped after the NetworkPolicy's deletion: %v", err)
	}
	t.Logf("NetworkPolicy deleted → pings answered: %v", time.Since(deleted).Round(time.Millisecond))

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
	err = lab.Poll(ctx, 100*time.Millisecond, func() (bool, error) {
		out, err := l.Exec(ctx, "node1", "ip", "route", "show", victim.Status.PodIP+"/32")
		return err == nil && strings.TrimSpace(string(out)) == "", nil
	})
	if err != nil {
		t.Errorf("the route to %s stays on node1 after kubectl delete pod %s: %v", victim.Status.PodIP, victim.Name, err)
	}
	pods = waitWebPods(ctx, t, kc, l, DemoReplicas, victim.Name)

	// A rolling update of the DaemonSet to a new image tag while every
	// node's pod pings a pod on the next node: not one packet lost.
	byNode = podsByNode(t, pods)
	var pingers []*seqPinger
	for _, p := range crossNodePairs(ctx, t, l, nodes, byNode) {
		if p.from == nodes[0] && p.to == nodes[1] || p.from == nodes[1] && p.to == nodes[2] || p.from == nodes[2] && p.to == nodes[0] {
			pingers = append(pingers, startSeqPinger(t, p))
		}
	}
	if len(pingers) != daemonSetNodes {
		t.Fatalf("%d pingers, want %d", len(pingers), daemonSetNodes)
	}
	time.Sleep(time.Second)
	rollStart := time.Now()
	kubectl("-n", "tabby-system", "set", "image", "daemonset/tabby-node", "tabby-node=tabby:v2", "install-cni=tabby:v2")
	kubectl("-n", "tabby-system", "rollout", "status", "daemonset/tabby-node", "--timeout=6m")
	rolled := time.Since(rollStart)
	time.Sleep(2 * time.Second)
	var sent, lost int
	for _, p := range pingers {
		s, lostSeqs := p.stop(t)
		sent += s
		lost += len(lostSeqs)
		if len(lostSeqs) > 0 {
			t.Errorf("%s → %s: %d of %d pings lost during the rolling update (icmp_seq %v)", p.pair.from, p.pair.to, len(lostSeqs), s, lostSeqs)
		}
	}
	t.Logf("DaemonSet rolling update to tabby:v2 on %d nodes took %v: %d of %d pings lost", daemonSetNodes, rolled.Round(time.Millisecond), lost, sent)
	agents, err := kc.CoreV1().Pods("tabby-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=tabby-node"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range agents.Items {
		if img := p.Spec.Containers[0].Image; img != "tabby:v2" {
			t.Errorf("agent pod %s runs %s after the rolling update", p.Name, img)
		}
	}

	// Drain node3, power it off, delete its Node: the controllers delete
	// its Tabby Node, and after the grace (10 s here) the other agents
	// release its blocks.
	gone := nodes[len(nodes)-1]
	al := ipam.New(l.Store())
	if left, err := nodeBlocks(ctx, al, gone); err != nil || len(left) == 0 {
		t.Fatalf("%s holds no block before the drain (%v): the check below would prove nothing", gone, err)
	}
	kubectl("drain", gone, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--grace-period=1", "--timeout=120s")
	pods = waitWebPods(ctx, t, kc, l, DemoReplicas, "")
	recordNetns(ctx, l)
	for _, p := range pods {
		if p.Spec.NodeName == gone {
			t.Errorf("web pod %s still on drained %s", p.Name, gone)
		}
	}
	if err := l.PowerOffKubeNode(ctx, gone); err != nil {
		t.Fatalf("powering off %s: %v", gone, err)
	}
	deletedNode := time.Now()
	kubectl("delete", "node", gone)
	err = lab.Poll(ctx, 250*time.Millisecond, func() (bool, error) {
		left, err := nodeBlocks(ctx, al, gone)
		return err == nil && len(left) == 0, nil
	})
	if err != nil {
		left, _ := nodeBlocks(ctx, al, gone)
		t.Fatalf("%s's blocks %v not released after its Node was deleted: %v", gone, left, err)
	}
	t.Logf("kubectl delete node %s → its blocks released %v later (node GC grace 10 s)", gone, time.Since(deletedNode).Round(time.Millisecond))
	if _, err := l.Store().Get(ctx, api.KindNode, "", gone); err == nil {
		t.Errorf("Tabby Node %s still in etcd", gone)
	}
	t.Log(kubectl("get", "nodes,pods", "-A", "-o", "wide"))
}

// nodeBlocks lists the blocks affine to node.
func nodeBlocks(ctx context.Context, al *ipam.Allocator, node string) ([]netip.Prefix, error) {
	blocks, err := al.Blocks(ctx)
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, b := range blocks {
		if b.Affinity == node {
			out = append(out, b.CIDR)
		}
	}
	return out, nil
}

// waitWebPods waits until n web pods other than skip are Running with an
// address, and returns them.
func waitWebPods(ctx context.Context, t *testing.T, kc kubernetes.Interface, l *Cluster, n int, skip string) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	err := lab.Poll(ctx, 250*time.Millisecond, func() (bool, error) {
		list, err := kc.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return false, nil
		}
		pods = pods[:0]
		for _, p := range list.Items {
			if p.Name != skip && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				pods = append(pods, p)
			}
		}
		return len(pods) == n, nil
	})
	if err != nil {
		out, _ := l.Kubectl(ctx, "get", "pods", "-o", "wide")
		t.Fatalf("%d of %d web pods Running with an address: %v\n%s", len(pods), n, err, out)
	}
	return pods
}

// podsByNode groups the pods' addresses by node; every address must be
// from Tabby's pool.
func podsByNode(t *testing.T, pods []corev1.Pod) map[string][]netip.Addr {
	t.Helper()
	byNode := map[string][]netip.Addr{}
	for _, p := range pods {
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil || !netip.MustParsePrefix(lab.PodPool).Contains(ip) {
			t.Errorf("pod %s address %q is not from Tabby's pool %s", p.Name, p.Status.PodIP, lab.PodPool)
			continue
		}
		byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], ip)
	}
	return byNode
}

// podPair is a pod (its network namespace and address) on one node and a
// pod address on another.
type podPair struct {
	from, to string
	netns    string
	src, dst netip.Addr
}

func (p podPair) String() string { return fmt.Sprintf("%s(%s)→%s(%s)", p.src, p.from, p.dst, p.to) }

// crossNodePairs pairs each node's first pod with each other node's first.
// A pod's network namespace is looked up among this lab's only: pod
// addresses repeat from lab to lab, and a namespace left behind by an
// interrupted run elsewhere on the host holds the same address (the pings
// then left from a dead lab's pod, and failed).
func crossNodePairs(ctx context.Context, t *testing.T, l *Cluster, nodes []string, byNode map[string][]netip.Addr) []podPair {
	t.Helper()
	netnsOf := map[netip.Addr]string{}
	var pairs []podPair
	for _, from := range nodes {
		for _, to := range nodes {
			if from == to || len(byNode[from]) == 0 || len(byNode[to]) == 0 {
				continue
			}
			if len(netnsOf) == 0 {
				nss, err := l.KubePodNetns(ctx)
				if err != nil {
					t.Fatal(err)
				}
				netnsOf = netnsByAddr(nss)
			}
			src := byNode[from][0]
			pairs = append(pairs, podPair{from: from, to: to, netns: netnsOf[src], src: src, dst: byNode[to][0]})
		}
	}
	return pairs
}

// pingPairs pings once per pair (timeout in seconds) and returns the
// pairs that got no answer.
func pingPairs(ctx context.Context, t *testing.T, pairs []podPair, timeout int) []podPair {
	t.Helper()
	var failed []podPair
	for _, p := range pairs {
		if p.netns == "" {
			t.Errorf("no pod network namespace holds %s", p.src)
			failed = append(failed, p)
			continue
		}
		err := exec.CommandContext(ctx, "nsenter", "--net="+filepath.Join(lab.NetNSDir, p.netns), "--",
			"ping", "-n", "-c", "1", "-W", strconv.Itoa(timeout), p.dst.String()).Run()
		if err != nil {
			failed = append(failed, p)
		}
	}
	return failed
}

// diagnosePairs logs, for pod pairs that did not answer, the source
// node's route to the destination and the tail of both nodes' agents'
// logs: what tells a missing route from a policy drop or an agent that
// was away.
func diagnosePairs(ctx context.Context, t *testing.T, l *Cluster, failed []podPair) {
	t.Helper()
	for _, p := range failed {
		out, err := l.Exec(ctx, p.from, "ip", "route", "get", p.dst.String())
		t.Logf("%s: ip route get %s on %s: %v\n%s", p, p.dst, p.from, err, out)
		out, err = l.Exec(ctx, p.from, "conntrack", "-L", "-s", p.src.String())
		t.Logf("%s: conntrack -L -s %s on %s: %v\n%s", p, p.src, p.from, err, out)
		out, err = l.Exec(ctx, p.from, "nft", "list", "ruleset")
		t.Logf("%s: nft list ruleset on %s: %v\n%s", p, p.from, err, out)
		for _, n := range []string{p.from, p.to} {
			pods, err := l.Kubectl(ctx, "-n", "tabby-system", "get", "pods", "-l", "app.kubernetes.io/name=tabby-node",
				"--field-selector", "spec.nodeName="+n, "-o", "name")
			if err != nil {
				t.Logf("agent pod on %s: %v", n, err)
				continue
			}
			for _, pod := range strings.Fields(string(pods)) {
				out, err := l.Kubectl(ctx, "-n", "tabby-system", "logs", "--all-containers", "--tail=40", pod)
				t.Logf("agent logs (%s, %s): %v\n%s", n, pod, err, out)
			}
		}
	}
}

// seqPinger pings every 20 ms from a pod's namespace and records which
// echo sequence numbers were answered.
type seqPinger struct {
	pair podPair
	cmd  *exec.Cmd
	out  *bytes.Buffer
	done chan struct{} // closed once ping has exited
}

func startSeqPinger(t *testing.T, p podPair) *seqPinger {
	t.Helper()
	sp := &seqPinger{pair: p, out: &bytes.Buffer{}, done: make(chan struct{})}
	sp.cmd = exec.Command("nsenter", "--net="+filepath.Join(lab.NetNSDir, p.netns), "--", "ping", "-n", "-i", "0.02", "-W", "1", p.dst.String())
	sp.cmd.Stdout = sp.out
	if err := sp.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = sp.cmd.Wait() // ping exits 1 when an echo went unanswered: the output says which
		close(sp.done)
	}()
	t.Cleanup(func() {
		_ = sp.cmd.Process.Kill()
		<-sp.done
	})
	return sp
}

// stop ends the pinger and returns how many echoes it sent and which
// sequence numbers went unanswered: every one but the last sent (which
// may still have been in flight), from ping's own count of what it sent.
func (sp *seqPinger) stop(t *testing.T) (sent int, lost []int) {
	t.Helper()
	_ = sp.cmd.Process.Signal(syscall.SIGINT)
	<-sp.done
	answered := map[int]bool{}
	sent = -1
	for _, line := range strings.Split(sp.out.String(), "\n") {
		if f := strings.Fields(line); len(f) > 3 && f[1] == "packets" && f[2] == "transmitted," {
			sent, _ = strconv.Atoi(f[0])
		}
		i := strings.Index(line, "icmp_seq=")
		if i < 0 || !strings.Contains(line, "bytes from") {
			continue
		}
		if f := strings.Fields(line[i+len("icmp_seq="):]); len(f) > 0 {
			if seq, err := strconv.Atoi(f[0]); err == nil {
				answered[seq] = true
			}
		}
	}
	if sent < 0 {
		t.Fatalf("%v: no summary from ping:\n%s", sp.pair, sp.out.String())
	}
	if len(answered) == 0 {
		t.Errorf("%v: no echo answered at all", sp.pair)
	}
	for seq := 1; seq < sent; seq++ {
		if !answered[seq] {
			lost = append(lost, seq)
		}
	}
	return sent, lost
}

// webDenyIngress denies every ingress to the web pods.
const webDenyIngress = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: web-deny-ingress
  namespace: default
spec:
  podSelector:
    matchLabels:
      app: web
  policyTypes: [Ingress]
`

// nodeReady reports the node's Ready condition and its message.
func nodeReady(ctx context.Context, kc kubernetes.Interface, node string) (bool, string) {
	n, err := kc.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
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
