package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/internal/testkit"
)

func run(t testing.TB, argv ...string) string {
	t.Helper()
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return string(out)
}

var nsSeq struct {
	sync.Mutex
	n int
}

// nodeEnv is one agent wiring pods in a node namespace of its own, with
// real netlink, real etcd and the real CNI binary driven through libcni.
type nodeEnv struct {
	dualStack      bool // the agent has an IPv6 pool and conflists ask for both families
	node, nodePath string
	store          *datastore.Store
	agent          *Agent
	cni            *libcni.CNIConfig
	cniCacheDir    string
	sock           string
	binDir         string
	fault          func(string) error
	faultMu        sync.Mutex
}

func buildPlugin(t testing.TB) string {
	t.Helper()
	if dir := os.Getenv("TABBY_BIN"); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "tabby")); err == nil {
			return dir
		}
	}
	dir := t.TempDir()
	// Built as make and the image build it (static, stripped): a cgo
	// build links libc dynamically, and its loader costs each exec about
	// a millisecond that the shipped plugin does not pay.
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", dir+"/tabby", "github.com/tabbynet/tabby/cmd/tabby")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("building the plugin: %v\n%s", err, out)
	}
	return dir
}

// nodeEnvOptions vary newNodeEnvWith's agent.
type nodeEnvOptions struct {
	// firewall gives the agent the nftables firewall of its node
	// namespace, so that it enforces policy as deployed.
	firewall bool
	// log, when set, gets the agent's log instead of testLogger's.
	log *slog.Logger
	// resync, when set, replaces the tests' short resync interval (2 s).
	resync time.Duration
	// dualStack gives the agent an IPv6 pool too; conflistChain then asks
	// for an address of each family.
	dualStack bool
	// fsync runs etcd with fsync on, as the lab and production do (the
	// tests' etcd skips it).
	fsync bool
	// endpointApart writes the endpoint after the address (Deps).
	endpointApart bool
}

func newNodeEnv(t testing.TB) *nodeEnv {
	t.Helper()
	return newNodeEnvWith(t, nodeEnvOptions{})
}

