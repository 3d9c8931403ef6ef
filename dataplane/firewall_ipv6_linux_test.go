package dataplane_test

import (
	"context"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/policy"
)

// TestPrivilegedFirewallIPv6 sends real IPv6 (and IPv4) traffic between
// dual-stack pods of one node through each backend (nftables; iptables
// with ip6tables and family inet6 ipsets), with the endpoint-to-host action
// Drop throughout:
//
//   - a policy admitting the client passes its IPv6 connection, one
//     admitting another app drops it, IPv4 alike, by port number and by
//     named port;
//   - a UDP datagram from an IPv6 source the pod does not own arrives
//     without the firewall and is dropped with it, while one from the pod's
//     own address arrives; with the endpoint listed without its IPv6
//     address, all of its IPv6 is dropped and its IPv4 passes;
//   - neighbour discovery: with both neighbour caches flushed, the client
//     resolves its gateway fe80::ecee:eeff:feee:eeee and the node resolves
//     the server (whose advertisement enters the node's INPUT) — and with
//     the ND rule taken out of the compiled ruleset, the same connection
//     fails, so the rule is what makes it work; an echo request to the
//     gateway is dropped by the action;
//   - natOutgoing: an IPv6 datagram to an address outside the pools leaves
//     with the node's address when the pool has natOutgoing, with the
//     pod's without.
func TestPrivilegedFirewallIPv6(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	t.Run("nftables", func(t *testing.T) { testFirewallIPv6(t, "nftables") })
	// One iptables mode (both render the same; the nft one keeps clear of
	// the machine-wide xtables lock).
	modes := backends(t)
	t.Run("iptables-"+modes[len(modes)-1], func(t *testing.T) {
		for _, c := range []string{"ip6tables-" + modes[len(modes)-1] + "-restore"} {
			if _, err := exec.LookPath(c); err != nil {
				t.Skipf("privileged test skipped: %s not installed", c)
			}
		}
		testFirewallIPv6(t, modes[len(modes)-1])
	})
}

