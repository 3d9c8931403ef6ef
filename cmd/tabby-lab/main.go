// Command tabby-lab builds a Tabby cluster out of network namespaces on one
// machine (as root): a fabric bridge, a top-of-rack router, etcd, nodes
// running tabby-agent and pods wired up by the CNI plugin. See package
// github.com/tabbynet/tabby/lab (and lab/kube for --kubernetes).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/internal/cmdutil"
	"github.com/tabbynet/tabby/internal/version"
	"github.com/tabbynet/tabby/kube/kubebins"
	"github.com/tabbynet/tabby/lab"
	"github.com/tabbynet/tabby/lab/kube"
)

func main() {
	cmdutil.Main("tabby-lab", func(ctx context.Context) error { return newRoot().ExecuteContext(ctx) })
}

// exitError carries the exit status of a command run by `exec`.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// ExitCode implements cmdutil.ExitCoder: tabby-lab exits with it.
func (e *exitError) ExitCode() int { return e.code }

type globalFlags struct {
	name, runDir string
}

func newRoot() *cobra.Command {
	g := &globalFlags{}
	root := &cobra.Command{
		Use:           "tabby-lab",
		Short:         "An N-node Tabby cluster in network namespaces",
		Version:       version.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.name, "name", lab.DefaultName, "lab name, the prefix of its namespaces")
	root.PersistentFlags().StringVar(&g.runDir, "run-dir", lab.DefaultRunDir, "directory holding one directory per lab")
	root.AddCommand(upCmd(g), downCmd(g), statusCmd(g), execCmd(g), kubectlCmd(g), podCmd(g), nodeCmd(g), demoCmd(g), etcdCmd(), etcdProxyCmd(), floorWatchCmd(), simCmd(g), cniCmd(), benchCmd(g))
	return root
}

// upOptions holds the flags shared by up and demo.
type upOptions struct {
	nodes, rrs, pods int
	autoRRs, zones   int
	reflectorPeering string
	etcdMembers      int
	binDir           string
	noAgents         bool
	etcdProxy        bool
	relay            bool
	dualStack        bool
	ipv6Only         bool
	ipv6OnlyFabric   bool
	twoSubnets       bool
	vxlanMode        string
	agentArgs        []string
	ipv4Pool         netip.Prefix
	converge         time.Duration
	// Kubernetes (--kubernetes): where the manifests and the images are.
	kubernetes             bool
	manifestDir, imagesDir string
	kubeProxy              string
}

