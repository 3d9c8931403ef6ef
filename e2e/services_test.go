package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tabbynet/tabby/internal/image"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/kube/kubebins"
	"github.com/tabbynet/tabby/kube/kubetest"
	"github.com/tabbynet/tabby/lab"
	"github.com/tabbynet/tabby/lab/kube"
)

// The Services test runs this test binary in a pod's network namespace as
// a client (TestServiceHelperProcess, selected by the environment).
const serviceHelperEnv = "TABBY_E2E_SERVICE_HELPER"

// servicesManifest is the test's workload: the echo backend (one replica,
// pinned to node2) in k14-srv behind the Service web (port 80 to the
// pods' 8080, the port gatePolicy opens), and a client pod on node1 in
// k14-cli labelled as gatePolicy's client, with the cluster's DNS.
const servicesManifest = `apiVersion: v1
kind: Namespace
metadata: {name: k14-srv}
---
apiVersion: v1
kind: Namespace
metadata: {name: k14-cli}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: k14-srv}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      nodeSelector: {kubernetes.io/hostname: node2}
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 1
      containers:
      - name: echo
        image: ` + image.EchoName + `
        imagePullPolicy: Never
        ports: [{containerPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: k14-srv}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Pod
metadata: {name: cli, namespace: k14-cli, labels: {app: client}}
spec:
  nodeName: node1
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: pause
    image: ` + image.PauseName + `
    imagePullPolicy: Never
`