func testFirewallIPv6(t *testing.T, backend string) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	node, wl := workloadNode(t)
	// The world: a namespace behind a veth, 2001:db8:17::1 on the node,
	// 2001:db8:17::2 outside (documentation range, inside the test's
	// namespaces). It is also the IPv4 uplink proxy ARP needs.
	ext := testkit.NewNetNS(t, "tbdp-p17ext")
	run(t, "ip", "-n", node.Name, "link", "add", "p17up", "type", "veth", "peer", "name", "p17upp", "netns", ext.Name)
	run(t, "ip", "-n", node.Name, "link", "set", "p17up", "up")
	run(t, "ip", "-n", ext.Name, "link", "set", "p17upp", "up")
	run(t, "ip", "-n", node.Name, "addr", "add", "198.18.17.1/24", "dev", "p17up")
	run(t, "ip", "-n", ext.Name, "addr", "add", "198.18.17.2/24", "dev", "p17upp")
	run(t, "ip", "-n", node.Name, "-6", "addr", "add", "2001:db8:17::1/64", "dev", "p17up", "nodad")
	run(t, "ip", "-n", ext.Name, "-6", "addr", "add", "2001:db8:17::2/64", "dev", "p17upp", "nodad")
	run(t, "ip", "-n", node.Name, "route", "add", "default", "via", "198.18.17.2")

	client, server := testkit.NewNetNS(t, "tbdp-p17cli"), testkit.NewNetNS(t, "tbdp-p17srv")
	cspec := podSpec(client, "p17-client", "10.244.17.1/32", "fd00:10:244:17::1/128")
	sspec := podSpec(server, "p17-server", "10.244.17.2/32", "fd00:10:244:17::2/128")
	setup(t, wl, cspec)
	setup(t, wl, sspec)
	t.Cleanup(func() {
		for _, s := range []dataplane.WorkloadSpec{cspec, sspec} {
			if err := wl.Teardown(context.Background(), s); err != nil {
				t.Error(err)
			}
		}
	})
	// A second IPv6 address in the client that its endpoint does not list:
	// the spoofed source.
	run(t, "ip", "-n", client.Name, "-6", "addr", "add", "fd00:10:244:17::99/128", "dev", "eth0", "nodad")

	for _, addr := range []string{"10.244.17.2:8080", "[fd00:10:244:17::2]:8080"} {
		serveTCP(t, server, addr)
	}
	srvUDP := listenUDP(t, server, "[fd00:10:244:17::2]:9000")
	extUDP := listenUDP(t, ext, "[2001:db8:17::2]:9000")

	connects := func(addr string, want bool) bool {
		t.Helper()
		if want { // a pass may need a neighbour resolved: retry briefly
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				if okFrom(t, client, addr, time.Second) {
					return true
				}
			}
			return false
		}
		return okFrom(t, client, addr, 500*time.Millisecond)
	}

	ep := func(name, app string, s dataplane.WorkloadSpec, addrs []netip.Prefix) *api.WorkloadEndpoint {
		var nets []string
		for _, a := range addrs {
			nets = append(nets, a.String())
		}
		return &api.WorkloadEndpoint{
			Metadata: api.ObjectMeta{Name: name, Namespace: "p17", Labels: map[string]string{"app": app}},
			Spec:     api.WorkloadEndpointSpec{Node: "n1", InterfaceName: s.HostIfName, IPNetworks: nets},
		}
	}
	allowFrom := func(app string, port api.IntOrString) *api.NetworkPolicy {
		p := &api.NetworkPolicy{Metadata: api.ObjectMeta{Namespace: "p17", Name: "server-ingress"}, Spec: api.NetworkPolicySpec{
			PodSelector: api.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			Ingress: []api.NetworkPolicyIngressRule{{
				From:  []api.NetworkPolicyPeer{{PodSelector: &api.LabelSelector{MatchLabels: map[string]string{"app": app}}}},
				Ports: []api.NetworkPolicyPort{{Port: &port}},
			}},
		}}
		p.SetDefaults()
		return p
	}
	serverEP := ep("server", "server", sspec, sspec.Addrs)
	serverEP.Spec.Ports = []api.EndpointPort{{Name: "http", Protocol: "TCP", Port: 8080}}
	pools := func(nat bool) []*api.IPPool {
		return []*api.IPPool{
			{Metadata: api.ObjectMeta{Name: "v4"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16"}},
			{Metadata: api.ObjectMeta{Name: "v6"}, Spec: api.IPPoolSpec{CIDR: "fd00:10:244::/48", NATOutgoing: nat}},
		}
	}
	in := policy.Input{Node: "n1", EndpointToHostAction: policy.EndpointToHostDrop,
		Endpoints: []*api.WorkloadEndpoint{ep("client", "client", cspec, cspec.Addrs), serverEP},
		Pools:     pools(false)}
	var f dataplane.Firewall
	diff := func(*policy.Ruleset) ([]string, error) { return nil, nil }
	// listing is the table as the backend's tools print it ("" without
	// them); want are lines it must hold once the first state is applied.
	var listing func() string
	var want []string
	if backend == "nftables" {
		nf := newNFT(t, node, 0)
		f = nf
		diff = func(rs *policy.Ruleset) ([]string, error) { return nf.Diff(ctx, *rs) }
		listing = func() string { return nftList(t, node) }
		want = []string{
			"ip6 saddr != fd00:10:244:17::1 drop",
			`iifname "cali*" icmpv6 type { mld-listener-query, mld-listener-report, mld-listener-done, nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert } accept`,
			"ip6 saddr @tabby-masq-pools6 ip6 daddr != @tabby-all-pools6 masquerade",
		}
	} else {
		ipt, err := dataplane.NewIPTablesFirewall(dataplane.FirewallConfig{NetNS: node.Path, Backend: backend})
		if err != nil {
			t.Fatal(err)
		}
		f = ipt
		listing = func() string {
			return inNS(t, node, "ip6tables-"+backend+"-save") + inNS(t, node, "ipset", "save")
		}
		want = []string{
			"-A tabby-fw-" + cspec.HostIfName + " ! -s fd00:10:244:17::1/128",
			"-m icmp6 --icmpv6-type 135 -j ACCEPT",
			"-m set --match-set tabby-masq-pools6 src -m set ! --match-set tabby-all-pools6 dst -j MASQUERADE",
			"create tabby-all-pools6 hash:net family inet6",
		}
	}
	comp := policy.NewCompiler()
	applyState := func(rs *policy.Ruleset) {
		t.Helper()
		if len(rs.Warnings) > 0 {
			t.Fatalf("warnings: %q", rs.Warnings)
		}
		if _, err := f.Apply(ctx, *rs); err != nil {
			t.Fatal(err)
		}
		if d, err := diff(rs); err != nil || len(d) > 0 {
			t.Fatalf("kernel differs from the state applied: %v %v", d, err)
		}
	}
	apply := func() {
		t.Helper()
		applyState(comp.Compile(in))
		if d, err := diff(policy.Compile(in)); err != nil || len(d) > 0 {
			t.Fatalf("kernel differs from a fresh compile: %v %v", d, err)
		}
	}
	sendUDP := func(from string, to string) {
		t.Helper()
		if err := ns.WithNetNSPath(client.Path, func(ns.NetNS) error {
			c, err := net.DialUDP("udp6", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(from), 0)),
				net.UDPAddrFromAddrPort(netip.MustParseAddrPort(to)))
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte(from))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	// spoofArrives sends a datagram from the spoofed address, then one from
	// the pod's own, waits for the own one and reports whether the spoofed
	// one came first (same path, so it would have).
	spoofArrives := func() bool {
		t.Helper()
		srvUDP.reset()
		sendUDP("fd00:10:244:17::99", "[fd00:10:244:17::2]:9000")
		sendUDP("fd00:10:244:17::1", "[fd00:10:244:17::2]:9000")
		if !srvUDP.waitFor("fd00:10:244:17::1", 5*time.Second) {
			t.Fatal("datagram from the pod's own IPv6 address did not arrive")
		}
		return srvUDP.got("fd00:10:244:17::99")
	}

	// Without a firewall, the spoofed source gets through (IPv6 has no
	// rp_filter): the check below can fail.
	if !spoofArrives() {
		t.Fatal("no firewall: the spoofed datagram did not arrive")
	}
	apply()
	if l := listing(); l != "" { // the backend's tools read the rules back as meant
		for _, w := range want {
			if !strings.Contains(l, w) {
				t.Errorf("listing lacks %q:\n%s", w, l)
			}
		}
	}
	if !connects("[fd00:10:244:17::2]:8080", true) || !connects("10.244.17.2:8080", true) {
		t.Fatal("no policy: a connection failed")
	}
	if spoofArrives() {
		t.Error("firewall: a datagram from a spoofed IPv6 source arrived")
	}
	for i, step := range []struct {
		app  string
		port api.IntOrString
		want bool
	}{
		{"client", api.FromInt(8080), true}, {"other", api.FromInt(8080), false}, {"client", api.FromInt(8080), true},
		// Named ports: address . protocol . port sets of both families.
		{"client", api.FromString("http"), true}, {"client", api.FromString("nope"), false},
	} {
		in.NetworkPolicies = []*api.NetworkPolicy{allowFrom(step.app, step.port)}
		apply()
		if l := listing(); i == 3 && backend == "nftables" && l != "" && (!strings.Contains(l, "ip6 saddr @tabby-s6-") ||
			!strings.Contains(l, "type ipv6_addr . inet_proto . inet_service") || !strings.Contains(l, "fd00:10:244:17::2 . tcp . 8080")) {
			t.Errorf("nft list lacks the IPv6 selector and named-port sets:\n%s", l)
		}
		if l := listing(); i == 3 && backend != "nftables" && !strings.Contains(l, "fd00:10:244:17::2,tcp:8080") {
			t.Errorf("ipset save lacks the IPv6 named-port member:\n%s", l)
		}
		for _, addr := range []string{"[fd00:10:244:17::2]:8080", "10.244.17.2:8080"} {
			if got := connects(addr, step.want); got != step.want {
				t.Errorf("step %d, policy admits app=%s port %v: %s connected %v, want %v", i, step.app, step.port, addr, got, step.want)
			}
		}
	}

	// Neighbour discovery with the action Drop (and the server isolated):
	// both caches flushed, the connection needs the client to resolve its
	// gateway and the node to resolve the server.
	in.NetworkPolicies = []*api.NetworkPolicy{allowFrom("client", api.FromInt(8080))}
	apply()
	flushNeigh := func() {
		t.Helper()
		run(t, "ip", "-n", client.Name, "-6", "neigh", "flush", "dev", "eth0")
		run(t, "ip", "-n", server.Name, "-6", "neigh", "flush", "dev", "eth0")
		run(t, "ip", "-n", node.Name, "-6", "neigh", "flush", "dev", cspec.HostIfName)
		run(t, "ip", "-n", node.Name, "-6", "neigh", "flush", "dev", sspec.HostIfName)
	}
	flushNeigh()
	if !connects("[fd00:10:244:17::2]:8080", true) {
		t.Error("after flushing the neighbour caches: the IPv6 connection failed")
	}
	if n := run(t, "ip", "-n", client.Name, "-6", "neigh", "show", "dev", "eth0"); !strings.Contains(n, "fe80::ecee:eeff:feee:eeee") || strings.Contains(n, "FAILED") {
		t.Errorf("client's gateway not resolved:\n%s", n)
	}
	if out, err := exec.Command("nsenter", "--net="+client.Path, "ping", "-6", "-c1", "-W1", "fe80::ecee:eeff:feee:eeee%eth0").CombinedOutput(); err == nil {
		t.Errorf("echo request to the gateway passed the action Drop:\n%s", out)
	}
	// The control: the same ruleset without the neighbour discovery rule.
	noND := withoutND(t, comp.Compile(in))
	applyState(noND)
	flushNeigh()
	if connects("[fd00:10:244:17::2]:8080", false) {
		t.Error("without the neighbour discovery rule: the IPv6 connection still worked (the test proves nothing)")
	}
	apply()
	if !connects("[fd00:10:244:17::2]:8080", true) {
		t.Error("neighbour discovery rule back: the IPv6 connection failed")
	}

	// The client's endpoint without its IPv6 address: none of its IPv6
	// passes, its IPv4 does.
	in.Endpoints = slices.Clone(in.Endpoints)
	in.Endpoints[0] = ep("client", "client", cspec, cspec.Addrs[:1])
	apply()
	if connects("[fd00:10:244:17::2]:8080", false) {
		t.Error("endpoint without an IPv6 address: its IPv6 connection passed")
	}
	if !connects("10.244.17.2:8080", true) {
		t.Error("endpoint without an IPv6 address: its IPv4 connection failed")
	}
	in.Endpoints[0] = ep("client", "client", cspec, cspec.Addrs)

	// natOutgoing for the IPv6 pool.
	for _, nat := range []bool{false, true} {
		in.Pools = pools(nat)
		apply()
		want := "fd00:10:244:17::1"
		if nat {
			want = "2001:db8:17::1"
		}
		extUDP.reset()
		sendUDP("fd00:10:244:17::1", "[2001:db8:17::2]:9000")
		if !extUDP.waitFor(want, 5*time.Second) {
			t.Errorf("natOutgoing %v: datagram to the world did not arrive from %s (got %v)", nat, want, extUDP.sources())
		}
	}
	if err := f.Remove(ctx); err != nil {
		t.Fatal(err)
	}
}

// withoutND returns a copy of rs whose input chain lacks the ICMPv6
// neighbour discovery rule.
func withoutND(t *testing.T, rs *policy.Ruleset) *policy.Ruleset {
	t.Helper()
	out := *rs
	out.Chains = slices.Clone(rs.Chains)
	found := false
	for i, c := range out.Chains {
		if c.Name != policy.ChainInput {
			continue
		}
		c.Rules = slices.DeleteFunc(slices.Clone(c.Rules), func(r policy.Rule) bool {
			nd := slices.ContainsFunc(r.Match, func(m policy.Match) bool { return m.Kind == policy.MatchICMPv6Types })
			found = found || nd
			return nd
		})
		out.Chains[i] = c
	}
	if !found {
		t.Fatal("no neighbour discovery rule in the input chain")
	}
	return &out
}

// serveTCP answers "ok" to every connection on addr inside ns until the
// test ends.
func serveTCP(t *testing.T, n testkit.NetNS, addr string) {
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
			_, _ = c.Write([]byte("ok"))
			_ = c.Close()
		}
	}()
}

