package kube

import (
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
	"github.com/tabbynet/tabby/lab"
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

// nodeCNIBinDir is the node's CNI plugin directory, its /opt/cni/bin.
func (l *Cluster) nodeCNIBinDir(node string) string {
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
func (l *Cluster) StartContainerd(ctx context.Context, node string) (err error) {
	bin, err := exec.LookPath("containerd")
	if err != nil {
		return fmt.Errorf("containerd is not installed (apt-get install containerd): %w", err)
	}
	st := l.State()
	n, err := st.NodeToStart(node, "containerd", func(n *lab.NodeState) *lab.Proc { return n.Containerd })
	if err != nil {
		return err
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
	script, err := l.writeNodeMounts(node, l.nodeCNIBinDir(node), filepath.Dir(l.ConflistPath(node)))
	if err != nil {
		return err
	}
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(containerdConfig(dir)), 0o644); err != nil {
		return fmt.Errorf("writing containerd config: %w", err)
	}
	l.Progress("starting containerd on %s", node)
	// The shell named, so that its command line while it runs the script
	// is a tail of the one recorded (Proc.alive).
	argv := []string{"unshare", "--mount", "--propagation", "unchanged", "--", "/bin/sh", script, bin, "--config", cfg}
	p, done, err := l.StartDetached("containerd "+node, n.NetNS, argv, filepath.Join(dir, "containerd.log"), lab.PIDFile(dir, "containerd"))
	if err != nil {
		return err
	}
	if err := l.Update(func(s *lab.State) error {
		if n := s.Node(node); n != nil {
			n.Containerd = p
			return nil
		}
		return fmt.Errorf("node %q vanished while starting its containerd", node)
	}); err != nil {
		return errors.Join(err, p.Stop(ctx, syscall.SIGKILL, time.Second, done))
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	sock := l.ContainerdSocket(node)
	err = lab.Poll(wctx, 50*time.Millisecond, func() (bool, error) {
		if !p.Alive() {
			return false, fmt.Errorf("containerd on %s exited (%s): %s", node, p.Describe(), logTail(p.Log))
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
func (l *Cluster) linkCNIPlugins(st *lab.State, dst string) error {
	links := map[string]string{}
	// Without lab agents the plugin is install-cni's to copy (the
	// DaemonSet's), as on an operator's node.
	if st.BinDir != "" && !st.NoAgents {
		links[lab.BinCNI] = filepath.Join(st.BinDir, lab.BinCNI)
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

// Ctr runs ctr against the node's containerd in its k8s.io namespace and
// returns its standard output.
func (l *Cluster) Ctr(ctx context.Context, node string, args ...string) ([]byte, error) {
	argv := append([]string{"--address", l.ContainerdSocket(node), "--namespace", lab.ContainerdNamespace}, args...)
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
func (l *Cluster) ImportImages(ctx context.Context, node string, archives ...string) error {
	for _, a := range archives {
		if _, err := l.Ctr(ctx, node, "images", "import", a); err != nil {
			return fmt.Errorf("importing %s: %w", a, err)
		}
	}
	return nil
}

// Images lists the references of the node's images, sorted, without the
// sha256:… ID references the CRI plugin adds.
func (l *Cluster) Images(ctx context.Context, node string) ([]string, error) {
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
