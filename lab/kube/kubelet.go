package kube

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/tabbynet/tabby/lab"
)

// A lab node's kubelet runs in the node's network namespace and in its
// mount namespace, containerd's (StartContainerd first; see
// nodeMountScript), keeps its files under <node dir>/kubelet and its pods'
// cgroups under a cgroup root of its own in every cgroup v1 hierarchy: it
// changes nothing of the host.

// KubeletOptions say how a node's kubelet reaches its API server. The
// zero value registers it with the lab's own control plane
// (StartControlPlane), with a client certificate of the lab's CA.
type KubeletOptions struct {
	// Server is the API server's URL as seen from the node's network
	// namespace, e.g. https://127.0.0.1:6443 through ListenIn.
	Server string
	// Token authenticates the kubelet as system:node:<node> (group
	// system:nodes).
	Token string
}

// kubeletCgroupRoot is the node's kubelet's cgroup root: one per lab node,
// so that labs and nodes never share pods' cgroups.
func kubeletCgroupRoot(lab, node string) string { return "/tabby-lab-" + lab + "-" + node }

// makeCgroupRoot creates the cgroup root in every v1 hierarchy, with
// cpuset's cpus and mems copied from the parent (a cpuset cgroup without
// them takes no children).
func makeCgroupRoot(root string) error {
	hs, err := lab.CgroupHierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		d := filepath.Join(h, root)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("creating cgroup %s: %w", d, err)
		}
		if _, err := os.Stat(filepath.Join(h, "cpuset.cpus")); err != nil || filepath.Base(h) != "cpuset" {
			continue
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			b, err := os.ReadFile(filepath.Join(h, f))
			if err == nil {
				err = os.WriteFile(filepath.Join(d, f), b, 0o644)
			}
			if err != nil {
				return fmt.Errorf("setting %s of %s: %w", f, d, err)
			}
		}
	}
	return nil
}

// kubeletTunables are the kernel settings the kubelet checks at start
// (pkg/kubelet/cm setupKernelTunables) with the values it wants. They are
// not per network namespace: a kubelet allowed to would set them for the
// whole host (kernel.panic_on_oops=1 among them).
var kubeletTunables = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// nodeHostPath is a host path a pod of the node mounts (the DaemonSet's
// hostPath volumes): in the node's mount namespace it is a bind mount of
// Src, a directory of the node, so that kubelets sharing one host never
// share it.
type nodeHostPath struct {
	// Target is the path as the node sees it, symbolic links of the host
	// resolved (/var/run/tabby is /run/tabby, /lib/modules
	// /usr/lib/modules).
	Target string
	// Src is the node's directory bound there.
	Src string
	// Cover is the deepest directory above Target the host has, when the
	// host lacks Target: the node's mount namespace lays an overlay over it
	// (the host's files read through, anything created goes to a tmpfs of
	// the node), so that Target's mount point is never made on the host.
	Cover string
}

// nodeHostPaths are the host paths of the manifests' DaemonSet
// (manifests/tabby-etcd.yaml), each the node's own: the CNI plugin and
// configuration directories (containerd's CRI plugin reads the standard
// ones, where install-cni writes), the agent's sockets and state, and the
// kernel modules the agent mounts read-only (none here: nftables over
// netlink loads nothing). /var/run/netns stays the host's: pod namespaces
// must reach the lab. exists says whether the host has a path (os.Stat in
// writeNodeMounts; a stub in tests).
func nodeHostPaths(nodeDir, cniBin, cniConf string, resolve func(string) string, exists func(string) bool) []nodeHostPath {
	host := filepath.Join(nodeDir, "host")
	want := []nodeHostPath{
		{Target: "/opt/cni/bin", Src: cniBin},
		{Target: "/etc/cni/net.d", Src: cniConf},
		{Target: "/var/run/tabby", Src: filepath.Join(host, "run-tabby")},
		{Target: "/var/lib/tabby", Src: filepath.Join(host, "var-lib-tabby")},
		{Target: "/lib/modules", Src: filepath.Join(host, "lib-modules")},
	}
	for i := range want {
		hp := &want[i]
		// Resolve the links in the parent: /var/run → /run, /lib → usr/lib.
		hp.Target = filepath.Join(resolve(filepath.Dir(hp.Target)), filepath.Base(hp.Target))
		if exists(hp.Target) {
			continue
		}
		for c := filepath.Dir(hp.Target); ; c = filepath.Dir(c) {
			if exists(c) || c == "/" {
				hp.Cover = c
				break
			}
		}
	}
	return want
}