func (u *upOptions) register(c *cobra.Command, nodes, pods int) {
	c.Flags().IntVar(&u.nodes, "nodes", nodes, "number of nodes")
	c.Flags().IntVar(&u.rrs, "route-reflectors", 0, "make the first K nodes route reflectors (mesh off)")
	c.Flags().IntVar(&u.autoRRs, "auto-reflectors", 0, "mesh off, routeReflectorMode Auto: the agents elect K route reflectors per zone (docs/bgp.md); none is chosen at start")
	c.Flags().StringVar(&u.reflectorPeering, "reflector-peering", "", "with --auto-reflectors: routeReflectorPeering, how the reflectors of different zones peer: NonClient (the default) or Client (Calico's rule)")
	c.Flags().IntVar(&u.zones, "zones", 2, "with --auto-reflectors: spread the nodes over this many zones (label topology.kubernetes.io/zone: zone-a, zone-b, …)")
	c.Flags().IntVar(&u.pods, "pods-per-node", pods, "pods to add on each node")
	c.Flags().IntVar(&u.etcdMembers, "etcd-members", 1, fmt.Sprintf("members of the lab's etcd cluster (1-%d); agents get every member's endpoint", lab.MaxEtcdMembers))
	c.Flags().StringVar(&u.binDir, "bin-dir", "", "directory with tabby-agent and tabby (default $TABBY_BIN, then this program's directory, else go build)")
	c.Flags().BoolVar(&u.dualStack, "dual-stack", false, "IPv6 underlay (2001:db8::/64) and an IPv6 pool ("+lab.PodPool6+") beside the IPv4 ones: every pod gets an address of each family")
	c.Flags().BoolVar(&u.ipv6OnlyFabric, "ipv6-only", false, "an IPv6-only fabric (2001:db8::/64, no IPv4 on the ToR, etcd or the nodes): IPv6-only nodes (agents with --node-ip none), IPv6 BGP sessions, IPv6-only pods from "+lab.PodPool6)
	c.Flags().BoolVar(&u.ipv6Only, "ipv6", false, "like --dual-stack, but every pod gets an IPv6 address only (the underlay keeps IPv4 for etcd and the BGP sessions, which carry IPv6)")
	c.Flags().BoolVar(&u.twoSubnets, "two-subnets", false, "nodes in two underlay subnets (198.18.0.0/24, 198.18.1.0/24: node1, node3, … and node2, node4, …) joined by a router that routes no pod address and speaks no BGP; pods across it need --vxlan-mode")
	c.Flags().StringVar(&u.vxlanMode, "vxlan-mode", "", "create the pools with this vxlanMode before the agents start: Never, Always or CrossSubnet (docs/vxlan.md)")
	c.Flags().BoolVar(&u.etcdProxy, "etcd-proxy", false, "run etcd's gRPC proxy (etcd grpc-proxy start) in front of etcd and point the agents at it: etcd serves one watch per proxy (docs/scale.md)")
	c.Flags().BoolVar(&u.relay, "relay", false, "run a watch relay (tabby-relay) in front of etcd and point the agents' --watch-endpoints at it: their views get their events in batches (docs/scale.md)")
	c.Flags().StringArrayVar(&u.agentArgs, "agent-arg", nil, "pass this flag to every tabby-agent, e.g. --agent-arg=--gobgp-api=127.0.0.1:50051 (repeatable; also for nodes added later)")
	c.Flags().TextVar(&u.ipv4Pool, "ipv4-pool", netip.Prefix{}, "the agents' IPv4 pool, a prefix of "+lab.PodPool+" (default all of it); e.g. "+lab.CNIBenchPool.String()+" leaves room for bench cni --use-lab")
	c.Flags().DurationVar(&u.converge, "converge-timeout", lab.DefaultConvergeTimeout, "fail when the BGP sessions are not all established this long after the agents started")
	c.Flags().BoolVar(&u.kubernetes, "kubernetes", false, "make the lab a Kubernetes cluster (control plane, containerd and a kubelet per node; needs `make kube-bins images`) and deploy Tabby from the manifests with kubectl, instead of starting agents itself")
	c.Flags().StringVar(&u.manifestDir, "manifests", "manifests", "with --kubernetes: the directory of tabby-etcd.yaml and tabby-kube-controllers.yaml")
	c.Flags().StringVar(&u.imagesDir, "images", "", "with --kubernetes: the directory of tabby.oci.tar, pause.oci.tar, coredns.oci.tar and echo.oci.tar (default <bin-dir>/images, from `make kube-bins images`)")
	c.Flags().StringVar(&u.kubeProxy, "kube-proxy", string(kube.ProxyNFTables), "with --kubernetes: kube-proxy's mode on every node (nftables, iptables, or none)")
}

// kubeOptions finds what --kubernetes needs: the Kubernetes binaries, the
// image archives and the manifests.
func (u *upOptions) kubeOptions(o lab.Options) (kube.KubeOptions, error) {
	if _, err := kubebins.Find(kubebins.Names...); err != nil {
		return kube.KubeOptions{}, err
	}
	dir := u.imagesDir
	if dir == "" {
		if o.BinDir == "" {
			return kube.KubeOptions{}, errors.New("--kubernetes: no --images directory and no --bin-dir to find it in (run `make images`)")
		}
		dir = filepath.Join(o.BinDir, "images")
	}
	mode, err := kube.ParseProxyMode(u.kubeProxy)
	if err != nil {
		return kube.KubeOptions{}, fmt.Errorf("--kube-proxy: %w", err)
	}
	ko := kube.KubeOptions{KubeProxy: mode}
	// echo is the lab's Service backend (the demo's; anyone's to try).
	for _, f := range []string{"pause.oci.tar", "tabby.oci.tar", "coredns.oci.tar", "echo.oci.tar"} {
		p := filepath.Join(dir, f)
		if _, err := os.Stat(p); err != nil {
			return kube.KubeOptions{}, fmt.Errorf("--kubernetes: image archive %v (run `make kube-bins images`)", err)
		}
		ko.Images = append(ko.Images, p)
	}
	// agnhost, for the network-policy-api conformance suite
	// (`make conformance-npapi`), when it was built.
	if p := filepath.Join(dir, "agnhost.oci.tar"); fileExists(p) {
		ko.Images = append(ko.Images, p)
	}
	for _, f := range []string{"tabby-etcd.yaml", "tabby-kube-controllers.yaml"} {
		if _, err := os.Stat(filepath.Join(u.manifestDir, f)); err != nil {
			return kube.KubeOptions{}, fmt.Errorf("--kubernetes: manifest %v (run from the repository or pass --manifests)", err)
		}
	}
	return ko, nil
}

