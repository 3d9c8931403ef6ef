package lab

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/kube/kubetest"
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
	skipUnlessRoot(t)
	bins := kubetest.Require(t, "kube-apiserver", "kubelet")
	for _, b := range []string{"containerd", "ctr", "unshare"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s not installed (apt-get install containerd util-linux): %v", b, err)
		}
	}
	if _, err := cgroupHierarchies(); err != nil {
		t.Skipf("cgroups: %v", err)
	}
	before := hostTunables(t)
	api := kubetest.StartWith(t, kubetest.Options{Nodes: []string{"node1"}})

	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	name, runDir := "k15"+hex.EncodeToString(b[:]), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var log bytes.Buffer
	l, err := Up(ctx, Options{Name: name, Nodes: 1, RunDir: runDir, NoAgents: true, LabBinary: labBinary(t), Log: &log})
	if err != nil {
		t.Fatalf("Up: %v\n%s", err, log.String())
	}
	down := false
	t.Cleanup(func() {
		if !down {
			if err := l.Down(); err != nil {
				t.Errorf("cleanup Down: %v", err)
			}
		}
	})
	node := l.State().node("node1")
	ln, err := ListenIn(node.NetNS, "127.0.0.1:6443")
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

	if err := l.StartContainerd(ctx, "node1"); err != nil {
		t.Fatalf("StartContainerd: %v\n%s", err, log.String())
	}
	start := time.Now()
	if err := l.StartKubelet(ctx, "node1", bins["kubelet"], KubeletOptions{Server: "https://127.0.0.1:6443", Token: api.Tokens["node:node1"]}); err != nil {
		t.Fatalf("StartKubelet: %v\n%s", err, log.String())
	}
	kubeletProc := l.State().node("node1").Kubelet
	logTailOnFail := func() string { return logTail(kubeletProc.Log) }

	var n *corev1.Node
	err = poll(ctx, 200*time.Millisecond, func() (bool, error) {
		if !kubeletProc.alive() {
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
	// Without a CNI configuration the node is not Ready, and says why.
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			t.Logf("Ready=%s: %s", c.Status, c.Message)
			if c.Status == corev1.ConditionTrue {
				t.Error("node1 Ready without a network plugin")
			}
		}
	}
	cgroupRoot := kubeletCgroupRoot(name, "node1")
	if _, err := os.Stat(filepath.Join(cgroupV1Root, "memory", cgroupRoot, "kubepods")); err != nil {
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
	assertGone(t, name, labDir, []*Proc{kubeletProc})
	hs, err := cgroupHierarchies()
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
