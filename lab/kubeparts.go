package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// What the lab records and removes of the Kubernetes parts that package
// lab/kube starts (control plane, containerd, kubelets): their processes and
// cgroup roots are in the lab's State, so that Down and Teardown remove them
// from any program, also after the program that started them died.

// ControlPlane is the lab's Kubernetes control plane, once started.
type ControlPlane struct {
	APIServer         *Proc `json:"apiserver,omitempty"`
	ControllerManager *Proc `json:"controllerManager,omitempty"`
	Scheduler         *Proc `json:"scheduler,omitempty"`
}

func (c *ControlPlane) procs() []*Proc {
	if c == nil {
		return nil
	}
	var ps []*Proc
	// Controllers before the API server they talk to.
	for _, p := range []*Proc{c.ControllerManager, c.Scheduler, c.APIServer} {
		if p != nil {
			ps = append(ps, p)
		}
	}
	return ps
}

// ContainerdNamespace is the containerd namespace the CRI plugin, and so
// the kubelet, uses.
const ContainerdNamespace = "k8s.io"

// ContainerdDir is the directory of the node's containerd.
func (l *Lab) ContainerdDir(node string) string { return filepath.Join(l.NodeDir(node), "containerd") }

// ContainerdSocket is the node's containerd gRPC socket (the kubelet's
// --container-runtime-endpoint, ctr's --address).
func (l *Lab) ContainerdSocket(node string) string {
	return filepath.Join(l.ContainerdDir(node), "containerd.sock")
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

// RemoveContainers kills and removes every task and container of the
// containerd serving on sock, and removes the pod network namespaces its
// tasks were in: containers outlive containerd, and a pod whose kubelet
// is gone never gets its sandbox stopped (nor its CNI DEL). Best effort
// when containerd does not answer; errors are returned.
func RemoveContainers(ctx context.Context, sock string) error {
	ctr := func(args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", sock, "--namespace", ContainerdNamespace}, args...)...)
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
	if entries, err := os.ReadDir(NetNSDir); err == nil {
		for _, e := range entries {
			var st syscall.Stat_t
			if strings.HasPrefix(e.Name(), "cni-") && syscall.Stat(filepath.Join(NetNSDir, e.Name()), &st) == nil {
				netnsOf[st.Ino] = filepath.Join(NetNSDir, e.Name())
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
	err = Poll(ctx, 50*time.Millisecond, func() (bool, error) {
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
	n := l.State().Node(node)
	if n == nil {
		return fmt.Errorf("no node %q", node)
	}
	var errs []error
	if n.Containerd.Alive() {
		errs = append(errs, RemoveContainers(ctx, l.ContainerdSocket(node)))
	}
	if n.Containerd != nil {
		progress(l.log, "stopping containerd on %s (pid %d)", node, n.Containerd.PID)
		errs = append(errs, n.Containerd.Stop(ctx, syscall.SIGTERM, 10*time.Second, l.exitChan(n.Containerd.PID)))
	}
	errs = append(errs, unmountUnder(l.ContainerdDir(node)))
	removeEmptyContainerdDirs()
	return errors.Join(errs...)
}

// MountsUnder lists the mount points at or below dir in this process's
// mount namespace, deepest first.
func MountsUnder(dir string) ([]string, error) {
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
	mps, err := MountsUnder(dir)
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

// KubeletDir is the node kubelet's root directory and configuration.
func (l *Lab) KubeletDir(node string) string { return filepath.Join(l.NodeDir(node), "kubelet") }

// CgroupV1Root is where the cgroup v1 hierarchies are mounted.
const CgroupV1Root = "/sys/fs/cgroup"

// CgroupHierarchies lists the mounted cgroup hierarchies' directories:
// the v1 ones (cpu, memory, systemd, …) and, on a hybrid host, the unified
// one, where runc creates the same paths.
func CgroupHierarchies() ([]string, error) {
	var statfs unix.Statfs_t
	if err := unix.Statfs(CgroupV1Root, &statfs); err != nil {
		return nil, err
	}
	if statfs.Type == unix.CGROUP2_SUPER_MAGIC {
		return nil, errors.New("this host has cgroup v2 only; the lab's kubelet setup is for v1 or hybrid hosts")
	}
	entries, err := os.ReadDir(CgroupV1Root)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		p := filepath.Join(CgroupV1Root, e.Name())
		var st unix.Statfs_t
		if !e.IsDir() || unix.Statfs(p, &st) != nil || (st.Type != unix.CGROUP_SUPER_MAGIC && st.Type != unix.CGROUP2_SUPER_MAGIC) {
			continue
		}
		if slices.Contains(out, p) {
			continue
		}
		// cpu,cpuacct style links point at one hierarchy: keep one.
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

// removeCgroupRoot removes the cgroup root and everything the kubelet made
// below it, deepest first, in every hierarchy. A cgroup that still holds a
// process cannot be removed: that is an error (a pod outlived teardown).
func removeCgroupRoot(root string) error {
	dirs, err := cgroupDirs(root)
	var errs []error
	for _, d := range slices.Backward(dirs) {
		if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
		}
	}
	return errors.Join(append(errs, err)...)
}

// cgroupDirs lists a lab's cgroup root and every cgroup below it in every
// hierarchy, each parent before its children; with an error, those it
// could list. It refuses a root that is not a lab's.
func cgroupDirs(root string) ([]string, error) {
	if root == "" || root == "/" || !strings.HasPrefix(root, "/tabby-lab-") {
		return nil, fmt.Errorf("refusing cgroup %q: not a lab's", root)
	}
	hs, err := CgroupHierarchies()
	if err != nil {
		return nil, err
	}
	var dirs []string
	var errs []error
	for _, h := range hs {
		err := filepath.WalkDir(filepath.Join(h, root), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return err
		})
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return dirs, errors.Join(errs...)
}

// StopKubelet stops the node's kubelet (SIGTERM, SIGKILL after 10 s) and
// removes its cgroups (which fails while pods' containers are in them).
func (l *Lab) StopKubelet(ctx context.Context, node string) error {
	if err := l.stopKubeletProc(ctx, node); err != nil {
		return err
	}
	return l.removeKubeletCgroups(node)
}

func (l *Lab) stopKubeletProc(ctx context.Context, node string) error {
	n := l.State().Node(node)
	if n == nil {
		return fmt.Errorf("no node %q", node)
	}
	if n.Kubelet == nil {
		return nil
	}
	progress(l.log, "stopping kubelet on %s (pid %d)", node, n.Kubelet.PID)
	return n.Kubelet.Stop(ctx, syscall.SIGTERM, 10*time.Second, l.exitChan(n.Kubelet.PID))
}

func (l *Lab) removeKubeletCgroups(node string) error {
	if n := l.State().Node(node); n != nil && n.CgroupRoot != "" {
		return removeCgroupRoot(n.CgroupRoot)
	}
	return nil
}

// PowerOffKubeNode stops what a node runs for Kubernetes as a power cut
// would: its kubelet, every container (SIGKILL: the agent too),
// containerd and kube-proxy. The node's namespace and the Kubernetes Node
// stay.
func (l *Lab) PowerOffKubeNode(ctx context.Context, node string) error {
	if l.State().Node(node) == nil {
		return fmt.Errorf("no node %q", node)
	}
	// The kubelet first (nothing restarts the containers), then the
	// containers, which outlive containerd, then containerd; the pods'
	// cgroups can go once their processes are gone.
	errs := []error{l.stopKubeletProc(ctx, node)}
	if l.State().Node(node).Containerd.Alive() {
		errs = append(errs, RemoveContainers(ctx, l.ContainerdSocket(node)))
	}
	errs = append(errs, l.StopContainerd(ctx, node), l.removeKubeletCgroups(node))
	if p := l.State().Node(node).KubeProxy; p != nil {
		errs = append(errs, p.Stop(ctx, syscall.SIGKILL, 5*time.Second, l.exitChan(p.PID)))
	}
	return errors.Join(errs...)
}

// StopKubeProxy stops the node's kube-proxy (SIGTERM, SIGKILL after 5 s).
// Its rules stay in the node's namespace (kube-proxy leaves them on exit).
func (l *Lab) StopKubeProxy(ctx context.Context, node string) error {
	n := l.State().Node(node)
	if n == nil {
		return fmt.Errorf("no node %q", node)
	}
	if n.KubeProxy == nil {
		return nil
	}
	progress(l.log, "stopping kube-proxy on %s (pid %d)", node, n.KubeProxy.PID)
	return n.KubeProxy.Stop(ctx, syscall.SIGTERM, 5*time.Second, l.exitChan(n.KubeProxy.PID))
}

// sweepNode kills what a node's containerd left when it died before Down
// could remove its tasks, once the lab's own processes are stopped: its
// shims (which outlive it, in no cgroup of the lab's: found by the socket
// they name, the node's, under the lab's directory) and the processes left
// in the node's cgroup root (the pods', which keep the cgroups busy). The
// runtime's pod network namespaces (/run/netns/cni-…) those processes
// were in are deleted too, as containerd would have with the pods. Only
// those processes are touched, and only namespaces one of them was in.
func sweepNode(ctx context.Context, root, sock string, log io.Writer) error {
	dirs, err := cgroupDirs(root)
	if err != nil {
		return err
	}
	type nsID struct{ dev, ino uint64 }
	netns := map[nsID]bool{}
	var left []*Proc
	for _, d := range dirs {
		b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs")) // gone meanwhile: nothing in it
		for _, f := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(f)
			var st unix.Stat_t
			if p := procOf(pid, "a process left in "+root); p != nil && unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) == nil {
				netns[nsID{st.Dev, st.Ino}] = true
				left = append(left, p)
			}
		}
	}
	left = append(left, shimsOf(sock)...)
	if len(left) == 0 {
		return nil
	}
	progress(log, "stopping %d processes its containerd left (%s)", len(left), root)
	var errs []error
	for _, p := range left {
		errs = append(errs, p.Stop(ctx, syscall.SIGKILL, 10*time.Second, nil))
	}
	entries, err := os.ReadDir(NetNSDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range entries {
		var st unix.Stat_t
		if !strings.HasPrefix(e.Name(), "cni-") || unix.Stat(filepath.Join(NetNSDir, e.Name()), &st) != nil || !netns[nsID{st.Dev, st.Ino}] {
			continue
		}
		progress(log, "deleting pod namespace %s", e.Name())
		if err := ip(ctx, "netns", "delete", e.Name()); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// procOf describes the running process pid as a Proc (its command line and
// start time, which Stop checks against pid reuse); nil when it is gone.
func procOf(pid int, role string) *Proc {
	start, err := procStartTime(pid)
	if err != nil || pid <= 0 {
		return nil
	}
	b, err := readCmdline(pid)
	if err != nil || len(b) == 0 {
		return nil
	}
	p := &Proc{Role: role, PID: pid, Argv: strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00"), StartTime: start}
	if !p.Alive() {
		return nil
	}
	return p
}

// shimsOf returns the containerd shims serving the containerd at sock
// (their command line names it after -address).
func shimsOf(sock string) []*Proc {
	entries, _ := os.ReadDir("/proc")
	var out []*Proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		// One read first: a kernel thread's empty command line would make
		// procOf wait for one.
		b, err := readCmdlineOnce(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.HasPrefix(filepath.Base(strings.SplitN(string(b), "\x00", 2)[0]), "containerd-shim") {
			continue
		}
		p := procOf(pid, "a containerd shim")
		if p == nil {
			continue
		}
		for i := 0; i+1 < len(p.Argv); i++ {
			if p.Argv[i] == "-address" && p.Argv[i+1] == sock {
				out = append(out, p)
			}
		}
	}
	return out
}