func (u *upOptions) options(g *globalFlags) (lab.Options, error) {
	self, err := os.Executable()
	if err != nil {
		return lab.Options{}, fmt.Errorf("finding tabby-lab's own path: %w", err)
	}
	bin := binDir(u.binDir, self)
	return lab.Options{
		Name: g.name, RunDir: g.runDir, Nodes: u.nodes, RouteReflectors: u.rrs, AutoReflectors: u.autoRRs, Zones: u.zones, ReflectorPeering: u.reflectorPeering, PodsPerNode: u.pods,
		BinDir: bin, LabBinary: self, NoAgents: u.noAgents, Log: os.Stdout,
		AgentArgs: u.agentArgs, ConvergeTimeout: u.converge, EtcdMembers: u.etcdMembers, DualStack: u.dualStack, IPv6Only: u.ipv6Only, IPv6OnlyFabric: u.ipv6OnlyFabric,
		TwoSubnets: u.twoSubnets, IPv4Pool: u.ipv4Pool, VXLANMode: api.VXLANMode(u.vxlanMode), EtcdProxy: u.etcdProxy, Relay: u.relay,
	}, nil
}

// binDir is where the agent and the plugin are: the flag's directory, else
// $TABBY_BIN, else this program's own directory when it holds tabby-agent,
// else "" (the lab builds them).
func binDir(flag, self string) string {
	if flag != "" {
		return flag
	}
	if env := os.Getenv("TABBY_BIN"); env != "" {
		return env
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(self), "tabby-agent")); err == nil {
		return filepath.Dir(self)
	}
	return ""
}

func upCmd(g *globalFlags) *cobra.Command {
	u := &upOptions{}
	c := &cobra.Command{
		Use:   "up",
		Short: "Bring a lab up (fabric, ToR, etcd, nodes with agents, pods)",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			o, err := u.options(g)
			if err != nil {
				return err
			}
			if u.kubernetes {
				if o.IPv6OnlyFabric {
					// Its kubelets and API server use IPv4 addresses.
					return errors.New("--ipv6-only: not available with --kubernetes yet")
				}
				return upKubernetes(c.Context(), u, o)
			}
			// A lab whose sessions did not come up stays for a look.
			o.KeepUnconverged = true
			l, err := lab.Up(c.Context(), o)
			if err != nil && l != nil {
				flags := "--name " + g.name
				if g.runDir != lab.DefaultRunDir {
					flags += " --run-dir " + g.runDir
				}
				return fmt.Errorf("lab %q is NOT up: %w\nit was left as it is: `tabby-lab %s status` to look, `tabby-lab %s down` to remove it", g.name, err, flags, flags)
			}
			return err
		},
	}
	u.register(c, 3, 0)
	c.Flags().BoolVar(&u.noAgents, "no-agents", false, "only the fabric, ToR, etcd and node namespaces")
	return c
}

// upKubernetes brings up a lab without agents, makes it a Kubernetes
// cluster and deploys Tabby from the manifests; on failure the lab is
// left for a look, as a lab whose BGP sessions did not come up.
func upKubernetes(ctx context.Context, u *upOptions, o lab.Options) error {
	ko, err := u.kubeOptions(o)
	if err != nil {
		return err
	}
	o.NoAgents, o.PodsPerNode = true, 0
	base, err := lab.Up(ctx, o)
	if err != nil {
		return err
	}
	l := kube.New(base)
	if err := l.Up(ctx, kube.UpOptions{Kube: ko, Deploy: kube.DeployOptions{ManifestDir: u.manifestDir}}); err != nil {
		return fmt.Errorf("lab %q is up but the cluster is NOT ready: %w\nlook with `tabby-lab --name %s kubectl -- get pods -A`; `tabby-lab --name %s down` removes it", o.Name, err, o.Name, o.Name)
	}
	fmt.Printf("\nKubernetes with Tabby is up: `tabby-lab --name %s kubectl -- get nodes -o wide`\n", o.Name)
	return nil
}