// resolveHostPath resolves the symbolic links of p's longest existing
// prefix on the host.
func resolveHostPath(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	if d := filepath.Dir(p); d != p {
		return filepath.Join(resolveHostPath(d), filepath.Base(p))
	}
	return p
}

// netnsDirMount is the host's pod network namespaces' directory, a shared
// mount that the node's mount namespace keeps.
const netnsDirMount = "/run/netns"

// nodeMountScript sets up the node's mount namespace (the caller runs it
// under `unshare --mount --propagation unchanged`, so that /run/netns stays
// shared with the host) and execs its arguments (containerd):
//   - the mounts holding /proc and /var/log are made slaves, so that what
//     is mounted on them here never reaches the host;
//   - each tunable the kubelet checks is a bind mount of a file holding the
//     value it wants. With protectKernelDefaults the kubelet finds them as
//     it wants and changes nothing; were a bind mount missing, it would
//     stop with an error instead of writing the host's;
//   - /var/log is the node's (the kubelet writes /var/log/containers);
//   - each of hostPaths is the node's directory; a missing one's Cover gets
//     an overlay whose writes go to a tmpfs of the node. An overlay hides
//     the mounts below its directory: /run/netns, under /run, is moved back
//     on top of it (still in the host's peer group, so the namespaces
//     containerd mounts there reach the host);
//   - the node's / is made shared (a peer group of the node's own).
func nodeMountScript(dir string, hostPaths []nodeHostPath, keep []string) string {
	var b strings.Builder
	b.WriteString("#!/bin/sh\n# Written by the Tabby lab: the mount namespace of one lab node.\nset -eu\n")
	b.WriteString("mount --make-rslave /proc\n")
	b.WriteString("mount --make-slave \"$(findmnt --noheadings --output TARGET --target /var/log)\"\n")
	keys := make([]string, 0, len(kubeletTunables))
	for k := range kubeletTunables {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "mount --bind %s /proc/sys/%s\n", filepath.Join(dir, "sysctl", strings.ReplaceAll(k, "/", ".")), k)
	}
	fmt.Fprintf(&b, "mount --bind %s /var/log\n", filepath.Join(dir, "log"))
	var covered []string
	for _, hp := range hostPaths {
		if hp.Cover == "" || slices.Contains(covered, hp.Cover) {
			continue
		}
		c := filepath.Join(dir, "cover", strconv.Itoa(len(covered)))
		covered = append(covered, hp.Cover)
		fmt.Fprintf(&b, "mount --make-slave \"$(findmnt --noheadings --output TARGET --target %s)\"\n", hp.Cover)
		fmt.Fprintf(&b, "mkdir -p %s\nmount -t tmpfs -o mode=0755 tabby-node %s\nmkdir %s/upper %s/work\n", c, c, c, c)
		// What lies under the covered directory and must stay the host's
		// (the pods' network namespaces, the lab's own directory): a
		// descriptor opened before the overlay still names it, and a bind
		// of it goes back on top.
		var kept []string
		for _, k := range keep {
			if strings.HasPrefix(k, hp.Cover+"/") {
				fmt.Fprintf(&b, "exec %d<%s\n", 3+len(kept), k)
				kept = append(kept, k)
			}
		}
		fmt.Fprintf(&b, "mount -t overlay -o lowerdir=%s,upperdir=%s/upper,workdir=%s/work tabby-node %s\n", hp.Cover, c, c, hp.Cover)
		for i, k := range kept {
			fmt.Fprintf(&b, "mount --no-canonicalize --rbind /proc/self/fd/%d %s\nexec %d<&-\n", 3+i, k, 3+i)
		}
	}
	for _, hp := range hostPaths {
		if hp.Cover != "" {
			fmt.Fprintf(&b, "mkdir -p %s\n", hp.Target)
		} else {
			fmt.Fprintf(&b, "mount --make-slave \"$(findmnt --noheadings --output TARGET --target %s)\"\n", hp.Target)
		}
		fmt.Fprintf(&b, "mount --bind %s %s\n", hp.Src, hp.Target)
	}
	if len(hostPaths) > 0 {
		// Last, once nothing more is mounted here for the node: its root
		// shared, in a peer group of its own (the host's root is private
		// on a lab host), as on a systemd node. containerd refuses
		// HostToContainer propagation (the DaemonSet's /var/run/netns)
		// from a mount that is neither shared nor slave, and it finds
		// /var/run/netns on / (it does not resolve /var/run).
		b.WriteString("mount --make-shared /\n")
	}
	b.WriteString("exec \"$@\"\n")
	return b.String()
}

