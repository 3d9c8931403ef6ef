package dataplane_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
)

// workloadNode makes a node namespace with forwarding on and Workloads for it.
func workloadNode(t testing.TB) (testkit.NetNS, *dataplane.NetlinkWorkloads) {
	t.Helper()
	node := testkit.NewNetNS(t, "tbdp-node")
	if err := dataplane.EnsureNodeSysctls(node.Path); err != nil {
		t.Fatalf("EnsureNodeSysctls: %v", err)
	}
	w, err := dataplane.NewWorkloads(node.Path)
	if err != nil {
		t.Fatalf("NewWorkloads: %v", err)
	}
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return node, w
}

func podSpec(pod testkit.NetNS, id string, addrs ...string) dataplane.WorkloadSpec {
	s := dataplane.WorkloadSpec{NetNS: pod.Path, IfName: "eth0", HostIfName: dataplane.HostIfName(id)}
	for _, a := range addrs {
		s.Addrs = append(s.Addrs, netip.MustParsePrefix(a))
	}
	return s
}

func setup(t testing.TB, w dataplane.Workloads, spec dataplane.WorkloadSpec) dataplane.WorkloadStatus {
	t.Helper()
	st, err := w.Setup(context.Background(), spec)
	if err != nil {
		t.Fatalf("Setup(%s): %v", spec.HostIfName, err)
	}
	return st
}

