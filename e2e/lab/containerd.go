package lab

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/tabbynet/tabby/internal/image"
)

// A lab node's containerd (Debian's containerd 1.6) runs in the node's
// network namespace with everything of its own under the node directory:
// root (content, snapshots, metadata), state, the gRPC socket, runc's state,
// the opt directory and the CNI plugin directory its CRI plugin reads; its
// CNI configuration directory is the node's, where the lab writes the
// conflist. Only the shims' sockets go to the compiled-in /run/containerd/s
// (names hashed from our socket path, so nodes do not collide; removed when
// the shims exit). The pod sandbox image is the lab's pause image
// (internal/image.PauseName).
//
// It also runs in a mount namespace of its own, the node's, which the
// node's kubelet joins (nodeMountScript): there the kubelet's volume
// mounts are visible to runc, the kernel tunables the kubelet checks read
// as it wants them, and /var/log is the node's. Pods' network namespaces,
// which containerd mounts under /run/netns, reach the host (where the agent
// opens them) because /run/netns is a shared mount and the namespace is
// made with --propagation unchanged.

// containerdNamespace is the containerd namespace the CRI plugin, and so
// the kubelet, uses.
const containerdNamespace = "k8s.io"

// ContainerdDir is the directory of the node's containerd.
func (l *Lab) ContainerdDir(node string) string { return filepath.Join(l.nodeDir(node), "containerd") }

// ContainerdSocket is the node's containerd gRPC socket (the kubelet's
// --container-runtime-endpoint, ctr's --address).
func (l *Lab) ContainerdSocket(node string) string {
	return filepath.Join(l.ContainerdDir(node), "containerd.sock")
}

// nodeCNIBinDir is the node's CNI plugin directory, its /opt/cni/bin.
func (l *Lab) nodeCNIBinDir(node string) string {
	return filepath.Join(l.ContainerdDir(node), "cni/bin")
}

// containerdConfig is the config.toml of a containerd whose files all live
// under dir. Its CRI plugin reads the standard CNI directories,
// /opt/cni/bin and /etc/cni/net.d, which in the node's mount namespace
// are the node's (nodeHostPaths).
func containerdConfig(dir string) string {
	q := func(p string) string { return fmt.Sprintf("%q", filepath.Join(dir, p)) }
	return `# Written by the Tabby lab: a containerd of one lab node.
version = 2
root = ` + q("root") + `
state = ` + q("state") + `
oom_score = 0

[grpc]
  address = ` + q("containerd.sock") + `

[ttrpc]
  address = ` + q("containerd.sock.ttrpc") + `

[plugins."io.containerd.internal.v1.opt"]
  path = ` + q("opt") + `

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "` + image.PauseName + `"
  # The kubelet asks for oom_score_adj -998 for sandboxes; lowering it needs
  # CAP_SYS_RESOURCE, which a lab host (itself a container) may lack: runc
  # then fails with "can't get final child's PID from pipe". Keep every
  # score at or above containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # The kubelet uses the cgroupfs driver: there is no systemd.
        SystemdCgroup = false
        Root = ` + q("runc") + `
`
}

// StartContainerd starts containerd for the node in the node's network
// namespace (nsenter --net, in a session of its own, with its output in
// <containerd dir>/containerd.log and no descriptor of this process but
// /dev/null on standard input) and waits until it serves. Teardown stops
// it and removes its directory.
func (l *Lab) StartContainerd(ctx context.Context, node string) (err error) {
	bin, err := exec.LookPath("containerd")
	if err != nil {
		return fmt.Errorf("containerd is not installed (apt-get install containerd): %w", err)
	}
	st := l.State()
	n := st.node(node)
	if n == nil {
		return fmt.Errorf("no node %q", node)
	}
	if n.Containerd.alive() {
		return fmt.Errorf("the containerd of %s is running (pid %d)", node, n.Containerd.PID)
	}
	dir := l.ContainerdDir(node)
	for _, d := range []string{"root", "state", "opt", "runc", "cni/bin"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return fmt.Errorf("creating containerd directories: %w", err)
		}
	}
	if err := l.linkCNIPlugins(st, filepath.Join(dir, "cni/bin")); err != nil {
		return err
	}
	script, err := l.writeNodeMounts(node, l.nodeCNIBinDir(node), filepath.Dir(l.conflistPath(node)))
	if err != nil {
		return err
	}
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(containerdConfig(dir)), 0o644); err != nil {
		return fmt.Errorf("writing containerd config: %w", err)
	}
	progress(l.log, "starting containerd on %s", node)
	// The shell named, so that its command line while it runs the script
	// is a tail of the one recorded (Proc.alive).
	argv := []string{"unshare", "--mount", "--propagation", "unchanged", "--", "/bin/sh", script, bin, "--config", cfg}
	p, done, err := startDetached("containerd "+node, n.NetNS, argv, filepath.Join(dir, "containerd.log"), pidFile(dir, "containerd"))
	if err != nil {
		return err
	}
	l.trackExit(p.PID, done)
	if err := l.update(func(s *State) error {
		if n := s.node(node); n != nil {
			n.Containerd = p
			return nil
		}
		return fmt.Errorf("node %q vanished while starting its containerd", node)
	}); err != nil {
		return errors.Join(err, p.stop(ctx, syscall.SIGKILL, time.Second, done))
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	sock := l.ContainerdSocket(node)
	err = poll(wctx, 50*time.Millisecond, func() (bool, error) {
		if !p.alive() {
			return false, fmt.Errorf("containerd on %s exited (%s): %s", node, p.describe(), logTail(p.Log))
		}
		c, err := net.Dial("unix", sock)
		if err != nil {
			return false, nil
		}
		return true, c.Close()
	})
	if err == nil {
		_, err = l.Ctr(wctx, node, "version")
	}
	if err != nil {
		return fmt.Errorf("containerd on %s does not serve on %s: %w", node, sock, err)
	}
	return nil
}