// writeNodeMounts writes the node's mount script and the files it binds,
// under <node dir>/mounts, makes the node's host path directories, and
// returns the script's path.
func (l *Cluster) writeNodeMounts(node, cniBin, cniConf string) (string, error) {
	dir := filepath.Join(l.NodeDir(node), "mounts")
	for _, d := range []string{"sysctl", "log"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return "", fmt.Errorf("creating node mount directories: %w", err)
		}
	}
	for k, v := range kubeletTunables {
		if err := os.WriteFile(filepath.Join(dir, "sysctl", strings.ReplaceAll(k, "/", ".")), []byte(v+"\n"), 0o644); err != nil {
			return "", err
		}
	}
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	hps := nodeHostPaths(l.NodeDir(node), cniBin, cniConf, resolveHostPath, exists)
	for _, hp := range hps {
		if err := os.MkdirAll(hp.Src, 0o755); err != nil {
			return "", fmt.Errorf("creating node host path directory: %w", err)
		}
	}
	script := filepath.Join(dir, "mounts.sh")
	// The lab's directory may lie under a covered one (/run/tabby-lab):
	// the node's processes must see the host's, where the lab looks.
	keep := []string{netnsDirMount, resolveHostPath(l.Dir())}
	if err := os.WriteFile(script, []byte(nodeMountScript(dir, hps, keep)), 0o755); err != nil {
		return "", fmt.Errorf("writing node mount script: %w", err)
	}
	return script, nil
}

// NodeHostDir is the node's directory that is bound at a host path p of
// the DaemonSet (/var/run/tabby, /var/lib/tabby, …; links resolved as on
// the host) in the node's mount namespace; "" when p is none of them.
func (l *Cluster) NodeHostDir(node, p string) string {
	exists := func(string) bool { return true }
	p = filepath.Join(resolveHostPath(filepath.Dir(p)), filepath.Base(p))
	for _, hp := range nodeHostPaths(l.NodeDir(node), l.nodeCNIBinDir(node), filepath.Dir(l.ConflistPath(node)), resolveHostPath, exists) {
		if hp.Target == p {
			return hp.Src
		}
	}
	return ""
}

// kubeletConfig is the node kubelet's KubeletConfiguration. With a
// clientCAFile the kubelet authenticates its clients (the API server,
// for logs and exec) by their certificates; without one nobody.
func kubeletConfig(dir, containerdSocket, cgroupRoot, clientCAFile string) string {
	x509 := ""
	if clientCAFile != "" {
		x509 = `
  x509:
    clientCAFile: ` + clientCAFile
	}
	return `# Written by the Tabby lab: the kubelet of one lab node.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This host mounts cgroup v1 (hybrid); the kubelet refuses v1 by default.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: ` + cgroupRoot + `
cgroupsPerQOS: true
containerRuntimeEndpoint: unix://` + containerdSocket + `
podLogsDir: ` + filepath.Join(dir, "pod-logs") + `
resolvConf: ` + filepath.Join(dir, "resolv.conf") + `
protectKernelDefaults: true
failSwapOn: false
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false` + x509 + `
authorization:
  mode: AlwaysAllow
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
# Many kubelets share one disk: no disk-pressure evictions or image GC.
evictionHard:
  memory.available: "0%"
  nodefs.available: "0%"
  imagefs.available: "0%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusUpdateFrequency: 4s
syncFrequency: 10s
# The cluster's DNS (DeployDNS): pods of dnsPolicy ClusterFirst get it as
# their nameserver, with the cluster domain's search path.
clusterDNS:
- ` + DNSServiceIP + `
clusterDomain: ` + ClusterDomain + `
`
}