// handleIn opens a netlink handle inside a test namespace.
func handleIn(t *testing.T, ns testkit.NetNS) *netlink.Handle {
	t.Helper()
	nsh, err := netns.GetFromPath(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// snapshot is everything Setup may change, as ip prints it. IPv6 is left
// out: its link-local addresses finish duplicate address detection on their
// own time.
func snapshot(t *testing.T, node, pod testkit.NetNS) string {
	t.Helper()
	var b strings.Builder
	for _, args := range [][]string{
		{"-n", node.Name, "-d", "link", "show"},
		{"-4", "-n", node.Name, "addr", "show"},
		{"-4", "-n", node.Name, "route", "show", "table", "all"},
		{"-n", pod.Name, "-d", "link", "show"},
		{"-4", "-n", pod.Name, "addr", "show"},
		{"-4", "-n", pod.Name, "route", "show", "table", "all"},
	} {
		// ip maps peer netns ids to names by opening every namespace in
		// /run/netns; one that another test deletes meanwhile makes it
		// print this to stderr, which says nothing about ours.
		for _, line := range strings.SplitAfter(run(t, "ip", args...), "\n") {
			if !strings.HasPrefix(line, "Error: Peer netns reference is invalid.") {
				b.WriteString(line)
			}
		}
	}
	return b.String()
}

func TestHostIfName(t *testing.T) {
	// Expected value from: python3 -c "import hashlib;
	// print('cali'+hashlib.sha1(b'default/nginx-1').hexdigest()[:11])"
	if got, want := dataplane.HostIfName("default/nginx-1"), "cali01b4797dc1b"; got != want {
		t.Errorf("HostIfName = %q, want %q", got, want)
	}
	if a, b := dataplane.HostIfName("default/nginx-1"), dataplane.HostIfName("default/nginx-2"); a == b {
		t.Errorf("HostIfName collides for different workloads: %q", a)
	}
}

func TestPrivilegedWorkloadSetup(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	node, w := workloadNode(t)
	pod := testkit.NewNetNS(t, "tbdp-pod")
	spec := podSpec(pod, "default/web-1", "10.244.0.5/32")
	spec.MTU = 1400
	spec.MAC = "0a:58:0a:f4:00:05"
	st := setup(t, w, spec)

	hostIdx := run(t, "ip", "-n", node.Name, "-o", "link", "show", spec.HostIfName)
	if !strings.HasPrefix(hostIdx, fmt.Sprintf("%d: %s@", st.HostIfIndex, spec.HostIfName)) {
		t.Errorf("host link %q does not have index %d", hostIdx, st.HostIfIndex)
	}
	if st.HostMAC != dataplane.HostMAC || st.ContainerMAC != spec.MAC {
		t.Errorf("status MACs = %s/%s, want %s/%s", st.HostMAC, st.ContainerMAC, dataplane.HostMAC, spec.MAC)
	}
	for _, c := range []struct{ args, want []string }{
		{[]string{"-n", node.Name, "link", "show", spec.HostIfName},
			[]string{"mtu 1400", "state UP", "link/ether ee:ee:ee:ee:ee:ee", "link-netns " + pod.Name}},
		{[]string{"-n", node.Name, "route", "show"},
			[]string{"10.244.0.5 dev " + spec.HostIfName + " proto 80 scope link"}},
		{[]string{"-n", pod.Name, "addr", "show", "eth0"},
			[]string{fmt.Sprintf("%d: eth0@", st.ContainerIfIndex), "mtu 1400", "state UP", "link/ether " + spec.MAC, "inet 10.244.0.5/32 scope global eth0"}},
		{[]string{"-n", pod.Name, "route", "show"},
			[]string{"default via 169.254.1.1 dev eth0", "169.254.1.1 dev eth0 scope link"}},
		{[]string{"-n", pod.Name, "link", "show", "lo"}, []string{"LOOPBACK,UP"}},
	} {
		out := run(t, "ip", c.args...)
		for _, want := range c.want {
			if !strings.Contains(out, want) {
				t.Errorf("ip %s lacks %q:\n%s", strings.Join(c.args, " "), want, out)
			}
		}
	}
	for key, want := range map[string]string{
		"net.ipv4.conf." + spec.HostIfName + ".proxy_arp":    "1",
		"net.ipv4.neigh." + spec.HostIfName + ".proxy_delay": "0",
		"net.ipv4.conf." + spec.HostIfName + ".forwarding":   "1",
		"net.ipv4.conf." + spec.HostIfName + ".rp_filter":    "1",
		"net.ipv4.ip_forward":                                "1",
	} {
		if got := sysctlIn(t, node, key); got != want {
			t.Errorf("%s = %s in node netns, want %s", key, got, want)
		}
	}

	// The same through netlink inside the pod namespace.
	hp := handleIn(t, pod)
	eth0, err := hp.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	as, err := hp.AddrList(eth0, netlink.FAMILY_V4)
	if err != nil || len(as) != 1 || as[0].IPNet.String() != "10.244.0.5/32" {
		t.Errorf("pod addresses = %v (%v), want 10.244.0.5/32", as, err)
	}
	rs, err := hp.RouteList(eth0, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var gotRoutes []string
	for _, r := range rs {
		gotRoutes = append(gotRoutes, fmt.Sprintf("dst=%v gw=%v scope=%v", r.Dst, r.Gw, r.Scope))
	}
	wantRoutes := []string{"dst=0.0.0.0/0 gw=169.254.1.1 scope=universe", "dst=169.254.1.1/32 gw=<nil> scope=link"}
	if diff := cmp.Diff(wantRoutes, gotRoutes); diff != "" {
		t.Errorf("pod routes (-want +got):\n%s", diff)
	}

	if err := w.Check(context.Background(), spec); err != nil {
		t.Errorf("Check after Setup: %v", err)
	}

	// Setup again: same status, nothing changed.
	before := snapshot(t, node, pod)
	if st2 := setup(t, w, spec); !st2.Existed || st.Existed || sameLinks(st2) != st {
		t.Errorf("second Setup status = %+v, want %+v, existed", st2, st)
	}
	if diff := cmp.Diff(before, snapshot(t, node, pod)); diff != "" {
		t.Errorf("second Setup changed the namespaces (-before +after):\n%s", diff)
	}
}

func TestPrivilegedWorkloadPing(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	if _, err := exec.LookPath("ping"); err != nil {
		t.Skip("ping not installed")
	}
	node, w := workloadNode(t)
	// Proxy ARP answers for 169.254.1.1 only if the node routes it out of
	// another interface: give the node an uplink whose peer stays inside the
	// node namespace, and a default route through it.
	run(t, "ip", "-n", node.Name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
	run(t, "ip", "-n", node.Name, "addr", "add", "198.18.0.1/24", "dev", "eth0")
	run(t, "ip", "-n", node.Name, "link", "set", "eth0", "up")
	run(t, "ip", "-n", node.Name, "link", "set", "eth1", "up")
	run(t, "ip", "-n", node.Name, "route", "add", "default", "via", "198.18.0.2")

	pod1, pod2 := testkit.NewNetNS(t, "tbdp-pod1"), testkit.NewNetNS(t, "tbdp-pod2")
	spec1 := podSpec(pod1, "default/a", "10.244.0.5/32")
	spec2 := podSpec(pod2, "default/b", "10.244.0.6/32", "10.244.0.7/32")
	setup(t, w, spec1)
	setup(t, w, spec2)
	for _, c := range []struct {
		from testkit.NetNS
		to   string
	}{{pod1, "10.244.0.6"}, {pod1, "10.244.0.7"}, {pod2, "10.244.0.5"}} {
		if out, err := exec.Command("ip", "netns", "exec", c.from.Name, "ping", "-c1", "-W1", c.to).CombinedOutput(); err != nil {
			t.Errorf("ping %s from %s: %v\n%s", c.to, c.from.Name, err, out)
		}
	}
}

func TestPrivilegedWorkloadStaleLinkReplaced(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	node, w := workloadNode(t)
	oldPod, pod := testkit.NewNetNS(t, "tbdp-oldpod"), testkit.NewNetNS(t, "tbdp-pod")
	spec := podSpec(pod, "default/db-0", "10.244.0.9/32")
	// An earlier sandbox of the same workload left its host link behind,
	// and another interface holds a proto 80 route for the same /32.
	run(t, "ip", "-n", node.Name, "link", "add", spec.HostIfName, "type", "veth", "peer", "name", "eth0", "netns", oldPod.Name)
	run(t, "ip", "-n", node.Name, "link", "add", "caliother", "type", "veth", "peer", "name", "caliotherp")
	run(t, "ip", "-n", node.Name, "link", "set", "caliother", "up")
	run(t, "ip", "-n", node.Name, "route", "add", "10.244.0.9/32", "dev", "caliother", "proto", "80")

	st := setup(t, w, spec)
	if err := w.Check(context.Background(), spec); err != nil {
		t.Errorf("Check: %v", err)
	}
	if out := run(t, "ip", "-n", oldPod.Name, "link", "show"); strings.Contains(out, "eth0") {
		t.Errorf("stale peer still in old sandbox:\n%s", out)
	}
	out := run(t, "ip", "-n", node.Name, "route", "show", "10.244.0.9/32")
	if want := "10.244.0.9 dev " + spec.HostIfName + " proto 80 scope link"; strings.TrimSpace(out) != want {
		t.Errorf("host route = %q, want %q", out, want)
	}
	if st2 := setup(t, w, spec); !st2.Existed || sameLinks(st2) != st {
		t.Errorf("Setup after replacement not idempotent: %+v vs %+v", st2, st)
	}
}

func TestPrivilegedWorkloadTeardown(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	node, w := workloadNode(t)
	pod := testkit.NewNetNS(t, "tbdp-pod")
	spec := podSpec(pod, "default/job-1", "10.244.0.20/32")
	ctx := context.Background()
	setup(t, w, spec)
	for i := range 2 {
		if err := w.Teardown(ctx, spec); err != nil {
			t.Fatalf("Teardown #%d: %v", i+1, err)
		}
	}
	assertGone(t, node, spec)
	if out := run(t, "ip", "-n", pod.Name, "link", "show"); strings.Contains(out, "eth0") {
		t.Errorf("eth0 left in pod:\n%s", out)
	}
	if err := w.Check(ctx, spec); err == nil {
		t.Errorf("Check after Teardown = nil, want errors")
	}

	// Teardown after the pod netns is gone.
	setup(t, w, spec)
	run(t, "ip", "netns", "del", pod.Name)
	if err := w.Teardown(ctx, spec); err != nil {
		t.Fatalf("Teardown without netns: %v", err)
	}
	assertGone(t, node, spec)
	spec.NetNS = ""
	if err := w.Teardown(ctx, spec); err != nil {
		t.Fatalf("Teardown without netns path: %v", err)
	}
}

func assertGone(t *testing.T, node testkit.NetNS, spec dataplane.WorkloadSpec) {
	t.Helper()
	if out := run(t, "ip", "-n", node.Name, "link", "show"); strings.Contains(out, spec.HostIfName) {
		t.Errorf("host link %s left:\n%s", spec.HostIfName, out)
	}
	if out := run(t, "ip", "-n", node.Name, "route", "show", "proto", "80"); out != "" {
		t.Errorf("host routes left:\n%s", out)
	}
}

func TestPrivilegedWorkloadCheck(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	node, w := workloadNode(t)
	pod := testkit.NewNetNS(t, "tbdp-pod")
	spec := podSpec(pod, "default/chk", "10.244.0.30/32", "10.244.0.31/32")
	ctx := context.Background()
	setup(t, w, spec)

	run(t, "ip", "-n", node.Name, "route", "del", "10.244.0.31/32")
	run(t, "nsenter", "--net="+node.Path, "sh", "-c", "echo 0 > /proc/sys/net/ipv4/conf/"+spec.HostIfName+"/proxy_arp")
	run(t, "ip", "-n", pod.Name, "addr", "del", "10.244.0.30/32", "dev", "eth0")
	run(t, "ip", "-n", pod.Name, "route", "del", "default")
	testkit.ErrMentions(t, "Check after breaking the workload", w.Check(ctx, spec), []string{
		"host route 10.244.0.31/32 dev " + spec.HostIfName + " scope link proto 80 missing",
		"proxy_arp is 0, want 1",
		"has addresses [10.244.0.31/32], want [10.244.0.30/32 10.244.0.31/32]",
		"route default via 169.254.1.1 dev eth0 missing",
	})
	// Setup repairs all of it.
	setup(t, w, spec)
	if err := w.Check(ctx, spec); err != nil {
		t.Errorf("Check after repair: %v", err)
	}
	// A spec that differs from the kernel is reported too.
	other := spec
	other.MTU = 9000
	other.Addrs = spec.Addrs[:1]
	if err := w.Check(ctx, other); err == nil || !strings.Contains(err.Error(), "mtu 1500, want 9000") {
		t.Errorf("Check of a different spec = %v, want mtu difference", err)
	}
}

func TestPrivilegedWorkloadRollback(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	node, w := workloadNode(t)
	pod := testkit.NewNetNS(t, "tbdp-pod")
	spec := podSpec(pod, "default/rb", "10.244.0.40/32", "10.244.0.41/32")
	// A foreign route for the second address makes Setup fail after it
	// created the veth pair, addresses and the first host route.
	run(t, "ip", "-n", node.Name, "link", "add", "ext0", "type", "veth", "peer", "name", "ext1")
	run(t, "ip", "-n", node.Name, "link", "set", "ext0", "up")
	run(t, "ip", "-n", node.Name, "route", "add", "10.244.0.41/32", "dev", "ext0", "proto", "static")

	_, err := w.Setup(context.Background(), spec)
	if !errors.Is(err, dataplane.ErrForeignRoute) {
		t.Fatalf("Setup = %v, want ErrForeignRoute", err)
	}
	if out := run(t, "ip", "-n", node.Name, "link", "show"); strings.Contains(out, spec.HostIfName) {
		t.Errorf("host link left after failed Setup:\n%s", out)
	}
	if out := run(t, "ip", "-n", node.Name, "route", "show", "proto", "80"); out != "" {
		t.Errorf("host routes left after failed Setup:\n%s", out)
	}
	if out := run(t, "ip", "-n", pod.Name, "link", "show"); strings.Contains(out, "eth0") {
		t.Errorf("eth0 left in pod after failed Setup:\n%s", out)
	}
	if out := run(t, "ip", "-n", node.Name, "route", "show", "10.244.0.41/32"); !strings.Contains(out, "dev ext0 proto static") {
		t.Errorf("foreign route touched: %q", out)
	}

	// With the obstacle gone Setup works.
	run(t, "ip", "-n", node.Name, "route", "del", "10.244.0.41/32")
	setup(t, w, spec)
	if err := w.Check(context.Background(), spec); err != nil {
		t.Errorf("Check: %v", err)
	}
}

func TestPrivilegedWorkloadSetupErrors(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	node, w := workloadNode(t)
	pod := testkit.NewNetNS(t, "tbdp-pod")
	ctx := context.Background()

	// The container interface exists and is not ours: refuse, touch nothing.
	run(t, "ip", "-n", pod.Name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth9")
	spec := podSpec(pod, "default/x", "10.244.0.50/32")
	if _, err := w.Setup(ctx, spec); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("Setup over a foreign eth0 = %v, want already exists", err)
	}
	if out := run(t, "ip", "-n", pod.Name, "link", "show"); !strings.Contains(out, "eth0@eth9") {
		t.Errorf("foreign eth0 was touched:\n%s", out)
	}
	if out := run(t, "ip", "-n", node.Name, "link", "show"); strings.Contains(out, spec.HostIfName) {
		t.Errorf("host link left:\n%s", out)
	}

	missing := podSpec(testkit.NetNS{Path: "/run/netns/tbdp-does-not-exist"}, "default/y", "10.244.0.51/32")
	if _, err := w.Setup(ctx, missing); err == nil {
		t.Error("Setup with a missing netns succeeded")
	}
	bad := spec
	bad.Addrs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24")}
	if _, err := w.Setup(ctx, bad); err == nil || !strings.Contains(err.Error(), "not an IPv4 /32") {
		t.Errorf("Setup with a /24 = %v, want invalid spec", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	spec.IfName = "eth1"
	if _, err := w.Setup(cancelled, spec); !errors.Is(err, context.Canceled) {
		t.Errorf("Setup with a cancelled ctx = %v, want context.Canceled", err)
	}
	if out := run(t, "ip", "-n", node.Name, "link", "show"); strings.Contains(out, spec.HostIfName) {
		t.Errorf("host link left after cancelled Setup:\n%s", out)
	}
}

func TestPrivilegedWorkloadsConcurrent(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	node, w := workloadNode(t)
	const n = 6
	specs := make([]dataplane.WorkloadSpec, n)
	for i := range specs {
		specs[i] = podSpec(testkit.NewNetNS(t, "tbdp-"+fmt.Sprintf("pod%d", i)), fmt.Sprintf("default/p%d", i), fmt.Sprintf("10.244.1.%d/32", i+1))
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, s := range specs {
		wg.Go(func() {
			if _, err := w.Setup(context.Background(), s); err != nil {
				errs[i] = err
				return
			}
			errs[i] = w.Check(context.Background(), s)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(run(t, "ip", "-n", node.Name, "route", "show", "proto", "80"), "\n"); got != n {
		t.Errorf("%d host routes, want %d", got, n)
	}
	for i, s := range specs {
		wg.Go(func() { errs[i] = w.Teardown(context.Background(), s) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if out := run(t, "ip", "-n", node.Name, "route", "show", "proto", "80"); out != "" {
		t.Errorf("host routes left:\n%s", out)
	}
}

func TestPrivilegedEnsureNodeSysctls(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	node := testkit.NewNetNS(t, "tbdp-node")
	run(t, "nsenter", "--net="+node.Path, "sh", "-c", "echo 0 > /proc/sys/net/ipv4/ip_forward")
	if err := dataplane.EnsureNodeSysctls(node.Path); err != nil {
		t.Fatal(err)
	}
	if got := sysctlIn(t, node, "net.ipv4.ip_forward"); got != "1" {
		t.Errorf("ip_forward = %s, want 1", got)
	}
	if err := dataplane.EnsureNodeSysctls("/run/netns/tbdp-does-not-exist"); err == nil {
		t.Error("EnsureNodeSysctls on a missing netns succeeded")
	}
}

func BenchmarkPrivilegedSetupTeardown(b *testing.B) {
	testkit.RequirePrivileged(b, "ip")
	_, w := workloadNode(b)
	pod := testkit.NewNetNS(b, "tbdp-pod")
	spec := podSpec(pod, "default/bench", "10.244.2.1/32")
	ctx := context.Background()
	for b.Loop() {
		if _, err := w.Setup(ctx, spec); err != nil {
			b.Fatal(err)
		}
		if err := w.Teardown(ctx, spec); err != nil {
			b.Fatal(err)
		}
	}
}

// TestPrivilegedHostIfSettingsOverNetlink: the netlink requests Setup
// uses set exactly what the /proc/sys files show.
func TestPrivilegedHostIfSettingsOverNetlink(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	node := testkit.NewNetNS(t, "tbdp-node")
	run(t, "ip", "-n", node.Name, "link", "add", "cali-a", "type", "veth", "peer", "name", "cali-b")
	before := map[string]string{}
	for _, k := range []string{"conf.cali-a.proxy_arp", "neigh.cali-a.proxy_delay", "conf.cali-b.proxy_arp", "neigh.cali-b.proxy_delay"} {
		before[k] = sysctlIn(t, node, "net.ipv4."+k)
	}
	if before["conf.cali-a.proxy_arp"] != "0" || before["neigh.cali-a.proxy_delay"] == "0" {
		t.Fatalf("a new interface's defaults: %v", before)
	}
	idx := strings.TrimSpace(run(t, "ip", "netns", "exec", node.Name, "cat", "/sys/class/net/cali-a/ifindex"))
	var ifindex int
	if _, err := fmt.Sscan(idx, &ifindex); err != nil {
		t.Fatal(err)
	}
	run(t, "ip", "netns", "exec", node.Name, "sysctl", "-qw", "net.ipv4.conf.cali-a.forwarding=0")
	if err := dataplane.SetHostIfOverNetlink(node.Path, ifindex); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{
		"conf.cali-a.proxy_arp": "1", "neigh.cali-a.proxy_delay": "0", "conf.cali-a.forwarding": "1",
		"conf.cali-b.proxy_arp": before["conf.cali-b.proxy_arp"], "neigh.cali-b.proxy_delay": before["neigh.cali-b.proxy_delay"],
	} {
		if got := sysctlIn(t, node, "net.ipv4."+k); got != want {
			t.Errorf("net.ipv4.%s = %s, want %s", k, got, want)
		}
	}
}

// BenchmarkPrivilegedSetup times Setup alone, as the agent calls it (host
// routes left to the route owner), for a new pair ("new") and again on the
// pair it made ("again", with host routes, on a node with 500 other
// workload routes: the re-setup a retried ADD makes). Teardown is outside
// the timer.
func BenchmarkPrivilegedSetup(b *testing.B) {
	testkit.RequirePrivileged(b, "ip")
	ctx := context.Background()
	b.Run("new", func(b *testing.B) {
		_, w := workloadNode(b)
		pod := testkit.NewNetNS(b, "tbdp-pod")
		spec := podSpec(pod, "default/bench", "10.244.2.1/32")
		spec.SkipHostRoutes = true
		for b.Loop() {
			if _, err := w.Setup(ctx, spec); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := w.Teardown(ctx, spec); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	// The same work in the agent's two steps: Prepare (while IPAM runs)
	// and Complete (once the address is known), each timed alone.
	for _, step := range []string{"prepare", "complete"} {
		b.Run(step, func(b *testing.B) {
			_, w := workloadNode(b)
			pod := testkit.NewNetNS(b, "tbdp-pod")
			spec := podSpec(pod, "default/bench", "10.244.2.1/32")
			spec.SkipHostRoutes = true
			links := spec
			links.Addrs = nil
			for b.Loop() {
				if step == "complete" {
					b.StopTimer()
				}
				p, err := w.Prepare(ctx, links)
				if err != nil || !p.Created {
					b.Fatalf("Prepare = %+v, %v", p, err)
				}
				if step == "complete" {
					b.StartTimer()
				}
				if step == "prepare" {
					b.StopTimer()
				}
				if _, err := w.Complete(ctx, spec, p); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := w.Teardown(ctx, spec); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
	b.Run("again", func(b *testing.B) {
		node, w := workloadNode(b)
		var batch strings.Builder
		run(b, "ip", "-n", node.Name, "link", "add", "cali-others", "type", "veth", "peer", "name", "cali-peer")
		run(b, "ip", "-n", node.Name, "link", "set", "cali-others", "up")
		run(b, "ip", "-n", node.Name, "link", "set", "cali-peer", "up")
		for i := range 500 {
			fmt.Fprintf(&batch, "route add 10.244.%d.%d/32 dev cali-others proto 80\n", 100+i/250, i%250+1)
		}
		cmd := exec.Command("ip", "-n", node.Name, "-batch", "-")
		cmd.Stdin = strings.NewReader(batch.String())
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("adding routes: %v\n%s", err, out)
		}
		pod := testkit.NewNetNS(b, "tbdp-pod")
		spec := podSpec(pod, "default/bench", "10.244.2.1/32")
		if _, err := w.Setup(ctx, spec); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := w.Setup(ctx, spec); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestPrivilegedWorkloadAddressChange(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	node, w := workloadNode(t)
	pod := testkit.NewNetNS(t, "tbdp-pod")
	ctx := context.Background()
	old := podSpec(pod, "default/mv", "10.244.0.60/32", "10.244.0.61/32")
	st := setup(t, w, old)
	spec := podSpec(pod, "default/mv", "10.244.0.61/32", "10.244.0.62/32")
	spec.MTU = 1450
	if st2 := setup(t, w, spec); !st2.Existed || sameLinks(st2) != st {
		t.Errorf("Setup with new addresses recreated the pair: %+v vs %+v", st2, st)
	}
	if err := w.Check(ctx, spec); err != nil {
		t.Errorf("Check: %v", err)
	}
	testkit.ErrMentions(t, "Check of the old spec", w.Check(ctx, old), []string{
		"unexpected host route 10.244.0.62/32",
		"host route 10.244.0.60/32 dev " + spec.HostIfName + " scope link proto 80 missing",
		"mtu 1450, want 1500",
	})
	want := "10.244.0.61 dev " + spec.HostIfName + " scope link \n10.244.0.62 dev " + spec.HostIfName + " scope link \n"
	if got := run(t, "ip", "-n", node.Name, "route", "show", "proto", "80"); got != want {
		t.Errorf("host routes = %q, want %q", got, want)
	}
	got := run(t, "ip", "-4", "-o", "-n", pod.Name, "addr", "show", "dev", "eth0")
	if strings.Contains(got, "10.244.0.60") || !strings.Contains(got, "10.244.0.61/32") || !strings.Contains(got, "10.244.0.62/32") {
		t.Errorf("pod addresses:\n%s", got)
	}
}

// sameLinks is st without Existed, to compare a repeated Setup's status
// with the first one's.
func sameLinks(st dataplane.WorkloadStatus) dataplane.WorkloadStatus {
	st.Existed = false
	return st
}

// TestPrivilegedWorkloadPrepareComplete: a pair made in two steps, the
// addresses known only for the second (the agent's ADD, Prepare running
// while IPAM assigns), ends as Setup makes it, IPv4 and dual-stack.
// Prepare leaves an existing or a stale pair to Complete (Setup), and a
// failed Complete removes the pair Prepare made.
func TestPrivilegedWorkloadPrepareComplete(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	node, w := workloadNode(t)
	ctx := context.Background()
	for _, c := range []struct {
		id    string
		addrs []string
	}{{"default/pc4", []string{"10.244.0.60/32"}}, {"default/pc6", []string{"10.244.0.61/32", "fd00:10:244::61/128"}}} {
		pod := testkit.NewNetNS(t, "tbdp-pod")
		spec := podSpec(pod, c.id, c.addrs...)
		spec.MTU = 1400
		spec.MAC = "0a:58:0a:f4:00:3c"
		links := spec
		links.Addrs = nil
		p, err := w.Prepare(ctx, links)
		if err != nil || !p.Created {
			t.Fatalf("%s: Prepare = %+v, %v; want a new pair", c.id, p, err)
		}
		// Prepared: the host end up with its settings, the container end
		// down without addresses, lo up.
		if out := run(t, "ip", "-n", node.Name, "link", "show", spec.HostIfName); !strings.Contains(out, ",UP") || !strings.Contains(out, "mtu 1400") {
			t.Errorf("%s: prepared host end:\n%s", c.id, out)
		}
		if out := run(t, "ip", "-n", pod.Name, "addr", "show", "eth0"); strings.Contains(out, ",UP") || strings.Contains(out, "inet") ||
			!strings.Contains(out, "link/ether "+spec.MAC) || !strings.Contains(out, "mtu 1400") {
			t.Errorf("%s: prepared container end:\n%s", c.id, out)
		}
		if out := run(t, "ip", "-n", pod.Name, "link", "show", "lo"); !strings.Contains(out, "LOOPBACK,UP") {
			t.Errorf("%s: lo not up after Prepare:\n%s", c.id, out)
		}
		if got := sysctlIn(t, node, "net.ipv4.conf."+spec.HostIfName+".proxy_arp"); got != "1" {
			t.Errorf("%s: proxy_arp = %s after Prepare, want 1", c.id, got)
		}

		st, err := w.Complete(ctx, spec, p)
		if err != nil {
			t.Fatalf("%s: Complete: %v", c.id, err)
		}
		if want := (dataplane.WorkloadStatus{HostIfIndex: p.HostIfIndex, HostMAC: dataplane.HostMAC, ContainerIfIndex: p.ContainerIfIndex, ContainerMAC: spec.MAC}); st != want {
			t.Errorf("%s: Complete status = %+v, want %+v", c.id, st, want)
		}
		if err := w.Check(ctx, spec); err != nil {
			t.Errorf("%s: Check after Complete: %v", c.id, err)
		}
		if out := run(t, "ip", "-n", pod.Name, "addr", "show", "eth0"); !strings.Contains(out, ",UP") || !strings.Contains(out, "inet "+c.addrs[0]+" scope global eth0") {
			t.Errorf("%s: completed container end:\n%s", c.id, out)
		}
		if out := run(t, "ip", "-n", pod.Name, "route", "show"); !strings.Contains(out, "default via 169.254.1.1 dev eth0") || !strings.Contains(out, "169.254.1.1 dev eth0 scope link") {
			t.Errorf("%s: container routes:\n%s", c.id, out)
		}
		if len(c.addrs) > 1 {
			if out := run(t, "ip", "-6", "-n", pod.Name, "route", "show", "default"); !strings.Contains(out, "default via "+dataplane.GatewayAddr6.String()+" dev eth0") {
				t.Errorf("%s: container IPv6 default route:\n%s", c.id, out)
			}
			if out := run(t, "ip", "-6", "-n", node.Name, "addr", "show", "dev", spec.HostIfName); !strings.Contains(out, dataplane.GatewayAddr6.String()+"/64") {
				t.Errorf("%s: host end lacks the IPv6 gateway:\n%s", c.id, out)
			}
			if got := sysctlIn(t, node, "net.ipv6.conf."+spec.HostIfName+".accept_dad"); got != "0" {
				t.Errorf("%s: accept_dad = %s on the host end, want 0", c.id, got)
			}
		}

		// A pair that is there: Prepare changes nothing and Complete is Setup.
		before := snapshot(t, node, pod)
		p2, err := w.Prepare(ctx, links)
		if err != nil || p2.Created {
			t.Errorf("%s: Prepare of an existing pair = %+v, %v; want nothing created", c.id, p2, err)
		}
		if st2, err := w.Complete(ctx, spec, p2); err != nil || !st2.Existed || sameLinks(st2) != st {
			t.Errorf("%s: Complete of an existing pair = %+v, %v; want %+v, existed", c.id, st2, err, st)
		}
		if diff := cmp.Diff(before, snapshot(t, node, pod)); diff != "" {
			t.Errorf("%s: Prepare and Complete of an existing pair changed the namespaces (-before +after):\n%s", c.id, diff)
		}
	}

	// A stale host link of an earlier sandbox: Prepare leaves it, Setup
	// (Complete) replaces it.
	oldPod, pod := testkit.NewNetNS(t, "tbdp-oldpod"), testkit.NewNetNS(t, "tbdp-pod")
	spec := podSpec(pod, "default/pcs", "10.244.0.62/32")
	run(t, "ip", "-n", node.Name, "link", "add", spec.HostIfName, "type", "veth", "peer", "name", "eth0", "netns", oldPod.Name)
	p, err := w.Prepare(ctx, spec)
	if err != nil || p.Created {
		t.Errorf("Prepare with a stale host link = %+v, %v; want nothing created", p, err)
	}
	if out := run(t, "ip", "-n", oldPod.Name, "link", "show"); !strings.Contains(out, "eth0") {
		t.Errorf("Prepare removed the stale link:\n%s", out)
	}
	if _, err := w.Complete(ctx, spec, p); err != nil {
		t.Fatalf("Complete over a stale link: %v", err)
	}
	if err := w.Check(ctx, spec); err != nil {
		t.Errorf("Check after replacing the stale link: %v", err)
	}

	// A failed Complete removes the pair Prepare made.
	pod = testkit.NewNetNS(t, "tbdp-pod")
	spec = podSpec(pod, "default/pcf", "10.244.0.63/32")
	if p, err = w.Prepare(ctx, spec); err != nil || !p.Created {
		t.Fatalf("Prepare = %+v, %v; want a new pair", p, err)
	}
	bad := spec
	bad.Addrs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24")}
	if _, err := w.Complete(ctx, bad, p); err == nil {
		t.Fatal("Complete with a /24 succeeded")
	}
	if out := run(t, "ip", "-n", node.Name, "link", "show"); strings.Contains(out, spec.HostIfName) {
		t.Errorf("host link left after a failed Complete:\n%s", out)
	}
	if out := run(t, "ip", "-n", pod.Name, "link", "show"); strings.Contains(out, "eth0") {
		t.Errorf("eth0 left in the pod after a failed Complete:\n%s", out)
	}
}

// TestPrivilegedWorkloadCompleteReaddressed: the agent's ADD completes a
// prepared pair with the addresses its transaction is committing, and when
// the transaction commits others (tried again), sets those with Setup. The
// pair ends as Setup with the committed addresses makes it: the first
// address gone, the routes in place.
func TestPrivilegedWorkloadCompleteReaddressed(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	_, w := workloadNode(t)
	ctx := context.Background()
	pod := testkit.NewNetNS(t, "tbdp-pod")
	ahead := podSpec(pod, "default/pra", "10.244.0.70/32")
	links := ahead
	links.Addrs = nil
	p, err := w.Prepare(ctx, links)
	if err != nil || !p.Created {
		t.Fatalf("Prepare = %+v, %v; want a new pair", p, err)
	}
	if _, err := w.Complete(ctx, ahead, p); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	committed := podSpec(pod, "default/pra", "10.244.0.71/32")
	if _, err := w.Setup(ctx, committed); err != nil {
		t.Fatalf("Setup with the committed address: %v", err)
	}
	if err := w.Check(ctx, committed); err != nil {
		t.Errorf("Check with the committed address: %v", err)
	}
	got := run(t, "ip", "-4", "-o", "-n", pod.Name, "addr", "show", "dev", "eth0")
	if strings.Contains(got, "10.244.0.70") || !strings.Contains(got, "10.244.0.71/32") {
		t.Errorf("pod addresses:\n%s", got)
	}
	if out := run(t, "ip", "-n", pod.Name, "route", "show"); !strings.Contains(out, "default via 169.254.1.1 dev eth0") {
		t.Errorf("container routes:\n%s", out)
	}
}