func newNodeEnvWith(t testing.TB, opts nodeEnvOptions) *nodeEnv {
	t.Helper()
	testkit.RequirePrivileged(t)
	e := &nodeEnv{}
	nodeNS := testkit.NewNetNS(t, "tabby-at")
	e.node, e.nodePath = nodeNS.Name, nodeNS.Path
	// An uplink inside the node namespace, so that the node has a route
	// covering 169.254.1.1 (proxy ARP needs one); nothing leaves it.
	run(t, "ip", "-n", e.node, "link", "add", "up0", "type", "veth", "peer", "name", "up1")
	run(t, "ip", "-n", e.node, "addr", "add", "198.18.5.1/24", "dev", "up0")
	run(t, "ip", "-n", e.node, "link", "set", "up0", "up")
	run(t, "ip", "-n", e.node, "link", "set", "up1", "up")
	run(t, "ip", "-n", e.node, "route", "add", "default", "via", "198.18.5.2")
	if err := dataplane.EnsureNodeSysctls(e.nodePath); err != nil {
		t.Fatal(err)
	}

	etcd := storetest.Etcd(t)
	if opts.fsync {
		etcd = storetest.EtcdFsync(t)
	}
	e.store = storetest.Connect(t, etcd)
	wl, err := dataplane.NewWorkloads(e.nodePath)
	if err != nil {
		t.Fatal(err)
	}
	routes, err := dataplane.NewRoutes(e.nodePath)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	e.sock = filepath.Join(dir, "cni.sock")
	cfg := Default()
	cfg.NodeName = "node1"
	cfg.NodeIP = netip.MustParsePrefix("198.18.5.1/24")
	cfg.Etcd = datastore.Config{Endpoints: etcd.Endpoints()}
	cfg.CNISocket = e.sock
	cfg.StatusSocket = filepath.Join(dir, "status.sock")
	cfg.HTTPListen = netip.AddrPort{}
	cfg.DefaultPoolCIDR = netip.MustParsePrefix("10.244.0.0/16")
	if opts.dualStack {
		cfg.DefaultPoolCIDR6 = netip.MustParsePrefix("fd00:10:244::/48")
		e.dualStack = true
	}
	cfg.ResyncInterval = 2 * time.Second
	if opts.resync != 0 {
		cfg.ResyncInterval = opts.resync
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var fw dataplane.Firewall
	if opts.firewall {
		if fw, err = dataplane.NewFirewall(dataplane.FirewallConfig{NetNS: e.nodePath, Firewall: dataplane.FirewallNFTables}); err != nil {
			t.Fatal(err)
		}
		if c, ok := fw.(io.Closer); ok {
			t.Cleanup(func() { _ = c.Close() }) // the namespace, and the table with it, goes anyway
		}
	}
	log := opts.log
	if log == nil {
		log = testLogger()
	}
	e.agent = New(cfg, log, Deps{
		Workloads: wl, Routes: routes, Speaker: newFakeSpeaker(), Firewall: fw, EndpointApart: opts.endpointApart,
		CNIFault: func(step string) error {
			e.faultMu.Lock()
			defer e.faultMu.Unlock()
			if e.fault != nil {
				return e.fault(step)
			}
			return nil
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.agent.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
		_ = wl.Close()
		_ = routes.Close()
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(e.sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("agent did not open its CNI socket")
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.binDir = buildPlugin(t)
	e.cniCacheDir = t.TempDir()
	e.cni = libcni.NewCNIConfigWithCacheDir([]string{e.binDir, "/usr/lib/cni"}, e.cniCacheDir, nil)
	return e
}

func (e *nodeEnv) setFault(f func(string) error) {
	e.faultMu.Lock()
	e.fault = f
	e.faultMu.Unlock()
}

// conflist is tabby, chained with Debian's tuning plugin when it is
// installed (it only touches the pod's namespace) and speaks ver (Debian's
// plugins stop at CNI 1.0.0).
func (e *nodeEnv) conflist(t testing.TB, ver string) *libcni.NetworkConfigList {
	return e.conflistChain(t, ver, true)
}

func (e *nodeEnv) conflistChain(t testing.TB, ver string, chain bool) *libcni.NetworkConfigList {
	t.Helper()
	plugins := []map[string]any{{"type": "tabby", "agent_socket": e.sock, "mtu": 1500, "timeout_seconds": 20}}
	if e.dualStack {
		plugins[0]["ipam"] = map[string]any{"assign_ipv4": "true", "assign_ipv6": "true"}
	}
	if _, err := os.Stat("/usr/lib/cni/tuning"); err == nil && ver != "1.1.0" && chain {
		plugins = append(plugins, map[string]any{"type": "tuning", "sysctl": map[string]string{"net.ipv4.conf.eth0.accept_local": "1"}})
	}
	b, err := json.Marshal(map[string]any{"cniVersion": ver, "name": "k8s-pod-network", "plugins": plugins})
	if err != nil {
		t.Fatal(err)
	}
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func podRT(id, netnsPath, pod string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: id, NetNS: netnsPath, IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", pod}},
	}
}

func resultAddr(t testing.TB, r types.Result) netip.Addr {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(b, &v); err != nil || len(v.IPs) != 1 {
		t.Fatalf("result %s: %v", b, err)
	}
	p, err := netip.ParsePrefix(v.IPs[0].Address)
	if err != nil {
		t.Fatal(err)
	}
	return p.Addr()
}

func (e *nodeEnv) caliLinks(t testing.TB) int {
	t.Helper()
	return strings.Count(run(t, "ip", "-n", e.node, "-o", "link", "show"), ": cali")
}

func TestPrivilegedCNIEveryVersion(t *testing.T) {
	e := newNodeEnv(t)
	ctx := context.Background()
	for i, ver := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(ver, func(t *testing.T) {
			podNS := testkit.NewNetNS(t, "tabby-ap")
			pod, podPath := podNS.Name, podNS.Path
			rt := podRT(fmt.Sprintf("ctr-%d", i), podPath, "pod"+ver)
			list := e.conflist(t, ver)
			res, err := e.cni.AddNetworkList(ctx, list, rt)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if res.Version() != ver {
				t.Errorf("result version %s, want %s", res.Version(), ver)
			}
			ip := resultAddr(t, res)
			addr := run(t, "ip", "-n", pod, "-4", "addr", "show", "eth0")
			if !strings.Contains(addr, ip.String()+"/32") {
				t.Errorf("pod addresses lack %s/32:\n%s", ip, addr)
			}
			routes := run(t, "ip", "-n", pod, "route")
			for _, want := range []string{"default via 169.254.1.1 dev eth0", "169.254.1.1 dev eth0 scope link"} {
				if !strings.Contains(routes, want) {
					t.Errorf("pod routes lack %q:\n%s", want, routes)
				}
			}
			host := run(t, "ip", "-n", e.node, "route", "show", "proto", "80")
			if !strings.Contains(host, ip.String()+" dev cali") {
				t.Errorf("node lacks the /32 route for %s:\n%s", ip, host)
			}
			if ok, _ := version.GreaterThanOrEqualTo(ver, "0.4.0"); ok {
				if err := e.cni.CheckNetworkList(ctx, list, rt); err != nil {
					t.Errorf("CHECK: %v", err)
				}
			}
			// A repeated ADD returns the same address.
			res2, err := e.cni.AddNetworkList(ctx, list, rt)
			if err != nil {
				t.Fatalf("repeated ADD: %v", err)
			}
			if ip2 := resultAddr(t, res2); ip2 != ip {
				t.Errorf("repeated ADD gave %s, first %s", ip2, ip)
			}
			for n := range 2 {
				if err := e.cni.DelNetworkList(ctx, list, rt); err != nil {
					t.Fatalf("DEL #%d: %v", n+1, err)
				}
			}
			if c := e.caliLinks(t); c != 0 {
				t.Errorf("%d cali links left after DEL", c)
			}
		})
	}
}

func TestPrivilegedPodsTalkAndDelWithoutNetns(t *testing.T) {
	e := newNodeEnv(t)
	ctx := context.Background()
	list := e.conflist(t, "1.0.0")
	p1NS := testkit.NewNetNS(t, "tabby-ap")
	p1, p1Path := p1NS.Name, p1NS.Path
	p2NS := testkit.NewNetNS(t, "tabby-ap")
	p2, p2Path := p2NS.Name, p2NS.Path
	rt1, rt2 := podRT("ctr-a", p1Path, "a"), podRT("ctr-b", p2Path, "b")
	r1, err := e.cni.AddNetworkList(ctx, list, rt1)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := e.cni.AddNetworkList(ctx, list, rt2)
	if err != nil {
		t.Fatal(err)
	}
	ip1, ip2 := resultAddr(t, r1), resultAddr(t, r2)
	run(t, "ip", "netns", "exec", p1, "ping", "-c1", "-W2", ip2.String())
	run(t, "ip", "netns", "exec", p2, "ping", "-c1", "-W2", ip1.String())
	neigh := run(t, "ip", "-n", p1, "neigh")
	if !strings.Contains(neigh, "169.254.1.1 dev eth0 lladdr ee:ee:ee:ee:ee:ee") {
		t.Errorf("pod neighbours lack the gateway at ee:ee:ee:ee:ee:ee:\n%s", neigh)
	}
	// DEL after the pod's netns is gone.
	run(t, "ip", "netns", "del", p2)
	if err := e.cni.DelNetworkList(ctx, list, rt2); err != nil {
		t.Fatalf("DEL without netns: %v", err)
	}
	host := run(t, "ip", "-n", e.node, "route", "show", "proto", "80")
	if strings.Contains(host, ip2.String()+" dev") {
		t.Errorf("route for %s left after DEL:\n%s", ip2, host)
	}
	if err := e.cni.DelNetworkList(ctx, list, rt1); err != nil {
		t.Fatal(err)
	}
}

func TestPrivilegedRollbackAtEveryStep(t *testing.T) {
	e := newNodeEnv(t)
	ctx := context.Background()
	list := e.conflist(t, "1.0.0")
	for _, step := range []string{"request", "assign", "prepare", "prior", "complete", "routes", "endpoint", "policy"} {
		t.Run(step, func(t *testing.T) {
			path := testkit.NewNetNS(t, "tabby-ap").Path
			rt := podRT("ctr-"+step, path, "rb-"+step)
			e.setFault(func(s string) error {
				if s == step {
					return errors.New("injected failure after " + step)
				}
				return nil
			})
			_, err := e.cni.AddNetworkList(ctx, list, rt)
			e.setFault(nil)
			if err == nil || !strings.Contains(err.Error(), "injected failure") {
				t.Fatalf("ADD: %v, want the injected failure", err)
			}
			if c := e.caliLinks(t); c != 0 {
				t.Errorf("%d cali links left", c)
			}
			if out := run(t, "ip", "-n", e.node, "route", "show", "proto", "80"); strings.Contains(out, " dev cali") {
				t.Errorf("workload routes left:\n%s", out)
			}
			objs, _, err := e.store.List(ctx, api.KindWorkloadEndpoint, "")
			if err != nil || len(objs) != 0 {
				t.Errorf("endpoints left: %d %v", len(objs), err)
			}
			addrs, err := e.agent.ipam.AddressesByHandle(ctx, ipamHandle("k8s-pod-network", rt.ContainerID))
			if err != nil || len(addrs) != 0 {
				t.Errorf("addresses left: %v %v", addrs, err)
			}
			// The runtime's DEL after a failed ADD succeeds too.
			if err := e.cni.DelNetworkList(ctx, list, rt); err != nil {
				t.Errorf("DEL after failed ADD: %v", err)
			}
		})
	}
}

func TestPrivilegedConcurrentAdds(t *testing.T) {
	e := newNodeEnv(t)
	ctx := context.Background()
	const n = 50
	// A CNIConfig and a configuration list each, as concurrent runtime
	// calls have: a CNIConfig finds its executor lazily, unsynchronised
	// (libcni v1.3.1's ensureExec, seen by -race), and every one shares
	// the result cache directory, as a runtime's do.
	clients := make([]*libcni.CNIConfig, n)
	lists := make([]*libcni.NetworkConfigList, n)
	rts := make([]*libcni.RuntimeConf, n)
	for i := range n {
		path := testkit.NewNetNS(t, "tabby-ap").Path
		rts[i] = podRT(fmt.Sprintf("ctr-conc-%d", i), path, fmt.Sprintf("conc-%d", i))
		lists[i] = e.conflist(t, "1.0.0")
		clients[i] = libcni.NewCNIConfigWithCacheDir(e.cni.Path, e.cniCacheDir, nil)
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	ips := make([]netip.Addr, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := clients[i].AddNetworkList(ctx, lists[i], rts[i])
			if err != nil {
				errs[i] = err
				return
			}
			ips[i] = resultAddr(t, res)
		}()
	}
	wg.Wait()
	seen := map[netip.Addr]int{}
	for i, err := range errs {
		if err != nil {
			t.Errorf("ADD %d: %v", i, err)
			continue
		}
		if j, dup := seen[ips[i]]; dup {
			t.Errorf("pods %d and %d both got %s", i, j, ips[i])
		}
		seen[ips[i]] = i
	}
	if c := e.caliLinks(t); c != n {
		t.Errorf("%d cali links, want %d", c, n)
	}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := clients[i].DelNetworkList(ctx, lists[i], rts[i]); err != nil {
				t.Errorf("DEL %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if c := e.caliLinks(t); c != 0 {
		t.Errorf("%d cali links left after DEL", c)
	}
}

// testLogger discards logs unless TABBY_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("TABBY_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
