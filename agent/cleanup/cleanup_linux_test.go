package cleanup

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/agent/installcni"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/policy"
)

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// backends lists the iptables backends installed here.
func backends() []string {
	var out []string
	for _, b := range []string{dataplane.BackendLegacy, dataplane.BackendNFT} {
		if _, err := exec.LookPath("iptables-" + b + "-save"); err == nil {
			out = append(out, b)
		}
	}
	return out
}

var (
	counters  = regexp.MustCompile(`\[\d+:\d+\]`)
	builtin   = regexp.MustCompile(`^:(INPUT|OUTPUT|FORWARD|PREROUTING|POSTROUTING) `)
	linkIndex = regexp.MustCompile(`^\d+: `)
)

// snapshot is the namespace's state as text lines, everything Tabby could
// have left: routes of every table and family, links, rules and chains of
// each iptables backend (empty built-in chains left out: a table shows
// them once any program has looked at it), ipsets and ip_forward.
func snapshot(t *testing.T, ns, path string) []string {
	t.Helper()
	var lines []string
	add := func(prefix, out string) {
		for _, l := range strings.Split(out, "\n") {
			if l = strings.TrimSpace(l); l != "" {
				lines = append(lines, prefix+l)
			}
		}
	}
	add("route4: ", run(t, "ip", "-n", ns, "-4", "route", "show", "table", "all"))
	// The kernel adds an interface's IPv6 link-local route once the
	// address has passed DAD, whenever that is: not Tabby's.
	for _, l := range strings.Split(run(t, "ip", "-n", ns, "-6", "route", "show", "table", "all"), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "local fe80:") {
			lines = append(lines, "route6: "+l)
		}
	}
	for _, l := range strings.Split(run(t, "ip", "-n", ns, "-o", "link", "show"), "\n") {
		if f := strings.Fields(linkIndex.ReplaceAllString(l, "")); len(f) > 0 {
			lines = append(lines, "link: "+f[0])
		}
	}
	for _, b := range backends() {
		out := run(t, "nsenter", "--net="+path, "--", "iptables-"+b+"-save")
		for _, l := range strings.Split(out, "\n") {
			l = strings.TrimSpace(counters.ReplaceAllString(l, ""))
			if strings.HasPrefix(l, "-A ") || (strings.HasPrefix(l, ":") && !builtin.MatchString(l)) {
				lines = append(lines, "iptables-"+b+": "+l)
			}
		}
	}
	add("ipset: ", run(t, "nsenter", "--net="+path, "--", "ipset", "list", "-n"))
	if _, err := exec.LookPath("nft"); err == nil {
		// iptables-nft's own base tables (ip filter, ip nat) are shared
		// with every iptables user and stay; its tabby- chains are in the
		// iptables-nft lines above. Tabby's own table must go.
		for _, l := range strings.Split(run(t, "nsenter", "--net="+path, "--", "nft", "list", "tables"), "\n") {
			if strings.Contains(l, "tabby") {
				lines = append(lines, "nft: "+strings.TrimSpace(l))
			}
		}
	}
	add("sysctl: ip_forward=", run(t, "nsenter", "--net="+path, "--", "cat", "/proc/sys/net/ipv4/ip_forward"))
	return lines
}