// okFrom reports whether a TCP connection from n to addr gets "ok".
func okFrom(t *testing.T, n testkit.NetNS, addr string, timeout time.Duration) bool {
	t.Helper()
	ok := false
	if err := ns.WithNetNSPath(n.Path, func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			return nil
		}
		defer c.Close()
		buf := make([]byte, 2)
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		k, _ := c.Read(buf)
		ok = string(buf[:k]) == "ok"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return ok
}

// udpSink records the source addresses of the datagrams it receives.
type udpSink struct {
	mu   sync.Mutex
	srcs map[string]bool
	cond chan struct{}
}

func listenUDP(t *testing.T, n testkit.NetNS, addr string) *udpSink {
	t.Helper()
	var c net.PacketConn
	if err := ns.WithNetNSPath(n.Path, func(ns.NetNS) error {
		var err error
		c, err = net.ListenPacket("udp6", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := &udpSink{srcs: map[string]bool{}, cond: make(chan struct{}, 1)}
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.srcs[from.(*net.UDPAddr).AddrPort().Addr().Unmap().String()] = true
			s.mu.Unlock()
			select {
			case s.cond <- struct{}{}:
			default:
			}
		}
	}()
	return s
}

func (s *udpSink) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.srcs = map[string]bool{}
}

func (s *udpSink) got(src string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srcs[src]
}

func (s *udpSink) sources() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.srcs {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// waitFor waits until a datagram from src arrived, at most d.
func (s *udpSink) waitFor(src string, d time.Duration) bool {
	deadline := time.After(d)
	for !s.got(src) {
		select {
		case <-s.cond:
		case <-deadline:
			return s.got(src)
		}
	}
	return true
}
