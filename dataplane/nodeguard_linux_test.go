package dataplane_test

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/policy"
)

// TestPrivilegedNodeGuard sends real TCP connections from a dual-stack pod
// with a natOutgoing pool to "another node" (a namespace behind the
// node's uplink, listed as a cluster node) and to "the world" (another
// address of that namespace, not a node), through each backend. The far
// end answers with the source address it saw. With the node guard:
//
//   - the pod cannot reach the other node's BGP port or the agent's port,
//     in either family;
//   - it reaches the other node's SSH port with its own address (no
//     masquerade to a cluster node);
//   - it reaches the world masqueraded to its node's address, on 179 too.
//
// The control, the same state without the guard, shows the attack: the
// pod's connection to the other node's BGP port arrives from the pod's
// node's own address.
func TestPrivilegedNodeGuard(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	t.Run("nftables", func(t *testing.T) { testNodeGuard(t, "nftables") })
	modes := backends(t)
	t.Run("iptables-"+modes[len(modes)-1], func(t *testing.T) { testNodeGuard(t, modes[len(modes)-1]) })
}

func testNodeGuard(t *testing.T, backend string) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	node, wl := workloadNode(t)
	ext := testkit.NewNetNS(t, "tbdp-p18ext")
	run(t, "ip", "-n", node.Name, "link", "add", "p18up", "type", "veth", "peer", "name", "p18upp", "netns", ext.Name)
	run(t, "ip", "-n", node.Name, "link", "set", "p18up", "up")
	run(t, "ip", "-n", ext.Name, "link", "set", "p18upp", "up")
	run(t, "ip", "-n", node.Name, "addr", "add", "198.18.18.1/24", "dev", "p18up")
	run(t, "ip", "-n", node.Name, "-6", "addr", "add", "2001:db8:18::1/64", "dev", "p18up", "nodad")
	for _, a := range []string{"198.18.18.2/24", "198.18.18.3/24"} {
		run(t, "ip", "-n", ext.Name, "addr", "add", a, "dev", "p18upp")
	}
	for _, a := range []string{"2001:db8:18::2/64", "2001:db8:18::3/64"} {
		run(t, "ip", "-n", ext.Name, "-6", "addr", "add", a, "dev", "p18upp", "nodad")
	}
	// Proxy ARP answers for the pods' gateway only with a route to it.
	run(t, "ip", "-n", node.Name, "route", "add", "default", "via", "198.18.18.2")
	pod := testkit.NewNetNS(t, "tbdp-p18pod")
	spec := podSpec(pod, "p18-pod", "10.244.18.1/32", "fd00:10:244:18::1/128")
	setup(t, wl, spec)
	t.Cleanup(func() {
		if err := wl.Teardown(context.Background(), spec); err != nil {
			t.Error(err)
		}
	})
	// The far end's return route to the pods: none (natOutgoing is what
	// makes the world answer); the other node knows the pods (BGP would
	// have told it).
	run(t, "ip", "-n", ext.Name, "route", "add", "10.244.18.0/24", "via", "198.18.18.1")
	run(t, "ip", "-n", ext.Name, "-6", "route", "add", "fd00:10:244:18::/64", "via", "2001:db8:18::1")
	for _, a := range []string{"198.18.18.2", "198.18.18.3", "[2001:db8:18::2]", "[2001:db8:18::3]"} {
		for _, port := range []string{"179", "22", "9099"} {
			serveWhoAmI(t, ext, a+":"+port)
		}
	}

	var f dataplane.Firewall
	if backend == "nftables" {
		f = newNFT(t, node, 0)
	} else {
		ipt, err := dataplane.NewIPTablesFirewall(dataplane.FirewallConfig{NetNS: node.Path, Backend: backend})
		if err != nil {
			t.Fatal(err)
		}
		f = ipt
	}
	nodes := []*api.Node{
		{Metadata: api.ObjectMeta{Name: "n1"}, Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: "198.18.18.1/24", IPv6Address: "2001:db8:18::1/64"}}},
		{Metadata: api.ObjectMeta{Name: "n2"}, Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: "198.18.18.2/24", IPv6Address: "2001:db8:18::2/64"}}},
	}
	in := policy.Input{Node: "n1", EndpointToHostAction: policy.EndpointToHostDrop,
		Endpoints: []*api.WorkloadEndpoint{{
			Metadata: api.ObjectMeta{Name: "pod", Namespace: "p18"},
			Spec:     api.WorkloadEndpointSpec{Node: "n1", InterfaceName: spec.HostIfName, IPNetworks: []string{"10.244.18.1/32", "fd00:10:244:18::1/128"}},
		}},
		Pools: []*api.IPPool{
			{Metadata: api.ObjectMeta{Name: "v4"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", NATOutgoing: true}},
			{Metadata: api.ObjectMeta{Name: "v6"}, Spec: api.IPPoolSpec{CIDR: "fd00:10:244::/48", NATOutgoing: true}},
		},
		Guard: policy.NewNodeGuard(nodes, nil, nil, []uint16{9099}),
	}
	apply := func(in policy.Input) {
		t.Helper()
		if _, err := f.Apply(ctx, *policy.Compile(in)); err != nil {
			t.Fatal(err)
		}
	}
	apply(in)
	seen := func(addr string) string {
		t.Helper()
		return whoAmI(t, pod, addr)
	}
	for _, c := range []struct{ addr, want string }{
		{"198.18.18.2:179", ""},
		{"198.18.18.2:9099", ""},
		{"[2001:db8:18::2]:179", ""},
		{"[2001:db8:18::2]:9099", ""},
		{"198.18.18.2:22", "10.244.18.1"},
		{"[2001:db8:18::2]:22", "fd00:10:244:18::1"},
		{"198.18.18.3:22", "198.18.18.1"},
		{"198.18.18.3:179", "198.18.18.1"},
		{"[2001:db8:18::3]:179", "2001:db8:18::1"},
	} {
		if got := seen(c.addr); got != c.want {
			t.Errorf("guarded: pod -> %s seen from %q, want %q", c.addr, got, c.want)
		}
	}
	// The control: without the guard the pod speaks for its node.
	in.Guard = policy.NodeGuard{}
	apply(in)
	for _, c := range []struct{ addr, want string }{
		{"198.18.18.2:179", "198.18.18.1"},
		{"[2001:db8:18::2]:179", "2001:db8:18::1"},
	} {
		if got := seen(c.addr); got != c.want {
			t.Errorf("unguarded (the attack): pod -> %s seen from %q, want %q", c.addr, got, c.want)
		}
	}
	if err := f.Remove(ctx); err != nil {
		t.Fatal(err)
	}
}

// serveWhoAmI answers every connection on addr inside n with the source
// address it came from, until the test ends.
func serveWhoAmI(t *testing.T, n testkit.NetNS, addr string) {
	t.Helper()
	var l net.Listener
	if err := ns.WithNetNSPath(n.Path, func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			ap, _ := netip.ParseAddrPort(c.RemoteAddr().String())
			_, _ = c.Write([]byte(ap.Addr().Unmap().String() + "\n"))
			_ = c.Close()
		}
	}()
}

// whoAmI connects from n to addr and returns the source address the far
// end saw, "" when the connection failed.
func whoAmI(t *testing.T, n testkit.NetNS, addr string) string {
	t.Helper()
	got := ""
	if err := ns.WithNetNSPath(n.Path, func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", addr, 700*time.Millisecond)
		if err != nil {
			return nil
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 64)
		k, _ := c.Read(buf)
		got = strings.TrimSpace(string(buf[:k]))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}