// TestPrivilegedCleanup installs in a namespace of its own what a node
// running Tabby has (a pod's veth and route, block and BGP routes, firewall
// chains, jumps and sets on every installed iptables backend, ip_forward,
// the CNI files and the state directory), runs Cleanup, and diffs the
// namespace against how it was before: nothing may remain.
func TestPrivilegedCleanup(t *testing.T) {
	testkit.RequirePrivileged(t, "ip", "nsenter", "ipset")
	ctx := context.Background()
	nodeNS := testkit.NewNetNS(t, "tbcl-node")
	node, nodePath := nodeNS.Name, nodeNS.Path
	podPath := testkit.NewNetNS(t, "tbcl-pod").Path
	// The node's own uplink is not Tabby's and stays (a veth pair: no dummy module here).
	run(t, "ip", "-n", node, "link", "add", "eth0", "type", "veth", "peer", "name", "uplink")
	run(t, "ip", "-n", node, "link", "set", "uplink", "up")
	run(t, "ip", "-n", node, "addr", "add", "198.18.0.11/24", "dev", "eth0")
	run(t, "ip", "-n", node, "link", "set", "eth0", "up")
	run(t, "nsenter", "--net="+nodePath, "--", "sh", "-c", "echo 0 > /proc/sys/net/ipv4/ip_forward")
	before := snapshot(t, node, nodePath)

	// Install.
	if err := dataplane.EnsureNodeSysctls(nodePath); err != nil {
		t.Fatal(err)
	}
	w, err := dataplane.NewWorkloads(nodePath)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	spec := dataplane.WorkloadSpec{NetNS: podPath, IfName: "eth0", HostIfName: dataplane.HostIfName("default/web"),
		Addrs: []netip.Prefix{netip.MustParsePrefix("10.244.0.5/32")}}
	if _, err := w.Setup(ctx, spec); err != nil {
		t.Fatal(err)
	}
	r, err := dataplane.NewRoutes(nodePath)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, rt := range []dataplane.Route{
		{Dst: netip.MustParsePrefix("10.244.0.0/26"), Type: dataplane.RouteBlackhole, Proto: dataplane.RouteProtoWorkload},
		{Dst: netip.MustParsePrefix("10.244.1.0/26"), Type: dataplane.RouteUnicast, Dev: "eth0",
			Gateways: []netip.Addr{netip.MustParseAddr("198.18.0.12")}, Proto: dataplane.RouteProtoBGP},
	} {
		if err := r.Replace(rt); err != nil {
			t.Fatal(err)
		}
	}
	// A real ruleset for the pod: what the policy compiler gives the
	// firewall, programmed by every backend this host has.
	wep := &api.WorkloadEndpoint{Metadata: api.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: api.WorkloadEndpointSpec{Node: "node1", InterfaceName: spec.HostIfName, IPNetworks: []string{"10.244.0.5/32"}}}
	pool := &api.IPPool{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", NATOutgoing: true}}
	fw := *policy.Compile(policy.Input{Node: "node1", Endpoints: []*api.WorkloadEndpoint{wep}, Pools: []*api.IPPool{pool}})
	bs := backends()
	if len(bs) == 0 {
		t.Skip("privileged test skipped: no iptables-legacy or iptables-nft installed")
	}
	for _, b := range bs {
		f, err := dataplane.NewIPTablesFirewall(dataplane.FirewallConfig{NetNS: nodePath, Backend: b})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Apply(ctx, fw); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
	}
	if nf, err := dataplane.NewNFTFirewall(dataplane.NFTConfig{NetNS: nodePath}); err == nil {
		if _, err := nf.Apply(ctx, fw); err != nil {
			t.Fatalf("nftables: %v", err)
		}
		if err := nf.Close(); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	cni := installcni.Config{BinDir: filepath.Join(dir, "opt/cni/bin"), ConfDir: filepath.Join(dir, "etc/cni/net.d"),
		ConflistName: "10-tabby.conflist", MTU: 1500, AgentSocket: "/var/run/tabby/cni.sock"}
	shim := filepath.Join(dir, "tabby")
	if err := os.WriteFile(shim, []byte("#!shim\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	inst := cni
	inst.SourceBinary = shim
	inst.Template = `{"name": "k8s-pod-network", "cniVersion": "1.0.0", "plugins": [{"type": "tabby", "agent_socket": "__AGENT_SOCKET__", "mtu": __CNI_MTU__}]}`
	if _, err := installcni.Install(inst); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(dir, "var/lib/tabby")
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		t.Fatal(err)
	}
	installed := snapshot(t, node, nodePath)
	if cmp.Equal(before, installed) {
		t.Fatal("installing changed nothing: the test checks nothing")
	}
	t.Logf("installed:\n%s", cmp.Diff(before, installed))

	// Uninstall.
	cfg := Config{NetNS: nodePath, CNI: cni, StateDir: stateDir, RemoveWorkloads: true, ResetSysctls: true,
		CNISocket: filepath.Join(dir, "no-agent.sock")}
	rep, err := Cleanup(ctx, cfg, nil)
	if err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if diff := cmp.Diff(before, snapshot(t, node, nodePath)); diff != "" {
		t.Errorf("namespace after cleanup differs from before install (-before +after):\n%s", diff)
	}
	if !slices.Contains(rep.Links, spec.HostIfName) || !rep.Firewall || !rep.SysctlsOff {
		t.Errorf("report %+v: want the link %s, the firewall and the sysctls", rep, spec.HostIfName)
	}
	for _, p := range []string{filepath.Join(cni.BinDir, "tabby"), filepath.Join(cni.ConfDir, cni.ConflistName), stateDir} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s still there (%v)", p, err)
		}
	}
	if out := run(t, "nsenter", "--net="+podPath, "--", "ip", "-o", "link", "show"); strings.Contains(out, "eth0") {
		t.Errorf("the pod still has its interface:\n%s", out)
	}

	// Again: nothing left to remove, no error.
	rep, err = Cleanup(ctx, cfg, nil)
	if err != nil {
		t.Fatalf("second Cleanup: %v", err)
	}
	if len(rep.Routes)+len(rep.Links)+len(rep.Files) != 0 {
		t.Errorf("second Cleanup removed %+v, want nothing", rep)
	}
}