// cniPluginDir is where Debian's containernetworking-plugins are.
const cniPluginDir = "/usr/lib/cni"

// linkCNIPlugins fills the node containerd's CNI plugin directory: tabby
// from the lab's binaries when the lab runs agents, and Debian's plugins (loopback, which
// containerd's CRI plugin runs for every pod's lo, portmap, bridge,
// host-local…) when installed.
func (l *Lab) linkCNIPlugins(st *State, dst string) error {
	links := map[string]string{}
	// Without lab agents the plugin is install-cni's to copy (the
	// DaemonSet's), as on an operator's node.
	if st.BinDir != "" && !st.NoAgents {
		links[binCNI] = filepath.Join(st.BinDir, binCNI)
	}
	if entries, err := os.ReadDir(cniPluginDir); err == nil {
		for _, e := range entries {
			if _, ok := links[e.Name()]; !ok {
				links[e.Name()] = filepath.Join(cniPluginDir, e.Name())
			}
		}
	}
	for name, target := range links {
		p := filepath.Join(dst, name)
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if err := os.Symlink(target, p); err != nil {
			return fmt.Errorf("linking CNI plugin %s: %w", name, err)
		}
	}
	return nil
}

// sharedContainerdDirs are the directories containerd 1.6 makes outside
// its configured ones (the shims' sockets), deepest first.
var sharedContainerdDirs = []string{"/run/containerd/s", "/run/containerd"}

// removeEmptyContainerdDirs removes sharedContainerdDirs when they are
// empty: a lab's shims have exited by then, and a containerd of the host
// keeps its socket there, so its directory is never empty.
func removeEmptyContainerdDirs() {
	for _, d := range sharedContainerdDirs {
		_ = syscall.Rmdir(d) // ENOTEMPTY, ENOENT: someone else's, or gone
	}
}

