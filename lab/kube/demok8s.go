package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/tabbynet/tabby/lab"
)

// DemoReplicas is the size of DemoDeployment.
const DemoReplicas = 6

// DemoDeployment spreads pause pods evenly over the nodes (a cordoned node
// is no domain to spread over).
const DemoDeployment = `apiVersion: apps/v1
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
          nodeTaintsPolicy: Honor
          labelSelector:
            matchLabels:
              app: web
      containers:
        - name: pause
          image: registry.k8s.io/pause:3.10
          imagePullPolicy: Never
`

// DemoKubernetes makes the lab (3 nodes unless o says otherwise, no lab
// agents) a Kubernetes cluster with kube-proxy on every node
// (StartKubernetes), deploys Tabby from the manifests with kubectl
// (DeployTabby) and the cluster's DNS (DeployDNS), applies DemoDeployment,
// and shows `kubectl get nodes,pods -o wide` and a ping matrix between the
// pods; then DemoService, reached by its DNS name from a pod on every node
// but its backend's (demoServiceMatrix). Unless keep, it tears the lab
// down again. Any failed step, ping or Service connection is an error.
func DemoKubernetes(ctx context.Context, o lab.Options, ko KubeOptions, manifestDir string, keep bool, w io.Writer) (err error) {
	if o.Nodes == 0 {
		o.Nodes = 3
	}
	o.NoAgents, o.PodsPerNode = true, 0
	if o.Log == nil {
		o.Log = w
	}
	base, err := lab.Up(ctx, o)
	if err != nil {
		return err
	}
	l := New(base)
	defer func() {
		if keep {
			flags := l.CLIFlags()
			fmt.Fprintf(w, "\nthe cluster stays up; try `tabby-lab %s kubectl -- get pods -A -o wide` and `tabby-lab %s down`\n", flags, flags)
			return
		}
		err = errors.Join(err, l.Down())
	}()
	mode, err := ParseProxyMode(string(ko.KubeProxy))
	if err != nil {
		return err
	}
	lab.Section(w, "Kubernetes: control plane on the fabric, containerd, a kubelet and kube-proxy per node")
	if err := l.StartKubernetes(ctx, ko); err != nil {
		return err
	}
	out, err := l.Kubectl(ctx, "get", "nodes", "-o", "wide")
	if err != nil {
		return err
	}
	w.Write(out)
	lab.Section(w, "Tabby from manifests/ (kubectl apply, as manifests/README.md says)")
	start := time.Now()
	if err := l.DeployTabby(ctx, DeployOptions{ManifestDir: manifestDir}); err != nil {
		return err
	}
	fmt.Fprintf(w, "Tabby ready on every node %v after kubectl apply\n", time.Since(start).Round(100*time.Millisecond))
	lab.Section(w, "the cluster's DNS: CoreDNS behind kube-dns at "+DNSServiceIP)
	if err := l.DeployDNS(ctx, 0); err != nil {
		return err
	}
	if out, err = l.Kubectl(ctx, "-n", "kube-system", "get", "pods,services", "-l", "k8s-app=kube-dns", "-o", "wide"); err != nil {
		return err
	}
	w.Write(out)
	lab.Section(w, fmt.Sprintf("a Deployment of %d pods over the nodes", DemoReplicas))
	path := filepath.Join(l.kubeDir(), "web.yaml")
	if err := os.WriteFile(path, []byte(DemoDeployment), 0o644); err != nil {
		return err
	}
	if _, err := l.Kubectl(ctx, "apply", "-f", path); err != nil {
		return err
	}
	if _, err := l.Kubectl(ctx, "rollout", "status", "deployment/web", "--timeout=3m"); err != nil {
		return err
	}
	out, err = l.Kubectl(ctx, "get", "nodes,pods", "-A", "-o", "wide")
	if err != nil {
		return err
	}
	w.Write(out)
	pods, err := l.KubePods(ctx, "default", "app=web")
	if err != nil {
		return err
	}
	lab.Section(w, "ping matrix (ping -c1 -W1 from each pod's network namespace)")
	ping := func(from lab.PodState, to netip.Addr) error {
		return exec.CommandContext(ctx, "nsenter", "--net="+lab.NetNSPath(from.NetNS), "--", "ping", "-c1", "-W1", "-n", to.String()).Run()
	}
	if failed := lab.PingMatrix(pods, ping, w); failed > 0 {
		return fmt.Errorf("%d pings failed", failed)
	}
	fmt.Fprintln(w, "\nall pods reach each other")
	lab.Section(w, "a Service reached by name from pods on other nodes (kube-proxy "+string(mode)+" mode, CoreDNS)")
	if err := l.demoServiceMatrix(ctx, pods, w); err != nil {
		return err
	}
	return nil
}