func kubectlCmd(g *globalFlags) *cobra.Command {
	c := &cobra.Command{
		Use:   "kubectl -- [ARG...]",
		Short: "Run kubectl as the cluster's admin against a lab made with --kubernetes",
		RunE: func(c *cobra.Command, args []string) error {
			base, err := lab.Open(g.runDir, g.name, os.Stdout)
			if err != nil {
				return err
			}
			l := kube.New(base)
			if len(args) > 0 && args[0] == "--" {
				args = args[1:]
			}
			out, err := l.Kubectl(c.Context(), args...)
			os.Stdout.Write(out)
			if err != nil {
				return &exitError{code: 1}
			}
			return nil
		},
	}
	c.Flags().SetInterspersed(false)
	return c
}

func downCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Remove a lab: its processes, namespaces and run directory (also after a crash)",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return lab.Teardown(context.WithoutCancel(c.Context()), g.runDir, g.name, os.Stdout)
		},
	}
}

func statusCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the nodes, their BGP sessions, and the pods with their addresses",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			l, err := lab.Open(g.runDir, g.name, os.Stdout)
			if err != nil {
				return err
			}
			return l.WriteStatus(c.Context(), os.Stdout)
		},
	}
}

func execCmd(g *globalFlags) *cobra.Command {
	c := &cobra.Command{
		Use:   "exec NODE|POD|tor|etcd|fabric -- CMD [ARG...]",
		Short: "Run a command in the network namespace of a node, pod or the ToR",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			l, err := lab.Open(g.runDir, g.name, os.Stdout)
			if err != nil {
				return err
			}
			target, argv, err := execArgs(args)
			if err != nil {
				return err
			}
			ns, err := l.ResolveNetNS(target)
			if err != nil {
				return err
			}
			cmd := exec.CommandContext(c.Context(), "nsenter", append([]string{"--net=" + lab.NetNSPath(ns), "--"}, argv...)...)
			cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
			err = cmd.Run()
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return &exitError{code: ee.ExitCode()}
			}
			return err
		},
	}
	// Everything after the target belongs to the command.
	c.Flags().SetInterspersed(false)
	return c
}

// execArgs splits exec's arguments into the target and the command. Flag
// parsing stops at the target, so a "--" after it arrives as an argument:
// it separates, it is not the command.
func execArgs(args []string) (target string, argv []string, err error) {
	if len(args) == 0 {
		return "", nil, errors.New("exec: no target")
	}
	target, argv = args[0], args[1:]
	if len(argv) > 0 && argv[0] == "--" {
		argv = argv[1:]
	}
	if len(argv) == 0 {
		return "", nil, fmt.Errorf("exec %s: no command (tabby-lab exec %s -- CMD [ARG...])", target, target)
	}
	return target, argv, nil
}

func podCmd(g *globalFlags) *cobra.Command {
	pod := &cobra.Command{Use: "pod", Short: "Add or delete pods"}
	var namespace, labels string
	add := &cobra.Command{
		Use:   "add NODE NAME",
		Short: "Create a pod namespace on NODE and run the CNI chain ADD for it",
		Args:  cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			ls, err := lab.ParseLabels(labels)
			if err != nil {
				return err
			}
			l, err := lab.Open(g.runDir, g.name, os.Stdout)
			if err != nil {
				return err
			}
			p, err := l.AddPod(c.Context(), args[0], args[1], lab.PodOptions{Namespace: namespace, Labels: ls})
			if err != nil {
				return err
			}
			fmt.Printf("%s %s %s\n", p.Name, p.IPs[0], p.NetNS)
			return nil
		},
	}
	add.Flags().StringVar(&namespace, "namespace", "default", "Kubernetes namespace of the pod")
	add.Flags().StringVar(&labels, "labels", "", "pod labels, k=v,k=v")
	del := &cobra.Command{
		Use:   "del NAME",
		Short: "Run the CNI chain DEL for a pod and delete its namespace",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			l, err := lab.Open(g.runDir, g.name, os.Stdout)
			if err != nil {
				return err
			}
			return l.DelPod(c.Context(), args[0])
		},
	}
	pod.AddCommand(add, del)
	return pod
}

