package e2e

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
)

// The VXLAN tests run labs whose nodes sit in two underlay subnets joined by
// the ToR, which routes the underlay only (lab.Options.TwoSubnets): node1
// and node3 in 198.18.0.0/24, node2 (and node4) in 198.18.1.0/24. BGP runs
// between all nodes across the ToR, but a learned route to another subnet's
// node cannot be installed (its next hop is not on-link), and the ToR drops
// pod addresses: without a tunnel pods across it cannot talk.

// upVXLANLab is upLab for a two-subnet lab: BGP must establish, but the
// BGP-learned routes across subnets never will; instead every node must
// route every other node's blocks (want: through the tunnel, or natively
// for CrossSubnet's same-subnet nodes) — waitTunnels checks that.
func upVXLANLab(t *testing.T, o lab.Options) *lab.Lab {
	t.Helper()
	testkit.RequirePrivileged(t, "ip", "nsenter", "ping")
	o.RunDir, o.BinDir, o.Log, o.TwoSubnets = runDir, os.Getenv("TABBY_BIN"), testWriter{t}, true
	_ = lab.Teardown(context.Background(), runDir, o.Name, io.Discard)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l, err := lab.Up(ctx, o)
	if err != nil {
		_ = lab.Teardown(context.Background(), runDir, o.Name, io.Discard)
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dumpLogs(t, l)
		}
		if err := l.Down(); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	return l
}

// waitTunnels waits until every node's tunnel of each family in fams
// (false: IPv4, true: IPv6) routes want(node) destinations, and returns
// how long that took.
func waitTunnels(t *testing.T, l *lab.Lab, fams []bool, want func(node string) int) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	return testkit.Eventually(t, 90*time.Second, "every node's tunnel routes", func() error {
		for _, n := range l.State().Nodes {
			st, err := l.NodeStatus(ctx, n.Name)
			if err != nil {
				return err
			}
			for _, is6 := range fams {
				i := 0
				if is6 {
					i = 1
				}
				if len(st.Tunnels) != 2 {
					return fmt.Errorf("%s reports %d tunnels", n.Name, len(st.Tunnels))
				}
				tun := st.Tunnels[i]
				if tun.Error != "" || tun.Routes < want(n.Name) {
					return fmt.Errorf("%s %s: %d routes (want %d), error %q", n.Name, tun.Device, tun.Routes, want(n.Name), tun.Error)
				}
			}
		}
		return nil
	})
}

// txPackets is a device's transmitted-packet counter in a lab namespace.
func txPackets(t *testing.T, l *lab.Lab, target, dev string) int {
	t.Helper()
	return devCounter(t, l, target, dev, 9)
}

// rxPackets is a device's received-packet counter.
func rxPackets(t *testing.T, l *lab.Lab, target, dev string) int {
	t.Helper()
	return devCounter(t, l, target, dev, 1)
}