// removeContainers kills and removes every task and container of the
// containerd serving on sock, and removes the pod network namespaces its
// tasks were in: containers outlive containerd, and a pod whose kubelet
// is gone never gets its sandbox stopped (nor its CNI DEL). Best effort
// when containerd does not answer; errors are returned.
func removeContainers(ctx context.Context, sock string) error {
	ctr := func(args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", sock, "--namespace", containerdNamespace}, args...)...)
		out, err := cmd.Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
			}
			return out, fmt.Errorf("ctr %s: %w", strings.Join(args, " "), err)
		}
		return out, nil
	}
	out, err := ctr("tasks", "list")
	if err != nil {
		return err
	}
	type task struct{ id, pid string }
	var tasks []task
	for _, line := range strings.Split(string(out), "\n")[1:] { // TASK PID STATUS
		if f := strings.Fields(line); len(f) >= 2 {
			tasks = append(tasks, task{f[0], f[1]})
		}
	}
	// Pod network namespaces: the /run/netns entries a task is in.
	netnsOf := map[uint64]string{}
	if entries, err := os.ReadDir(netnsDir); err == nil {
		for _, e := range entries {
			var st syscall.Stat_t
			if strings.HasPrefix(e.Name(), "cni-") && syscall.Stat(filepath.Join(netnsDir, e.Name()), &st) == nil {
				netnsOf[st.Ino] = filepath.Join(netnsDir, e.Name())
			}
		}
	}
	var podNetns []string
	var errs []error
	for _, t := range tasks {
		var st syscall.Stat_t
		if syscall.Stat("/proc/"+t.pid+"/ns/net", &st) == nil && netnsOf[st.Ino] != "" && !slices.Contains(podNetns, netnsOf[st.Ino]) {
			podNetns = append(podNetns, netnsOf[st.Ino])
		}
		// Ignored: a task that already stopped cannot be signalled.
		_, _ = ctr("tasks", "kill", "--signal", "SIGKILL", "--all", t.id)
	}
	// A task is deleted once it has stopped.
	err = poll(ctx, 50*time.Millisecond, func() (bool, error) {
		out, err := ctr("tasks", "list")
		return err == nil && !strings.Contains(string(out), "RUNNING"), nil
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("tasks still running after SIGKILL: %w", err))
	}
	// Gone already is success: the CRI plugin deletes the tasks of the
	// containers it sees exit.
	notFound := func(err error) bool { return err != nil && strings.Contains(err.Error(), "not found") }
	for _, t := range tasks {
		if _, err := ctr("tasks", "delete", t.id); err != nil && !notFound(err) {
			errs = append(errs, err)
		}
	}
	if out, err := ctr("containers", "list", "--quiet"); err == nil {
		for _, id := range strings.Fields(string(out)) {
			if _, err := ctr("containers", "delete", id); err != nil && !notFound(err) {
				errs = append(errs, err)
			}
		}
	} else {
		errs = append(errs, err)
	}
	for _, p := range podNetns {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting pod network namespace %s: %w", p, err))
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// StopContainerd removes the node's containers (removeContainers), stops
// its containerd (SIGTERM, SIGKILL after 10 s) and unmounts whatever is
// still mounted under its directory. Stop the kubelet first.
func (l *Lab) StopContainerd(ctx context.Context, node string) error {
	n := l.State().node(node)
	if n == nil {
		return fmt.Errorf("no node %q", node)
	}
	var errs []error
	if n.Containerd.alive() {
		errs = append(errs, removeContainers(ctx, l.ContainerdSocket(node)))
	}
	if n.Containerd != nil {
		progress(l.log, "stopping containerd on %s (pid %d)", node, n.Containerd.PID)
		errs = append(errs, n.Containerd.stop(ctx, syscall.SIGTERM, 10*time.Second, l.exitChan(n.Containerd.PID)))
	}
	errs = append(errs, unmountUnder(l.ContainerdDir(node)))
	removeEmptyContainerdDirs()
	return errors.Join(errs...)
}

// Ctr runs ctr against the node's containerd in its k8s.io namespace and
// returns its standard output.
func (l *Lab) Ctr(ctx context.Context, node string, args ...string) ([]byte, error) {
	argv := append([]string{"--address", l.ContainerdSocket(node), "--namespace", containerdNamespace}, args...)
	cmd := exec.CommandContext(ctx, "ctr", argv...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("ctr %s on %s: %w: %s", strings.Join(args, " "), node, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// ImportImages loads OCI (or docker save) archives into the node's
// containerd, where the kubelet finds them (`ctr -n k8s.io images import`).
func (l *Lab) ImportImages(ctx context.Context, node string, archives ...string) error {
	for _, a := range archives {
		if _, err := l.Ctr(ctx, node, "images", "import", a); err != nil {
			return fmt.Errorf("importing %s: %w", a, err)
		}
	}
	return nil
}

// Images lists the references of the node's images, sorted, without the
// sha256:… ID references the CRI plugin adds.
func (l *Lab) Images(ctx context.Context, node string) ([]string, error) {
	out, err := l.Ctr(ctx, node, "images", "list", "--quiet")
	if err != nil {
		return nil, err
	}
	var refs []string
	for _, r := range strings.Fields(string(out)) {
		if !strings.HasPrefix(r, "sha256:") {
			refs = append(refs, r)
		}
	}
	slices.Sort(refs)
	return refs, nil
}

// mountsUnder lists the mount points at or below dir in this process's
// mount namespace, deepest first.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dir = filepath.Clean(dir)
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return out, nil
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space…).
func unescapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder detaches every mount at or below dir, deepest first, so
// that removing dir never walks into a mounted file system (a snapshot, a
// pod volume, a bind mount of a host directory).
func unmountUnder(dir string) error {
	mps, err := mountsUnder(dir)
	if err != nil {
		return fmt.Errorf("listing mounts under %s: %w", dir, err)
	}
	var errs []error
	for _, mp := range mps {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

// logTail is the last lines of a log file, for an error message.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, "\n") + " (log: " + path + ")"
}