// TestKubeServices: on the Kubernetes lab as tabby-lab up --kubernetes
// ships it (kube-proxy in nftables mode on every node, CoreDNS, Tabby from
// the manifests; nothing started by hand), a pod on node1 reaches a
// Service whose only backend is on node2 by ClusterIP, by its DNS name and
// by its short name through the search path its kubelet wrote, and the
// backend sees the pod's own address; CoreDNS answers
// kubernetes.default.svc.cluster.local. Then TestKubernetes' gate policy
// (isolate web, then let k14-cli's clients in on 8080), probed through
// the ClusterIP: Tabby's policy decides on the packet after kube-proxy's
// DNAT (port 80 became the pod's 8080). Last, the same Service through
// every node's kube-proxy restarted in iptables mode.
func TestKubeServices(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	l := upKubeProxyLab(ctx, t, "svcl", 2)

	kubectl := labKubectl(ctx, t, l, servicesManifest)
	kubectl("-n", "k14-srv", "rollout", "status", "deployment/web", "--timeout=3m")
	kubectl("-n", "k14-cli", "wait", "--for=condition=Ready", "pod/cli", "--timeout=3m")
	clusterIP := netip.MustParseAddr(kubectl("-n", "k14-srv", "get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"))
	webs, err := l.KubePods(ctx, "k14-srv", "app=web")
	if err != nil || len(webs) != 1 || webs[0].Node != "node2" {
		t.Fatalf("web pods %+v, %v: want one on node2", webs, err)
	}
	clis, err := l.KubePods(ctx, "k14-cli", "app=client")
	if err != nil || len(clis) != 1 || clis[0].Node != "node1" {
		t.Fatalf("client pods %+v, %v: want one on node1", clis, err)
	}
	web, cli := webs[0], clis[0]
	nameserver, search := podResolvConf(t, l, "node1", "k14-cli")
	if nameserver != kube.DNSServiceIP {
		t.Fatalf("the client's resolv.conf names %q, want the kube-dns Service %s", nameserver, kube.DNSServiceIP)
	}
	get := func(target string) (string, error) {
		return serviceGet(ctx, cli.NetNS, nameserver, search, target, 80)
	}
	// The backend answers "<pod name> <client address:port>".
	wantAnswer := func(answer string) error {
		f := strings.Fields(answer)
		if len(f) != 3 || f[1] != web.Name {
			return fmt.Errorf("answer %q: want one from %s", answer, web.Name)
		}
		if ap, err := netip.ParseAddrPort(f[2]); err != nil || ap.Addr() != cli.IPs[0].Addr() {
			return fmt.Errorf("answer %q: the backend saw %s, not the client's own %s", answer, f[2], cli.IPs[0].Addr())
		}
		if f[0] != clusterIP.String() {
			return fmt.Errorf("answer %q: reached through %s, want the ClusterIP %s", answer, f[0], clusterIP)
		}
		return nil
	}

	t.Run("ClusterIPAndDNS", func(t *testing.T) {
		for _, target := range []string{clusterIP.String(), "web.k14-srv.svc." + kube.ClusterDomain, "web.k14-srv"} {
			// Eventually: the node's kube-proxy and CoreDNS see the new
			// Service's EndpointSlice a moment after it is ready.
			testkit.Eventually(t, 30*time.Second, "node1's pod reaches web on node2 at "+target, func() error {
				answer, err := get(target)
				if err != nil {
					return err
				}
				return wantAnswer(answer)
			})
		}
		addrs, err := serviceResolve(ctx, cli.NetNS, nameserver, nil, "kubernetes.default.svc."+kube.ClusterDomain)
		if err != nil || addrs != kube.KubernetesServiceIP {
			t.Errorf("kubernetes.default.svc.%s resolves to %q (%v), want %s", kube.ClusterDomain, addrs, err, kube.KubernetesServiceIP)
		}
	})

	t.Run("PolicyThroughClusterIP", func(t *testing.T) {
		nps := kubeAdminClient(t, l).NetworkingV1().NetworkPolicies("k14-srv")
		if _, err := nps.Create(ctx, gatePolicy(false), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		blocked := testkit.Eventually(t, kubeDeadline, "the gate drops node1's pod at web's ClusterIP", func() error {
			answer, err := get(clusterIP.String())
			if err == nil {
				return fmt.Errorf("still answered: %q", answer)
			}
			if !errors.Is(err, errServiceBlocked) {
				return err
			}
			return nil
		})
		np, err := nps.Get(ctx, "gate", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		np.Spec = gatePolicy(true).Spec
		if _, err := nps.Update(ctx, np, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		allowed := testkit.Eventually(t, kubeDeadline, "the gate lets k14-cli's client in through the ClusterIP", func() error {
			answer, err := get(clusterIP.String())
			if err != nil {
				return err
			}
			return wantAnswer(answer)
		})
		if err := nps.Delete(ctx, "gate", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Logf("through the ClusterIP: blocked %v after the policy's create, allowed %v after its update", blocked.Round(time.Millisecond), allowed.Round(time.Millisecond))
	})

	// The other mode, as a test of another part would pick it: every
	// node's kube-proxy restarted in iptables mode takes over from the
	// nftables one's rules (it removes them at start).
	t.Run("IPTablesMode", func(t *testing.T) {
		for _, n := range l.State().Nodes {
			if err := l.StopKubeProxy(ctx, n.Name); err != nil {
				t.Fatal(err)
			}
			if err := l.StartKubeProxy(ctx, n.Name, kube.ProxyIPTables); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range l.State().Nodes {
			if out, err := exec.Command("ip", "netns", "exec", n.NetNS, "nft", "list", "table", "ip", "kube-proxy").CombinedOutput(); err == nil {
				t.Errorf("%s: kube-proxy's nftables table still there in iptables mode:\n%s", n.Name, out)
			}
			out, err := exec.Command("ip", "netns", "exec", n.NetNS, "iptables", "-t", "nat", "-S", "KUBE-SERVICES").CombinedOutput()
			if err != nil || !strings.Contains(string(out), clusterIP.String()+"/32") {
				t.Errorf("%s: no iptables rule for %s in KUBE-SERVICES (%v):\n%s", n.Name, clusterIP, err, out)
			}
		}
		testkit.Eventually(t, 30*time.Second, "node1's pod reaches web by name through iptables mode", func() error {
			answer, err := get("web.k14-srv.svc." + kube.ClusterDomain)
			if err != nil {
				return err
			}
			return wantAnswer(answer)
		})
	})
}

// upKubeProxyLab brings up a Kubernetes lab of nodes nodes (named after
// prefix and the test) as tabby-lab up --kubernetes ships it: kube-proxy
// in nftables mode on every node (checked), CoreDNS, Tabby from the
// manifests; it goes down when the test ends. Skips without the lab's
// binaries and images.
func upKubeProxyLab(ctx context.Context, t testing.TB, prefix string, nodes int) *kube.Cluster {
	t.Helper()
	l := upKubeLabWith(ctx, t, prefix, nodes, []string{"pause.oci.tar", "tabby.oci.tar", "coredns.oci.tar", "echo.oci.tar"},
		kube.UpOptions{Kube: kube.KubeOptions{KubeProxy: kube.ProxyNFTables}})
	for _, n := range l.State().Nodes {
		if out, err := exec.Command("ip", "netns", "exec", n.NetNS, "nft", "list", "table", "ip", "kube-proxy").CombinedOutput(); err != nil {
			t.Fatalf("%s: no kube-proxy nftables table: %v\n%s", n.Name, err, out)
		}
	}
	return l
}

// upKubeLabWith brings up a Kubernetes lab of n nodes (Tabby from the
// manifests) as o says, the images named (archives of $TABBY_BIN/images)
// imported into every node. It skips, saying why, without the Kubernetes
// binaries or the images, and takes the lab down when t ends.
func upKubeLabWith(ctx context.Context, t testing.TB, prefix string, nodes int, images []string, o kube.UpOptions) *kube.Cluster {
	t.Helper()
	testkit.RequirePrivileged(t, "ip", "nsenter", "nft")
	kubetest.Require(t, kubebins.Names...)
	binDir := os.Getenv("TABBY_BIN")
	archives, err := kube.HostCheck(binDir, images, nil, nil)
	if err != nil {
		t.Skip(err.Error())
	}
	name := testkit.UniqueName(t, prefix)
	base, err := lab.Up(ctx, lab.Options{Name: name, Nodes: nodes, RunDir: runDir, BinDir: binDir, NoAgents: true, Log: testWriter{t}})
	if err != nil {
		_ = lab.Teardown(context.Background(), runDir, name, testWriter{t})
		t.Fatalf("lab up: %v", err)
	}
	l := kube.New(base)
	t.Cleanup(func() {
		if tt, ok := t.(*testing.T); ok && tt.Failed() {
			dumpKubeLogs(tt, l)
		}
		if err := l.Down(); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	start := time.Now()
	o.Kube.Images = archives
	o.Deploy.ManifestDir = "../manifests"
	if err := l.Up(ctx, o); err != nil {
		t.Fatal(err)
	}
	t.Logf("Kubernetes lab (kube-proxy %q, no DNS %v), Tabby up in %v", o.Kube.KubeProxy, o.NoDNS, time.Since(start).Round(time.Second))
	return l
}

// labKubectl returns kubectl against the lab's cluster for t: its
// trimmed output, the test failed on an error; and applies the manifests
// (YAML texts) first.
func labKubectl(ctx context.Context, t *testing.T, l *kube.Cluster, manifests ...string) func(args ...string) string {
	kubectl := func(args ...string) string {
		t.Helper()
		out, err := l.Kubectl(ctx, args...)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(out))
	}
	for i, m := range manifests {
		path := filepath.Join(t.TempDir(), fmt.Sprintf("manifest-%d.yaml", i))
		if err := os.WriteFile(path, []byte(m), 0o644); err != nil {
			t.Fatal(err)
		}
		kubectl("apply", "-f", path)
	}
	return kubectl
}

// errServiceBlocked: nothing answered the connection in time (a drop).
var errServiceBlocked = errors.New("connection timed out")

// serviceGet connects from the pod namespace ns to target (an address, or
// a name resolved through nameserver with the search path) at port and
// returns "<address connected to> <the backend's answer>".
func serviceGet(ctx context.Context, ns, nameserver string, search []string, target string, port int) (string, error) {
	return serviceHelper(ctx, ns, "get", nameserver, strings.Join(search, ","), target, fmt.Sprint(port))
}

// serviceResolve resolves name through nameserver from the pod namespace ns.
func serviceResolve(ctx context.Context, ns, nameserver string, search []string, name string) (string, error) {
	return serviceHelper(ctx, ns, "resolve", nameserver, strings.Join(search, ","), name)
}

func serviceHelper(ctx context.Context, ns string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + lab.NetNSPath(ns), "--", os.Args[0], "-test.run=^TestServiceHelperProcess$", "--"}, args...)...)
	cmd.Env = append(os.Environ(), serviceHelperEnv+"=1")
	out, err := cmd.Output()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return strings.TrimSpace(string(out)), nil
	case errors.As(err, &ee) && ee.ExitCode() == exitBlocked:
		return "", errServiceBlocked
	case errors.As(err, &ee):
		return "", fmt.Errorf("%s exited %d: %s", strings.Join(args, " "), ee.ExitCode(), ee.Stderr)
	}
	return "", err
}

// TestServiceHelperProcess is not a test: run in a pod's namespace,
//
//	resolve NAMESERVER SEARCH NAME       print NAME's first address
//	get NAMESERVER SEARCH TARGET PORT    connect to TARGET (an address, or a name resolved first) and print "<address> <answer line>"
//
// names resolved as a pod's resolver does: through NAMESERVER (port 53),
// a name with fewer than five dots tried with each domain of SEARCH
// (comma-separated) first. Exit 3: the connection timed out.
func TestServiceHelperProcess(t *testing.T) {
	if os.Getenv(serviceHelperEnv) != "1" {
		t.Skip("helper process for the Services test, not a test")
	}
	code, err := serviceHelperMain(flagArgs())
	if err != nil {
		fmt.Fprintln(os.Stderr, "service helper:", err)
	}
	os.Exit(code)
}

func serviceHelperMain(args []string) (int, error) {
	if len(args) < 4 || (args[0] == "get") != (len(args) == 5) {
		return 1, fmt.Errorf("usage: resolve NAMESERVER SEARCH NAME | get NAMESERVER SEARCH TARGET PORT")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort(args[1], "53"))
	}}
	var search []string
	if args[2] != "" {
		search = strings.Split(args[2], ",")
	}
	addr, err := netip.ParseAddr(args[3])
	if err != nil {
		if addr, err = resolveWithSearch(ctx, r, args[3], search); err != nil {
			return 1, err
		}
	}
	if args[0] == "resolve" {
		fmt.Println(addr)
		return 0, nil
	}
	c, err := net.DialTimeout("tcp4", net.JoinHostPort(addr.String(), args[4]), probeTimeout)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return exitBlocked, err
		}
		return 1, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(probeTimeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return 1, err
	}
	fmt.Println(addr, strings.TrimSpace(line))
	return 0, nil
}