// devCounter reads field i (after the name) of /proc/net/dev.
func devCounter(t *testing.T, l *lab.Lab, target, dev string, field int) int {
	t.Helper()
	out, err := l.Exec(context.Background(), target, "cat", "/proc/net/dev")
	if err != nil {
		t.Fatalf("reading %s's counters: %v: %s", target, err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && name == dev {
			f := strings.Fields(rest)
			n, _ := strconv.Atoi(f[field-1])
			return n
		}
	}
	t.Fatalf("%s has no device %s", target, dev)
	return 0
}

var mtuRE = regexp.MustCompile(` mtu (\d+) `)

// linkMTU is the MTU of dev in a lab namespace.
func linkMTU(t *testing.T, l *lab.Lab, target, dev string) int {
	t.Helper()
	out, err := l.Exec(context.Background(), target, "ip", "-o", "link", "show", dev)
	m := mtuRE.FindSubmatch(out)
	if err != nil || m == nil {
		t.Fatalf("ip link show %s in %s: %v: %s", dev, target, err, out)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// labPod is a pod of the lab with its addresses by family.
type labPod struct {
	name, node string
	v4, v6     netip.Addr
}

func labPods(t *testing.T, l *lab.Lab) map[string]labPod {
	t.Helper()
	out := map[string]labPod{}
	for _, p := range l.State().Pods {
		q := labPod{name: p.Name, node: p.Node}
		for _, ip := range p.IPs {
			if ip.Addr().Is4() {
				q.v4 = ip.Addr()
			} else {
				q.v6 = ip.Addr()
			}
		}
		out[p.Name] = q
	}
	return out
}

// TestVXLANAlways: a dual-stack lab of four nodes in two subnets with
// vxlanMode Always: every node has both tunnels with its address and MAC
// on its Node, every pod pings every pod in both families, TCP works both
// ways across the router, pods got the tunnel's MTU, and VXLAN packets from
// the router (not a cluster node) are dropped before the tunnel sees them.
func TestVXLANAlways(t *testing.T) {
	l := upVXLANLab(t, lab.Options{Name: "vxlan-al", Nodes: 4, PodsPerNode: 1, DualStack: true, VXLANMode: api.VXLANModeAlways})
	took := waitTunnels(t, l, []bool{false, true}, func(string) int { return 3 })
	t.Logf("every node routes every other node's blocks through the tunnels %v after the pods were added", took.Round(time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, n := range l.State().Nodes {
		node, err := datastore.GetAs[*api.Node](ctx, l.Store(), api.KindNode, "", n.Name)
		if err != nil {
			t.Fatal(err)
		}
		for _, is6 := range []bool{false, true} {
			if _, _, ok := node.VXLANTunnel(is6); !ok {
				t.Errorf("node %s records no IPv6=%v tunnel: %+v", n.Name, is6, node.Spec)
			}
		}
	}
	pods := labPods(t, l)
	var failed []string
	total := 0
	for _, from := range pods {
		for _, to := range pods {
			if from.name == to.name {
				continue
			}
			for _, ip := range []netip.Addr{to.v4, to.v6} {
				total++
				if err := l.Ping(ctx, from.name, ip); err != nil {
					if err := l.Ping(ctx, from.name, ip); err != nil {
						failed = append(failed, fmt.Sprintf("%s(%s) -> %s(%s)", from.name, from.node, to.name, ip))
					}
				}
			}
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d pings failed:\n%s", len(failed), total, strings.Join(failed, "\n"))
	}
	// TCP both ways between node1 (first subnet) and node2 (second).
	tcpExchange(t, l, "n1p1", "n2p1")
	tcpExchange(t, l, "n2p1", "n1p1")
	for _, p := range pods {
		// The smaller of the two tunnels' MTUs: 1500 - 70.
		if m := linkMTU(t, l, p.name, "eth0"); m != 1430 {
			t.Errorf("pod %s has MTU %d, want 1430 (the IPv6 tunnel's)", p.name, m)
		}
	}
	if m := linkMTU(t, l, "node1", "vxlan.tabby"); m != 1450 {
		t.Errorf("node1's vxlan.tabby has MTU %d, want 1450", m)
	}
	// A large packet that fits the pod MTU crosses the tunnel unfragmented.
	if out, err := l.Exec(ctx, "n1p1", "ping", "-c1", "-W2", "-M", "do", "-s", strconv.Itoa(1430-28), pods["n2p1"].v4.String()); err != nil {
		t.Errorf("a 1430-byte packet with DF through the tunnel: %v: %s", err, out)
	}

	vxlanFromOutsider(t, l)
	holdThroughSwitches(t, l, pods["n3p1"].v4)
	vniClash(t, l, pods)
}

// vniClash: another program's device on node4 holds VNI 4097 on port 4789
// (IPv4) when the cluster's VNI becomes 4097. node4 reports the clash and
// withdraws its IPv4 tunnel from its Node; the other nodes move to 4097,
// list node4 as native-until-it-has-a-tunnel and route nothing of its into
// a tunnel; its IPv6 tunnel (no clash there) keeps working. Behind the
// router without a tunnel, node4's pod is unreachable over IPv4, as
// without VXLAN — and said so — never sent into a tunnel that drops it.
func vniClash(t *testing.T, l *lab.Lab, pods map[string]labPod) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n4 := l.State().Node("node4")
	if out, err := l.Exec(ctx, "node4", "ip", "link", "add", "flannel.1", "type", "vxlan", "id", "4097", "dstport", "4789",
		"local", n4.IP.Addr().String(), "dev", "eth0", "nolearning"); err != nil {
		t.Fatalf("making flannel.1 on node4: %v: %s", err, out)
	}
	vni := uint32(4097)
	if _, err := l.Store().Apply(ctx, &api.BGPConfiguration{Metadata: api.ObjectMeta{Name: api.SingletonName}, Spec: api.BGPConfigurationSpec{VXLANVNI: &vni}}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 60*time.Second, "node4 reports the clash and the others route around it", func() error {
		st, err := l.NodeStatus(ctx, "node4")
		if err != nil {
			return err
		}
		if !strings.Contains(st.Tunnels[0].Error, "flannel.1 already uses VNI 4097 on port 4789") {
			return fmt.Errorf("node4's IPv4 tunnel error %q", st.Tunnels[0].Error)
		}
		for _, n := range []string{"node1", "node2", "node3"} {
			st, err := l.NodeStatus(ctx, n)
			if err != nil {
				return err
			}
			if t4 := st.Tunnels[0]; t4.VNI != 4097 || !slices.Contains(t4.Native, "node4") || t4.Routes != 2 || t4.Error != "" {
				return fmt.Errorf("%s's IPv4 tunnel: VNI %d, native %v, %d routes, error %q", n, t4.VNI, t4.Native, t4.Routes, t4.Error)
			}
			if t6 := st.Tunnels[1]; t6.Routes != 3 || t6.Error != "" {
				return fmt.Errorf("%s's IPv6 tunnel: %d routes, error %q", n, t6.Routes, t6.Error)
			}
		}
		return nil
	})
	node, err := datastore.GetAs[*api.Node](ctx, l.Store(), api.KindNode, "", "node4")
	if err != nil {
		t.Fatal(err)
	}
	if node.Spec.IPv4VXLANTunnelAddr != "" {
		t.Errorf("node4 still records an IPv4 tunnel: %s", node.Spec.IPv4VXLANTunnelAddr)
	}
	if out, err := l.Exec(ctx, "node1", "ip", "route", "get", pods["n4p1"].v4.String()); err == nil && strings.Contains(string(out), "vxlan") {
		t.Errorf("node1 routes node4's pod into the tunnel node4 cannot have:\n%s", out)
	}
	for _, c := range []struct {
		to   netip.Addr
		want bool
	}{{pods["n2p1"].v4, true}, {pods["n4p1"].v6, true}, {pods["n4p1"].v4, false}} {
		err := l.Ping(ctx, "n1p1", c.to)
		if c.want && err != nil {
			err = l.Ping(ctx, "n1p1", c.to) // one retry: neighbour discovery
		}
		if (err == nil) != c.want {
			t.Errorf("n1p1 -> %s after the VNI change: reached %v, want %v", c.to, err == nil, c.want)
		}
	}
}

// holdThroughSwitches keeps a TCP connection from n1p1 to a pod of the
// same subnet (dst) while the pool goes Always → Never → Always: its
// packets move from the tunnel to the native path and back, and the
// connection lives on; the longest wait for an echo is reported.
func holdThroughSwitches(t *testing.T, l *lab.Lab, dst netip.Addr) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	startVXLANSink(t, l, "n3p1")
	type result struct {
		ms  float64
		err error
	}
	done := make(chan result, 1)
	go func() {
		ms, err := vxlanHelper(ctx, l, "n1p1", "hold", dst.String(), "8s")
		done <- result{ms, err}
	}()
	setMode := func(m api.VXLANMode) {
		p, err := datastore.GetAs[*api.IPPool](ctx, l.Store(), api.KindIPPool, "", "default-ipv4-ippool")
		if err != nil {
			t.Fatal(err)
		}
		p.Spec.VXLANMode = m
		if _, err := datastore.UpdateAs(ctx, l.Store(), p); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2 * time.Second)
	setMode(api.VXLANModeNever)
	time.Sleep(3 * time.Second)
	setMode(api.VXLANModeAlways)
	r := <-done
	if r.err != nil {
		t.Fatalf("a TCP connection across Always → Never → Always: %v", r.err)
	}
	t.Logf("a TCP connection lived through Always → Never → Always; the longest echo took %.1f ms", r.ms)
}

// vxlanFromOutsider sends VXLAN packets to node1's tunnel from the ToR,
// which is no cluster node: a device of the cluster's VNI with node1's
// tunnel address and MAC as its static neighbour. The tunnel guard drops
// them: no ping answers, and node1's tunnel receives nothing.
func vxlanFromOutsider(t *testing.T, l *lab.Lab) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := l.NodeStatus(ctx, "node1")
	if err != nil {
		t.Fatal(err)
	}
	tun := st.Tunnels[0]
	node1 := l.State().Node("node1").IP.Addr()
	tor, err := l.ResolveNetNS("tor")
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"link", "add", "vxatk", "type", "vxlan", "id", "4096", "dstport", "4789", "remote", node1.String(), "dev", "eth0", "nolearning"},
		{"addr", "add", "10.244.250.1/32", "dev", "vxatk"},
		{"link", "set", "vxatk", "up"},
		{"route", "add", tun.Addr.String() + "/32", "dev", "vxatk"},
		{"neigh", "add", tun.Addr.String(), "lladdr", tun.MAC, "dev", "vxatk", "nud", "permanent"},
	} {
		if out, err := exec.CommandContext(ctx, "ip", append([]string{"-n", tor}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip -n %s %s: %v: %s", tor, strings.Join(args, " "), err, out)
		}
	}
	rx := rxPackets(t, l, "node1", "vxlan.tabby")
	txAtk := txPackets(t, l, "tor", "vxatk")
	out, err := l.Exec(ctx, "tor", "ping", "-c3", "-i", "0.2", "-W1", tun.Addr.String())
	if err == nil {
		t.Errorf("node1's tunnel answered VXLAN from the ToR (not a cluster node):\n%s", out)
	}
	if sent := txPackets(t, l, "tor", "vxatk") - txAtk; sent < 3 {
		t.Errorf("the ToR sent %d VXLAN packets, want at least 3: the check proves nothing", sent)
	}
	if got := rxPackets(t, l, "node1", "vxlan.tabby") - rx; got != 0 {
		t.Errorf("node1's vxlan.tabby received %d packets from the ToR, want 0", got)
	}
}

// TestVXLANNeverToCrossSubnet: three nodes, node1 and node3 in one subnet,
// node2 behind the router. With Never, pods in one subnet talk natively and
// pods across the router cannot. The pool is switched to CrossSubnet under
// continuous pings: same-subnet pings keep flowing (their loss is
// counted), cross-subnet ones start once the tunnels are up. Then
// same-subnet traffic stays native (node1's vxlan.tabby sends nothing for
// it) and cross-subnet traffic goes through the tunnel.
func TestVXLANNeverToCrossSubnet(t *testing.T) {
	l := upVXLANLab(t, lab.Options{Name: "vxlan-cs", Nodes: 3, PodsPerNode: 1, DualStack: true, VXLANMode: api.VXLANModeNever})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	pods := labPods(t, l)
	same, cross := pods["n3p1"].v4, pods["n2p1"].v4
	testkit.Eventually(t, 60*time.Second, "same-subnet pods reach each other natively", func() error {
		_, err := l.Exec(ctx, "n1p1", "ping", "-c1", "-W1", same.String())
		return err
	})
	if _, err := l.Exec(ctx, "n1p1", "ping", "-c2", "-W1", cross.String()); err == nil {
		t.Fatal("with Never, a pod reached a pod behind the router: the lab's router routes pod addresses")
	}

	// Continuous pings (every 20 ms for 12 s) during the switch.
	const interval, window = 20 * time.Millisecond, 12 * time.Second
	type stream struct {
		cmd *exec.Cmd
		out strings.Builder
	}
	start := func(dst netip.Addr) *stream {
		s := &stream{cmd: exec.CommandContext(ctx, "nsenter", "--net="+netnsPath(t, l, "n1p1"), "ping", "-D", "-n",
			"-i", fmt.Sprintf("%.3f", interval.Seconds()), "-w", strconv.Itoa(int(window.Seconds())), dst.String())}
		s.cmd.Stdout = &s.out
		if err := s.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return s
	}
	sameS, crossS := start(same), start(cross)
	time.Sleep(2 * time.Second) // pings before the switch
	switched := time.Now()
	for _, name := range []string{"default-ipv4-ippool", "default-ipv6-ippool"} {
		p, err := datastore.GetAs[*api.IPPool](ctx, l.Store(), api.KindIPPool, "", name)
		if err != nil {
			t.Fatal(err)
		}
		p.Spec.VXLANMode = api.VXLANModeCrossSubnet
		if _, err := datastore.UpdateAs(ctx, l.Store(), p); err != nil {
			t.Fatal(err)
		}
	}
	_ = sameS.cmd.Wait() // ping exits 1 when it lost some: the counts say
	_ = crossS.cmd.Wait()
	sentSame, gotSame, _ := pingCounts(t, sameS.out.String())
	sentCross, gotCross, first := pingCounts(t, crossS.out.String())
	t.Logf("switch Never→CrossSubnet under pings every %v: same subnet %d/%d answered (%d lost); across the router %d/%d answered, the first %v after the switch",
		interval, gotSame, sentSame, sentSame-gotSame, gotCross, sentCross, first.Sub(switched).Round(time.Millisecond))
	if gotSame < sentSame-2 {
		t.Errorf("the switch lost %d of %d same-subnet pings, want at most 2 (native routes must not move)", sentSame-gotSame, sentSame)
	}
	if gotCross == 0 {
		t.Errorf("no cross-subnet ping answered within %v of the switch", window-2*time.Second)
	}

	// CrossSubnet: node1 tunnels to node2 only; node3 is routed natively.
	waitTunnels(t, l, []bool{false, true}, func(n string) int {
		if n == "node2" {
			return 2 // both others are behind the router, from node2
		}
		return 1
	})
	st, err := l.NodeStatus(ctx, "node1")
	if err != nil {
		t.Fatal(err)
	}
	for _, tun := range st.Tunnels {
		if tun.Mode != "CrossSubnet" || strings.Join(tun.Direct, ",") != "node3" {
			t.Errorf("node1's %s: mode %q, direct %v; want CrossSubnet, node3 native", tun.Device, tun.Mode, tun.Direct)
		}
	}
	for _, f := range []struct {
		dev         string
		same, cross netip.Addr
	}{
		{"vxlan.tabby", same, cross},
		{"vxlan-v6.tabby", pods["n3p1"].v6, pods["n2p1"].v6},
	} {
		tx := txPackets(t, l, "node1", f.dev)
		if out, err := l.Exec(ctx, "n1p1", "ping", "-c20", "-i", "0.05", "-W1", f.same.String()); err != nil {
			t.Errorf("same-subnet pings to %s with CrossSubnet: %v\n%s", f.same, err, out)
		}
		if d := txPackets(t, l, "node1", f.dev) - tx; d != 0 {
			t.Errorf("20 same-subnet pings to %s sent %d packets through node1's %s, want 0 (native)", f.same, d, f.dev)
		}
		tx = txPackets(t, l, "node1", f.dev)
		// One retry: the first IPv6 packet may wait for the pod's
		// neighbour discovery.
		if out, err := l.Exec(ctx, "n1p1", "ping", "-c20", "-i", "0.05", "-W1", f.cross.String()); err != nil {
			if out, err = l.Exec(ctx, "n1p1", "ping", "-c20", "-i", "0.05", "-W1", f.cross.String()); err != nil {
				t.Errorf("cross-subnet pings to %s with CrossSubnet: %v\n%s", f.cross, err, out)
			}
		}
		if d := txPackets(t, l, "node1", f.dev) - tx; d < 20 {
			t.Errorf("20 cross-subnet pings to %s sent %d packets through node1's %s, want at least 20", f.cross, d, f.dev)
		}
	}
	tcpExchange(t, l, "n2p1", "n1p1")
	tcpExchange(t, l, "n1p1", "n2p1")

	// The pods were made under Never, with MTU 1500: a full-sized packet
	// with DF gets "fragmentation needed" from the tunnel, and TCP follows
	// the path MTU both ways.
	if m := linkMTU(t, l, "n1p1", "eth0"); m != 1500 {
		t.Errorf("n1p1, made under Never, has MTU %d, want 1500", m)
	}
	out, err := l.Exec(ctx, "n1p1", "ping", "-c1", "-W2", "-M", "do", "-s", "1472", cross.String())
	if err == nil || !strings.Contains(string(out), "mtu = 1450") {
		t.Errorf("a 1500-byte DF packet into the tunnel: %v, want fragmentation needed (mtu = 1450):\n%s", err, out)
	}
	startVXLANSink(t, l, "n2p1")
	if n, err := vxlanHelper(ctx, l, "n1p1", "echo", cross.String(), "1000000"); err != nil || n != 1e6 {
		t.Errorf("1 MB echoed over TCP between 1500-MTU pods through the tunnel: %v bytes, %v", n, err)
	}
	vxlanTabbyctl(t, l)
}

// vxlanTabbyctl: node status shows node1's tunnel with its path to node2
// and node3 as native; explain pod tells node2's route to n1p1 through
// the tunnel and node3's over BGP; ipam check counts no tunnel address as
// a leak.
func vxlanTabbyctl(t *testing.T, l *lab.Lab) {
	t.Helper()
	out, err := tabbyctl(t, l, "node", "status", "--node", "node1")
	if err != nil {
		t.Fatalf("node status: %v\n%s", err, out)
	}
	for _, want := range []string{"VXLAN vxlan.tabby: CrossSubnet, address 10.244.", "VXLAN vxlan-v6.tabby: CrossSubnet, address fd00:10:244:",
		"1 tunnelled route", "dev vxlan.tabby onlink   (node2)", "dev vxlan-v6.tabby onlink   (node2)", "native (same subnet, CrossSubnet): node3"} {
		if !strings.Contains(out, want) {
			t.Errorf("node status lacks %q:\n%s", want, out)
		}
	}
	out, err = tabbyctl(t, l, "explain", "pod", "default/n1p1")
	if err != nil {
		t.Fatalf("explain: %v\n%s", err, out)
	}
	node1 := l.State().Node("node1").IP.Addr().String()
	node16 := l.State().Node("node1").IP6.Addr().String()
	var node2Lines, node3Lines []string
	for _, line := range strings.Split(out, "\n") {
		switch f := strings.Fields(line); {
		case len(f) > 0 && f[0] == "node2":
			node2Lines = append(node2Lines, line)
		case len(f) > 0 && f[0] == "node3":
			node3Lines = append(node3Lines, line)
		}
	}
	if len(node2Lines) != 2 || len(node3Lines) != 2 {
		t.Errorf("explain: want a route of each family for node2 and node3:\n%s", out)
	}
	for i, line := range node2Lines {
		dev := []string{"vxlan.tabby", "vxlan-v6.tabby"}[min(i, 1)]
		if !strings.Contains(line, "dev "+dev+" proto 80 onlink   (VXLAN CrossSubnet)") {
			t.Errorf("explain: node2's route is %q, want one through %s:\n%s", line, dev, out)
		}
	}
	for _, line := range node3Lines {
		if !strings.Contains(line, "via "+node1+" proto 81") && !strings.Contains(line, "via "+node16+" proto 81") {
			t.Errorf("explain: node3's route is %q, want the BGP one via node1:\n%s", line, out)
		}
	}
	if out, err := tabbyctl(t, l, "ipam", "check", "--leak-grace", "0s"); err != nil {
		t.Errorf("ipam check with tunnel addresses: %v\n%s", err, out)
	}
}

var (
	pingSummaryRE = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)
	pingReplyRE   = regexp.MustCompile(`^\[(\d+)\.(\d+)\] \d+ bytes from`)
)

// pingCounts parses `ping -D` output: packets sent and answered, and the
// time of the first answer (zero without one).
func pingCounts(t *testing.T, out string) (sent, got int, first time.Time) {
	t.Helper()
	m := pingSummaryRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no ping summary in:\n%s", out)
	}
	sent, _ = strconv.Atoi(m[1])
	got, _ = strconv.Atoi(m[2])
	for _, line := range strings.Split(out, "\n") {
		if r := pingReplyRE.FindStringSubmatch(line); r != nil {
			sec, _ := strconv.ParseInt(r[1], 10, 64)
			frac, _ := strconv.ParseFloat("0."+r[2], 64)
			first = time.Unix(sec, int64(frac*1e9))
			break
		}
	}
	return sent, got, first
}
