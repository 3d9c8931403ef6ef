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
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/internal/image"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/kube/kubetest"
	"github.com/tabbynet/tabby/lab"
)

// hostTunables reads the kernel settings the kubelet checks, as the host
// has them.
func hostTunables(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for k := range kubeletTunables {
		b, err := os.ReadFile(filepath.Join("/proc/sys", k))
		if err != nil {
			t.Fatal(err)
		}
		out[k] = strings.TrimSpace(string(b))
	}
	return out
}

// TestPrivilegedKubelet: a kubelet on a lab node (in its network
// namespace, on the node's containerd, cgroup v1 with failCgroupV1: false,
// its own root directory and cgroup root) registers the node with a real
// kube-apiserver, reached from the node's namespace through ListenIn and
// Proxy; the host's kernel settings stay as they were; Down leaves no
// process, cgroup or directory.
func TestPrivilegedKubelet(t *testing.T) {
	testkit.RequirePrivileged(t)
	bins := kubetest.Require(t, "kube-apiserver", "kubelet")
	for _, b := range []string{"containerd", "ctr", "unshare"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s not installed (apt-get install containerd util-linux): %v", b, err)
		}
	}
	if _, err := lab.CgroupHierarchies(); err != nil {
		t.Skipf("cgroups: %v", err)
	}
	before := hostTunables(t)
	api := kubetest.StartWith(t, kubetest.Options{Nodes: []string{"node1"}})

	name, runDir := testkit.UniqueName(t, "k15"), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var log bytes.Buffer
	base, err := lab.Up(ctx, lab.Options{Name: name, Nodes: 1, RunDir: runDir, NoAgents: true, LabBinary: labBinary(t), Log: &log})
	if err != nil {
		t.Fatalf("Up: %v\n%s", err, log.String())
	}
	l := New(base)
	down := false
	t.Cleanup(func() {
		if !down {
			if err := l.Down(); err != nil {
				t.Errorf("cleanup Down: %v", err)
			}
		}
	})
	node := l.State().Node("node1")
	ln, err := lab.ListenIn(node.NetNS, "127.0.0.1:6443")
	if err != nil {
		t.Fatal(err)
	}
	proxied := make(chan error, 1)
	go func() { proxied <- lab.Proxy(ln, strings.TrimPrefix(api.URL, "https://")) }()
	t.Cleanup(func() {
		ln.Close()
		if err := <-proxied; err != nil {
			t.Errorf("proxy: %v", err)
		}
	})

	if err := l.StartContainerd(ctx, "node1"); err != nil {
		t.Fatalf("StartContainerd: %v\n%s", err, log.String())
	}
	start := time.Now()
	if err := l.StartKubelet(ctx, "node1", bins["kubelet"], KubeletOptions{Server: "https://127.0.0.1:6443", Token: api.Tokens["node:node1"]}); err != nil {
		t.Fatalf("StartKubelet: %v\n%s", err, log.String())
	}
	kubeletProc := l.State().Node("node1").Kubelet
	logTailOnFail := func() string { return logTail(kubeletProc.Log) }

	var n *corev1.Node
	err = lab.Poll(ctx, 200*time.Millisecond, func() (bool, error) {
		if !kubeletProc.Alive() {
			return false, os.ErrProcessDone
		}
		n, err = api.Client.CoreV1().Nodes().Get(ctx, "node1", metav1.GetOptions{})
		return err == nil && len(n.Status.Conditions) > 0, nil
	})
	if err != nil {
		t.Fatalf("node1 not registered: %v\n%s", err, logTailOnFail())
	}
	t.Logf("node1 registered %v after the kubelet started", time.Since(start).Round(time.Millisecond))
	var ip string
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			ip = a.Address
		}
	}
	if ip != node.IP.Addr().String() {
		t.Errorf("node1's InternalIP %q, want the lab address %s", ip, node.IP.Addr())
	}
	if v := n.Status.NodeInfo.KubeletVersion; v != kubetest.Version {
		t.Errorf("kubelet version %s, want %s", v, kubetest.Version)
	}
	if rt := n.Status.NodeInfo.ContainerRuntimeVersion; !strings.HasPrefix(rt, "containerd://1.") {
		t.Errorf("container runtime %q, want containerd 1.x", rt)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			t.Logf("Ready=%s: %s", c.Status, c.Message)
		}
	}
	cgroupRoot := kubeletCgroupRoot(name, "node1")
	if _, err := os.Stat(filepath.Join(lab.CgroupV1Root, "memory", cgroupRoot, "kubepods")); err != nil {
		t.Errorf("the kubelet's pods cgroup: %v", err)
	}
	if diff := hostTunables(t); !equalMaps(before, diff) {
		t.Errorf("host kernel settings changed: before %v, now %v", before, diff)
	}

	labDir := l.Dir()
	down = true
	if err := l.Down(); err != nil {
		t.Fatalf("Down: %v\n%s", err, log.String())
	}
	assertGone(t, name, labDir, []*lab.Proc{kubeletProc})
	hs, err := lab.CgroupHierarchies()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if _, err := os.Stat(filepath.Join(h, cgroupRoot)); err == nil {
			t.Errorf("cgroup %s left after Down", filepath.Join(h, cgroupRoot))
		}
	}
	if now := hostTunables(t); !equalMaps(before, now) {
		t.Errorf("host kernel settings changed: before %v, now %v", before, now)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestPrivilegedKubeletPod: a pod created through the API server is run by
// node1's kubelet and containerd, whose CRI plugin calls the tabby CNI
// plugin with the lab's conflist; node1's agent gives it an address from
// the lab's pool, which the pod's status shows and a lab pod on node2
// reaches across the fabric; deleting the pod through the API releases
// the address (the CNI DEL removes its route).
func TestPrivilegedKubeletPod(t *testing.T) {
	binDir, archives := requireKubeletHost(t, []string{"pause.oci.tar"}, nil, nil)
	pause := archives[0]
	bins := kubetest.Require(t, "kube-apiserver", "kubelet")
	api := kubetest.StartWith(t, kubetest.Options{Nodes: []string{"node1"}})
	hostPathsBefore := map[string]error{}
	for _, p := range daemonSetHostPaths {
		_, hostPathsBefore[p] = os.Stat(p)
	}
	_, runContainerdBefore := os.Stat("/run/containerd")
	_, varLogContainersBefore := os.Stat("/var/log/containers")
	var ownNetns []string // the lab's pods', recorded while they run

	name, runDir := testkit.UniqueName(t, "k15"), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var log bytes.Buffer
	base, err := lab.Up(ctx, lab.Options{Name: name, Nodes: 2, PodsPerNode: 1, RunDir: runDir, BinDir: binDir, Log: &log})
	if err != nil {
		t.Fatalf("Up: %v\n%s", err, log.String())
	}
	l := New(base)
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{"node1/agent.log", "node1/containerd/containerd.log", "node1/kubelet/kubelet.log"} {
				b, _ := os.ReadFile(filepath.Join(runDir, name, f))
				if len(b) > 6000 {
					b = b[len(b)-6000:]
				}
				t.Logf("%s (tail):\n%s", f, b)
			}
		}
		if err := l.Down(); err != nil {
			t.Errorf("cleanup Down: %v", err)
		}
		// What containerd 1.6 makes outside its directories goes too.
		if _, err := os.Stat("/run/containerd"); errors.Is(runContainerdBefore, os.ErrNotExist) && err == nil {
			t.Error("/run/containerd left after Down")
		}
		if _, err := os.Stat("/var/log/containers"); err == nil && errors.Is(varLogContainersBefore, os.ErrNotExist) {
			t.Error("the kubelet wrote the host's /var/log/containers")
		}
		for _, p := range daemonSetHostPaths {
			if _, err := os.Stat(p); err == nil && errors.Is(hostPathsBefore[p], os.ErrNotExist) {
				t.Errorf("the lab made the host's %s", p)
			}
		}
		// The pod left running at Down: its network namespace goes too,
		// and so do the shims of node1's containerd (killed before Down).
		for _, ns := range ownNetns {
			if _, err := os.Stat(filepath.Join(lab.NetNSDir, ns)); err == nil {
				t.Errorf("pod network namespace %s left after Down", ns)
			}
		}
		sock := filepath.Join(runDir, name, "node1", "containerd", "containerd.sock")
		if out, err := exec.Command("pgrep", "-a", "-f", "containerd-shim.* -address "+sock).Output(); err == nil {
			t.Errorf("containerd shims of node1 left after Down:\n%s", out)
		}
	})
	node := l.State().Node("node1")
	ln, err := lab.ListenIn(node.NetNS, "127.0.0.1:6443")
	if err != nil {
		t.Fatal(err)
	}
	proxied := make(chan error, 1)
	go func() { proxied <- lab.Proxy(ln, strings.TrimPrefix(api.URL, "https://")) }()
	t.Cleanup(func() {
		ln.Close()
		if err := <-proxied; err != nil {
			t.Errorf("proxy: %v", err)
		}
	})
	if err := l.StartContainerd(ctx, "node1"); err != nil {
		t.Fatalf("StartContainerd: %v\n%s", err, log.String())
	}
	if err := l.ImportImages(ctx, "node1", pause); err != nil {
		t.Fatal(err)
	}
	checkNodeHostPaths(t, l, "node1")
	if err := l.StartKubelet(ctx, "node1", bins["kubelet"], KubeletOptions{Server: "https://127.0.0.1:6443", Token: api.Tokens["node:node1"]}); err != nil {
		t.Fatalf("StartKubelet: %v\n%s", err, log.String())
	}
	kubelet := l.State().Node("node1").Kubelet

	no := false
	one := int64(1)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{
			NodeName:                      "node1", // no scheduler in this test
			AutomountServiceAccountToken:  &no,
			TerminationGracePeriodSeconds: &one,
			Containers:                    []corev1.Container{{Name: "pause", Image: image.PauseName, ImagePullPolicy: corev1.PullNever}},
		},
	}
	created := time.Now()
	if _, err := api.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var podIP netip.Addr
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer wcancel()
	err = lab.Poll(wctx, 100*time.Millisecond, func() (bool, error) {
		if !kubelet.Alive() {
			return false, errors.New("the kubelet exited")
		}
		p, err := api.Client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
			return false, nil
		}
		podIP, err = netip.ParseAddr(p.Status.PodIP)
		return true, err
	})
	if err != nil {
		p, _ := api.Client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
		t.Fatalf("pod web not running with an address: %v\nstatus: %+v", err, p.Status)
	}
	t.Logf("pod web Running with %s %v after it was created", podIP, time.Since(created).Round(time.Millisecond))
	if !netip.MustParsePrefix(lab.PodPool).Contains(podIP) {
		t.Errorf("pod address %s is not from the lab's pool %s", podIP, lab.PodPool)
	}
	var from string
	for _, p := range l.State().Pods {
		if p.Node == "node2" {
			from = p.Name
		}
	}
	if err := l.Ping(ctx, from, podIP); err != nil {
		t.Errorf("lab pod %s on node2 → kubelet pod %s on node1: %v", from, podIP, err)
	}

	if err := api.Client.CoreV1().Pods("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = lab.Poll(ctx, 100*time.Millisecond, func() (bool, error) {
		out, err := l.Exec(ctx, "node1", "ip", "route", "show", podIP.String()+"/32")
		return err == nil && strings.TrimSpace(string(out)) == "", nil
	})
	if err != nil {
		t.Errorf("the route to %s stays on node1 after the pod was deleted: %v", podIP, err)
	}

	// A pod still running at Down: Down removes its containers and
	// network namespace, so that no process keeps the cgroup root busy.
	pod.Name = "left"
	if _, err := api.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = lab.Poll(wctx, 100*time.Millisecond, func() (bool, error) {
		p, err := api.Client.CoreV1().Pods("default").Get(ctx, "left", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", nil
	})
	if err != nil {
		t.Fatalf("pod left not running: %v", err)
	}
	if ownNetns, err = l.KubePodNetns(ctx); err != nil {
		t.Fatal(err)
	}
	if len(ownNetns) == 0 {
		t.Error("no pod network namespace holds the running pod's task: the Down check would prove nothing")
	}
	// containerd dies before Down (TestPrivilegedDaemonSet's Down removes
	// running pods through it): its shims and the pod outlive it, and Down
	// still stops them (the processes left in the node's cgroup root,
	// which otherwise stays busy: Down fails) and deletes the pod's network
	// namespace (the cleanup checks both).
	cd := l.State().Node("node1").Containerd
	if err := syscall.Kill(cd.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := lab.Poll(ctx, 50*time.Millisecond, func() (bool, error) { return !cd.Alive(), nil }); err != nil {
		t.Fatalf("containerd (pid %d) still alive after SIGKILL: %v", cd.PID, err)
	}
}

// daemonSetHostPaths are the host paths manifests/tabby-etcd.yaml's
// DaemonSet mounts, but /var/run/netns (the host's, shared) and
// /run/xtables.lock (a file: FileOrCreate under the node's /run).
var daemonSetHostPaths = []string{"/opt/cni/bin", "/etc/cni/net.d", "/var/run/tabby", "/var/lib/tabby", "/lib/modules"}

// checkNodeHostPaths: in the node's mount namespace (containerd's, which
// the kubelet joins) each DaemonSet host path is the node's directory: a
// file written there from the host is seen there, the standard CNI
// directories hold the node's plugins and conflist, and the host's own
// paths do not show it.
func checkNodeHostPaths(t *testing.T, l *Cluster, node string) {
	t.Helper()
	root := fmt.Sprintf("/proc/%d/root", l.State().Node(node).Containerd.PID)
	for _, p := range daemonSetHostPaths {
		dir := l.NodeHostDir(node, p)
		if dir == "" {
			t.Errorf("%s is not a host path of the node", p)
			continue
		}
		probe := "k15b-probe-" + node
		if err := os.WriteFile(filepath.Join(dir, probe), []byte(p), 0o644); err != nil {
			t.Fatal(err)
		}
		// Links resolved here: an absolute one under /proc/<pid>/root
		// would lead back to this process's root.
		if b, err := os.ReadFile(filepath.Join(root, resolveHostPath(p), probe)); err != nil || string(b) != p {
			t.Errorf("%s in %s's mount namespace is not %s: %q, %v", p, node, dir, b, err)
		}
		if _, err := os.Stat(filepath.Join(p, probe)); err == nil {
			t.Errorf("the host's %s shows %s's file", p, node)
		}
		if err := os.Remove(filepath.Join(dir, probe)); err != nil {
			t.Error(err)
		}
	}
	for _, f := range []string{"/opt/cni/bin/loopback", "/opt/cni/bin/tabby", "/etc/cni/net.d/10-tabby.conflist"} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Errorf("%s's %s: %v", node, f, err)
		}
	}
}