func nodeCmd(g *globalFlags) *cobra.Command {
	node := &cobra.Command{Use: "node", Short: "Add or remove nodes"}
	add := &cobra.Command{
		Use:   "add NAME",
		Short: "Add a node at the next free fabric address and start its agent",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			l, err := lab.Open(g.runDir, g.name, os.Stdout)
			if err != nil {
				return err
			}
			return l.AddNode(c.Context(), args[0])
		},
	}
	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "Stop a node's agent, delete its Node resource, its pods and its namespace",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			l, err := lab.Open(g.runDir, g.name, os.Stdout)
			if err != nil {
				return err
			}
			return l.RemoveNode(c.Context(), args[0])
		},
	}
	node.AddCommand(add, rm)
	return node
}

func demoCmd(g *globalFlags) *cobra.Command {
	u := &upOptions{}
	var keep bool
	c := &cobra.Command{
		Use:   "demo",
		Short: "Bring up 3 nodes × 2 pods, show BGP sessions, routes and a ping matrix, then tear down",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			o, err := u.options(g)
			if err != nil {
				return err
			}
			if u.kubernetes {
				ko, err := u.kubeOptions(o)
				if err != nil {
					return err
				}
				return kube.DemoKubernetes(c.Context(), o, ko, u.manifestDir, keep, os.Stdout)
			}
			return lab.Demo(c.Context(), o, keep, os.Stdout)
		},
	}
	u.register(c, 3, 2)
	c.Flags().BoolVar(&keep, "keep", false, "leave the lab up afterwards")
	return c
}

// etcdCmd runs the lab's etcd; the lab starts it inside its control-plane
// namespace.
func etcdCmd() *cobra.Command {
	var o lab.EtcdOptions
	c := &cobra.Command{
		Use:    "etcd",
		Short:  "Run an embedded etcd (started by the lab in its control-plane namespace)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
			return lab.RunEtcd(c.Context(), o)
		},
	}
	c.Flags().StringVar(&o.Dir, "dir", "", "data directory")
	c.Flags().StringVar(&o.ClientURL, "client-url", "", "client URL to serve")
	c.Flags().StringVar(&o.UnixSocket, "unix-socket", "", "also serve clients on this unix socket")
	c.Flags().StringVar(&o.Name, "name", "", "member name (with --initial-cluster)")
	c.Flags().StringVar(&o.PeerURL, "peer-url", "", "peer URL to serve (with --initial-cluster)")
	c.Flags().StringVar(&o.InitialCluster, "initial-cluster", "", "the members of a new cluster: name=peerURL,… (default: this member alone)")
	_ = c.MarkFlagRequired("dir")
	_ = c.MarkFlagRequired("client-url")
	return c
}

// cniCmd calls a CNI configuration list through libcni like a runtime; the
// lab runs it inside the node's namespace.
func cniCmd() *cobra.Command {
	var r lab.CNIRequest
	var cniPath, args, labels string
	c := &cobra.Command{
		Use:       "cni add|del|check",
		Short:     "Call the CNI plugins of a configuration list as a runtime does",
		Hidden:    true,
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{"add", "del", "check"},
		RunE: func(c *cobra.Command, a []string) error {
			var err error
			r.Command = a[0]
			r.CNIPath = strings.Split(cniPath, ":")
			if r.Args, err = lab.ParseCNIArgs(args); err != nil {
				return err
			}
			if r.Labels, err = lab.ParseLabels(labels); err != nil {
				return err
			}
			out, err := lab.RunCNI(c.Context(), r)
			if err != nil {
				return err
			}
			_, err = os.Stdout.Write(out)
			return err
		},
	}
	c.Flags().StringVar(&r.Conflist, "conflist", "", "network configuration list")
	c.Flags().StringVar(&r.NetNS, "netns", "", "path of the pod's network namespace")
	c.Flags().StringVar(&r.ContainerID, "container-id", "", "container ID")
	c.Flags().StringVar(&r.IfName, "ifname", "eth0", "interface name in the pod")
	c.Flags().StringVar(&cniPath, "cni-path", "/opt/cni/bin", "plugin directories, colon separated")
	c.Flags().StringVar(&r.CacheDir, "cache-dir", "", "libcni cache directory")
	c.Flags().StringVar(&args, "args", "", "CNI_ARGS, K=V;K=V")
	c.Flags().StringVar(&labels, "labels", "", "pod labels, k=v,k=v (args.cni.labels)")
	for _, f := range []string{"conflist", "netns", "container-id"} {
		_ = c.MarkFlagRequired(f)
	}
	return c
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