// KubePods lists the Running pods of namespace matching selector that have
// an address, as PodStates: name, node, address and the network namespace
// (/run/netns/cni-…) the runtime made for it.
func (l *Cluster) KubePods(ctx context.Context, namespace, selector string) ([]lab.PodState, error) {
	out, err := l.Kubectl(ctx, "-n", namespace, "get", "pods", "-l", selector, "--field-selector=status.phase=Running",
		"-o", `jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.podIP}{"\n"}{end}`)
	if err != nil {
		return nil, err
	}
	// Only this lab's pod namespaces: another lab running at the same
	// time may have given one of its pods the same address.
	own, err := l.KubePodNetns(ctx)
	if err != nil {
		return nil, err
	}
	netnsOf := netnsByAddr(own)
	var pods []lab.PodState
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		ip, err := netip.ParseAddr(f[2])
		if err != nil {
			return nil, fmt.Errorf("pod %s: address %q: %w", f[0], f[2], err)
		}
		ns, ok := netnsOf[ip]
		if !ok {
			return nil, fmt.Errorf("pod %s: no network namespace holds %s", f[0], ip)
		}
		pods = append(pods, lab.PodState{Name: f[0], Namespace: namespace, Node: f[1], NetNS: ns, IPs: []netip.Prefix{netip.PrefixFrom(ip, ip.BitLen())}})
	}
	return pods, nil
}

// PodNetns lists the network namespaces a container runtime's CNI
// handling made (/run/netns/cni-…).
func PodNetns() ([]string, error) {
	entries, err := os.ReadDir(lab.NetNSDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "cni-") {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// netnsByAddr maps each IPv4 address of the network namespaces nss to
// the namespace's name.
func netnsByAddr(nss []string) map[netip.Addr]string {
	out := map[netip.Addr]string{}
	for _, ns := range nss {
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

// KubePodNetns lists the runtime's pod network namespaces
// (/run/netns/cni-…) that hold a task of this lab's containerds: the
// lab's own pods', whatever other labs run at the same time.
func (l *Cluster) KubePodNetns(ctx context.Context) ([]string, error) {
	type key struct{ dev, ino uint64 }
	id := func(path string) (key, bool) {
		var st syscall.Stat_t
		if err := syscall.Stat(path, &st); err != nil {
			return key{}, false
		}
		return key{st.Dev, st.Ino}, true
	}
	nss, err := PodNetns()
	if err != nil {
		return nil, err
	}
	byID := map[key]string{}
	for _, ns := range nss {
		if k, ok := id(filepath.Join(lab.NetNSDir, ns)); ok {
			byID[k] = ns
		}
	}
	seen := map[string]bool{}
	var out []string
	for _, n := range l.State().Nodes {
		if !n.Containerd.Alive() {
			continue
		}
		tasks, err := l.Ctr(ctx, n.Name, "tasks", "ls")
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(string(tasks), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			if k, ok := id("/proc/" + f[1] + "/ns/net"); ok && byID[k] != "" && !seen[byID[k]] {
				seen[byID[k]] = true
				out = append(out, byID[k])
			}
		}
	}
	return out, nil
}