// resolveWithSearch resolves name as a resolver with ndots:5 does: with
// each search domain first, then as it is.
func resolveWithSearch(ctx context.Context, r *net.Resolver, name string, search []string) (netip.Addr, error) {
	var tries []string
	if strings.Count(name, ".") < 5 && !strings.HasSuffix(name, ".") {
		for _, d := range search {
			tries = append(tries, name+"."+d+".")
		}
	}
	tries = append(tries, strings.TrimSuffix(name, ".")+".")
	var errs []error
	for _, n := range tries {
		addrs, err := r.LookupNetIP(ctx, "ip4", n)
		if err == nil && len(addrs) > 0 {
			return addrs[0].Unmap(), nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", n, err))
	}
	return netip.Addr{}, errors.Join(errs...)
}

// podResolvConf reads the resolv.conf the node's kubelet had containerd
// write for the one pod sandbox of namespace ns on node (recognised by its
// search path's first domain, <ns>.svc.<cluster domain>), and returns its
// nameserver and search domains.
func podResolvConf(t *testing.T, l *kube.Cluster, node, ns string) (nameserver string, search []string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(l.ContainerdDir(node), "root", "io.containerd.grpc.v1.cri", "sandboxes", "*", "resolv.conf"))
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var ns1 string
		var s []string
		for _, line := range strings.Split(string(b), "\n") {
			fs := strings.Fields(line)
			switch {
			case len(fs) >= 2 && fs[0] == "nameserver" && ns1 == "":
				ns1 = fs[1]
			case len(fs) >= 2 && fs[0] == "search":
				s = fs[1:]
			}
		}
		if len(s) > 0 && s[0] == ns+".svc."+kube.ClusterDomain {
			nameserver, search = ns1, s
			found = append(found, f)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d pod resolv.conf files of namespace %s on %s (%v), want 1 among %v", len(found), ns, node, found, files)
	}
	return nameserver, search
}

