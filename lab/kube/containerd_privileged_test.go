package kube

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/internal/image"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
)

// fdTargets maps each open descriptor of pid to what it refers to
// ("/path", "pipe:[123]", "socket:[456]", …).
func fdTargets(t *testing.T, pid int) map[int]string {
	t.Helper()
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if target, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil {
			out[fd] = target
		}
	}
	return out
}

// TestPrivilegedContainerd: a lab node's containerd runs in the node's
// network namespace with its own root, state and socket, holds none of the
// test's descriptors, imports the Tabby and pause images that `make
// images` wrote, and leaves nothing behind on Down: no process, no mount,
// no directory (so no images), no namespace.
func TestPrivilegedContainerd(t *testing.T) {
	testkit.RequirePrivileged(t)
	for _, b := range []string{"containerd", "ctr"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s not installed (apt-get install containerd): %v", b, err)
		}
	}
	binDir := os.Getenv("TABBY_BIN")
	if binDir == "" {
		t.Skip("TABBY_BIN is not set: run `make images` and set TABBY_BIN=$PWD/bin")
	}
	archives := []string{filepath.Join(binDir, "images", "tabby.oci.tar"), filepath.Join(binDir, "images", "pause.oci.tar")}
	for _, a := range archives {
		if _, err := os.Stat(a); err != nil {
			t.Skipf("image archive missing (%v): run `make images`", err)
		}
	}
	name, runDir := testkit.UniqueName(t, "k15"), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
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
	_, runContainerdBefore := os.Stat("/run/containerd")

	if err := l.StartContainerd(ctx, "node1"); err != nil {
		t.Fatalf("StartContainerd: %v\n%s", err, log.String())
	}
	p := l.State().Node("node1").Containerd
	if p == nil || !p.Alive() {
		t.Fatalf("containerd not recorded or not running: %+v", p)
	}
	// In the node's network namespace.
	nodeNS, err := os.Stat(lab.NetNSPath(l.State().Node("node1").NetNS))
	if err != nil {
		t.Fatal(err)
	}
	procNS, err := os.Stat("/proc/" + strconv.Itoa(p.PID) + "/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(nodeNS, procNS) {
		t.Error("containerd does not run in node1's network namespace")
	}
	// None of the test's descriptors: standard input is /dev/null, the
	// output goes to its log, and no pipe, socket or file of the test
	// process (go test's output pipe among them) is open in containerd.
	fds := fdTargets(t, p.PID)
	if fds[0] != "/dev/null" || fds[1] != p.Log || fds[2] != p.Log {
		t.Errorf("containerd's fds 0-2 are %q %q %q, want /dev/null and %s", fds[0], fds[1], fds[2], p.Log)
	}
	// (anon_inode entries name no particular object, so they are left out.)
	mine := map[string]int{}
	for fd, target := range fdTargets(t, os.Getpid()) {
		if target != "/dev/null" && !strings.HasPrefix(target, "anon_inode:") {
			mine[target] = fd
		}
	}
	for fd, target := range fds {
		if testFD, ok := mine[target]; ok {
			t.Errorf("containerd holds the test's %s (the test's fd %d) as fd %d", target, testFD, fd)
		}
	}
	// Its own root, state and socket, all under its directory.
	dir := l.ContainerdDir("node1")
	for _, sub := range []string{"root/io.containerd.content.v1.content", "state", "containerd.sock"} {
		if _, err := os.Stat(filepath.Join(dir, sub)); err != nil {
			t.Errorf("containerd's %s: %v", sub, err)
		}
	}

	if err := l.ImportImages(ctx, "node1", archives...); err != nil {
		t.Fatal(err)
	}
	got, err := l.Images(ctx, "node1")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{image.TabbyName("dev"), image.PauseName}, got); diff != "" {
		t.Errorf("images (-want +got):\n%s", diff)
	}

	labDir := l.Dir()
	down = true
	if err := l.Down(); err != nil {
		t.Fatalf("Down: %v\n%s", err, log.String())
	}
	assertGone(t, name, labDir, []*lab.Proc{p})
	if mps, err := lab.MountsUnder(runDir); err != nil || len(mps) > 0 {
		t.Errorf("mounts left under %s: %v (%v)", runDir, mps, err)
	}
	if _, err := os.Stat("/run/containerd"); errors.Is(runContainerdBefore, os.ErrNotExist) && err == nil {
		t.Error("containerd created /run/containerd outside its directory")
	}
	if !strings.Contains(log.String(), "starting containerd on node1") {
		t.Errorf("the lab's log does not mention containerd:\n%s", log.String())
	}
}

// TestContainerdConfig: every path of a node's containerd is under the
// node's directory but the CNI directories, which are the standard ones
// (the node's own in its mount namespace: nodeHostPaths), and its sandbox
// image is the pause image the lab builds.
func TestContainerdConfig(t *testing.T) {
	dir := "/run/tabby-lab/x/node1/containerd"
	cfg := containerdConfig(dir)
	n := 0
	for _, line := range strings.Split(cfg, "\n") {
		_, v, ok := strings.Cut(line, "= ")
		if !ok || !strings.HasPrefix(v, `"/`) {
			continue
		}
		p, err := strconv.Unquote(v)
		if err == nil && (p == "/opt/cni/bin" || p == "/etc/cni/net.d") {
			continue
		}
		n++
		if err != nil || !strings.HasPrefix(p, filepath.Dir(dir)+"/") {
			t.Errorf("%s: not under %s", strings.TrimSpace(line), dir)
		}
	}
	if n != 6 {
		t.Errorf("%d paths in the config besides the CNI directories, want 6 (root, state, 2 sockets, opt, runc):\n%s", n, cfg)
	}
	for _, want := range []string{`conf_dir = "/etc/cni/net.d"`, `bin_dir = "/opt/cni/bin"`} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config lacks %s (the DaemonSet's host paths):\n%s", want, cfg)
		}
	}
	if !strings.Contains(cfg, `sandbox_image = "`+image.PauseName+`"`) {
		t.Errorf("sandbox image is not %s:\n%s", image.PauseName, cfg)
	}
	if !strings.Contains(cfg, `address = "`+filepath.Join(dir, "containerd.sock")+`"`) {
		t.Errorf("the gRPC socket is not %s/containerd.sock", dir)
	}
}