// kubeconfig is a kubeconfig for the kubelet: the server (its certificate
// unchecked: the lab's API server makes its own) and the node's token.
func kubeconfig(server, token string) string {
	return kubeconfigWith(server, "insecure-skip-tls-verify: true", "token: "+token)
}

// kubeconfigWith is a kubeconfig of one cluster (server and how its
// certificate is checked) and one user (how it authenticates).
func kubeconfigWith(server, clusterTLS, userAuth string) string {
	return `apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster:
    server: ` + server + `
    ` + clusterTLS + `
users:
- name: user
  user:
    ` + userAuth + `
contexts:
- name: lab
  context:
    cluster: lab
    user: user
current-context: lab
`
}

// StartKubelet starts the node's kubelet (kubelet from the Kubernetes
// binaries cache; see kube/kubetest.Require) registering the node under
// its lab name. Teardown stops it and removes its cgroups and directory.
func (l *Cluster) StartKubelet(ctx context.Context, node, kubeletBin string, o KubeletOptions) error {
	st := l.State()
	n := st.Node(node)
	if n == nil {
		return fmt.Errorf("no node %q", node)
	}
	if !n.Containerd.Alive() {
		return fmt.Errorf("the kubelet of %s needs the node's containerd: start it first", node)
	}
	if n.Kubelet.Alive() {
		return fmt.Errorf("the kubelet of %s is running (pid %d)", node, n.Kubelet.PID)
	}
	dir := l.KubeletDir(node)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating kubelet directory: %w", err)
	}
	kc, clientCA := kubeconfig(o.Server, o.Token), ""
	if o.Server == "" {
		var err error
		if kc, clientCA, err = l.kubeletCredentials(node); err != nil {
			return err
		}
	}
	files := map[string]string{
		"config.yaml": kubeletConfig(dir, l.ContainerdSocket(node), kubeletCgroupRoot(st.Name, node), clientCA),
		"kubeconfig":  kc,
		// No upstream DNS: the lab reaches nothing outside. Pods of
		// dnsPolicy ClusterFirst get the cluster's DNS (clusterDNS).
		"resolv.conf": "",
	}
	for name, content := range files {
		mode := os.FileMode(0o644)
		if name == "kubeconfig" {
			mode = 0o600
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), mode); err != nil {
			return fmt.Errorf("writing kubelet %s: %w", name, err)
		}
	}
	// Recorded before it exists, so that Teardown removes it whatever
	// happens next.
	cgroupRoot := kubeletCgroupRoot(st.Name, node)
	if err := l.Update(func(s *lab.State) error {
		if n := s.Node(node); n != nil {
			n.CgroupRoot = cgroupRoot
			return nil
		}
		return fmt.Errorf("node %q vanished while starting its kubelet", node)
	}); err != nil {
		return err
	}
	if err := makeCgroupRoot(cgroupRoot); err != nil {
		return err
	}
	// In the node's mount namespace, containerd's (see nodeMountScript).
	argv := []string{"nsenter", fmt.Sprintf("--mount=/proc/%d/ns/mnt", n.Containerd.PID), "--",
		kubeletBin,
		"--config=" + filepath.Join(dir, "config.yaml"),
		"--kubeconfig=" + filepath.Join(dir, "kubeconfig"),
		"--root-dir=" + filepath.Join(dir, "root"),
		"--cert-dir=" + filepath.Join(dir, "pki"),
		"--hostname-override=" + node,
		"--node-ip=" + n.IP.Addr().String(),
		"--v=2",
	}
	l.Progress("starting kubelet on %s (cgroup root %s)", node, cgroupRoot)
	p, _, err := l.StartDetached("kubelet "+node, n.NetNS, argv, filepath.Join(dir, "kubelet.log"), lab.PIDFile(dir, "kubelet"))
	if err != nil {
		return err
	}
	return l.Update(func(s *lab.State) error {
		if n := s.Node(node); n != nil {
			n.Kubelet = p
			return nil
		}
		return fmt.Errorf("node %q vanished while starting its kubelet", node)
	})
}