// kubeAdminClient is an admin client of the lab cluster's API server,
// without client-side throttling (client-go's default of 5 requests a
// second would make the tests' polls, and what benchmarks time with them,
// wait on the client).
func kubeAdminClient(t testing.TB, l *kube.Cluster) kubernetes.Interface {
	t.Helper()
	caFile, certFile, keyFile := l.AdminCredentials()
	kc, err := kubernetes.NewForConfig(&rest.Config{Host: kube.APIServerURL(), Dial: l.KubeDial(), QPS: 1000, Burst: 1000,
		TLSClientConfig: rest.TLSClientConfig{CAFile: caFile, CertFile: certFile, KeyFile: keyFile}})
	if err != nil {
		t.Fatal(err)
	}
	return kc
}

// dumpKubeLogs logs the tails of the Kubernetes lab's logs.
func dumpKubeLogs(t *testing.T, l *kube.Cluster) {
	tail := func(path string) {
		b, err := os.ReadFile(path)
		if err != nil {
			return
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 30 {
			lines = lines[len(lines)-30:]
		}
		t.Logf("last lines of %s:\n%s", path, strings.Join(lines, "\n"))
	}
	tail(filepath.Join(l.Dir(), "kube", "kube-controller-manager.log"))
	for _, n := range l.State().Nodes {
		tail(filepath.Join(l.KubeletDir(n.Name), "kubelet.log"))
		tail(filepath.Join(l.KubeProxyDir(n.Name), "kube-proxy.log"))
	}
	if out, err := l.Kubectl(context.Background(), "get", "pods,services,endpointslices", "-A", "-o", "wide"); err == nil {
		t.Logf("cluster:\n%s", out)
	}
}
