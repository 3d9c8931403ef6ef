package policy

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
)

// A dual-stack test cluster: most pods have an address of each family, one
// is IPv4 only, one IPv6 only, one has two IPv6 addresses.
var pods6 = []testPod{
	{name: "a", ns: "prod", node: "n1", ips: []string{"10.244.1.1", "fd00:10:244:1::1"}, labels: map[string]string{"app": "web"},
		ports: []api.EndpointPort{{Name: "http", Protocol: "TCP", Port: 8080}}},
	{name: "b", ns: "prod", node: "n2", ips: []string{"10.244.2.1", "fd00:10:244:2::1"}, labels: map[string]string{"app": "client"}},
	{name: "c", ns: "dev", node: "n2", ips: []string{"10.244.2.2", "fd00:10:244:2::2"}, labels: map[string]string{"app": "client"}},
	{name: "v4", ns: "prod", node: "n1", ips: []string{"10.244.1.2"}, labels: map[string]string{"app": "client"}},
	{name: "v6", ns: "dev", node: "n1", ips: []string{"fd00:10:244:1::3"}, labels: map[string]string{"app": "web"},
		ports: []api.EndpointPort{{Name: "http", Protocol: "TCP", Port: 9090}}},
	{name: "m", ns: "prod", node: "n2", ips: []string{"10.244.2.5", "fd00:10:244:2::5", "fd00:10:244:2::6"}, labels: map[string]string{"app": "multi"}},
}

var pools6 = []*api.IPPool{
	{Metadata: api.ObjectMeta{Name: "v4"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", NATOutgoing: true}},
	{Metadata: api.ObjectMeta{Name: "v6"}, Spec: api.IPPoolSpec{CIDR: "fd00:10:244::/48", NATOutgoing: true}},
	{Metadata: api.ObjectMeta{Name: "v6-routed"}, Spec: api.IPPoolSpec{CIDR: "fd00:20::/48"}},
}

func findPod6(name string) (testPod, bool) {
	i := slices.IndexFunc(pods6, func(p testPod) bool { return p.name == name })
	if i < 0 {
		return testPod{}, false
	}
	return pods6[i], true
}

// addrOf is a pod's first address of family f.
func (p testPod) addrOf(t *testing.T, f Family) netip.Addr {
	t.Helper()
	for _, s := range p.ips {
		if a := netip.MustParseAddr(s); FamilyOf(a) == f {
			return a
		}
	}
	t.Fatalf("pod %s has no %v address", p.name, f)
	return netip.Addr{}
}

func (c cluster) input6(node string) Input {
	in := Input{Node: node, NetworkPolicies: c.nps, GlobalPolicies: c.gnps, Pools: pools6}
	for _, p := range pods6 {
		w := p.endpoint()
		for i, ip := range p.ips {
			w.Spec.IPNetworks[i] = netip.PrefixFrom(netip.MustParseAddr(ip), netip.MustParseAddr(ip).BitLen()).String()
		}
		in.Endpoints = append(in.Endpoints, w)
	}
	return in
}

// reach6 is reach over pods6, for family f: a new connection from src to
// dst (pod names, or addresses outside the cluster) passes both nodes.
func (c cluster) reach6(t *testing.T, f Family, src, dst, proto string, port int) bool {
	t.Helper()
	sp, srcIsPod := findPod6(src)
	dp, dstIsPod := findPod6(dst)
	pkt := packet{proto: proto, sport: 40000, dport: port, in: "eth0", out: "eth0"}
	if srcIsPod {
		pkt.src, pkt.in = sp.addrOf(t, f), sp.iface()
	} else {
		pkt.src = netip.MustParseAddr(src)
	}
	if dstIsPod {
		pkt.dst = dp.addrOf(t, f)
	} else {
		pkt.dst = netip.MustParseAddr(dst)
	}
	if srcIsPod {
		p := pkt
		if dstIsPod && dp.node == sp.node {
			p.out = dp.iface()
		}
		rs := Compile(c.input6(sp.node))
		if len(rs.Warnings) > 0 {
			t.Errorf("warnings: %q", rs.Warnings)
		}
		if forward(t, rs, p) != vAccept {
			return false
		}
		if dstIsPod && dp.node == sp.node {
			return true
		}
	}
	if dstIsPod {
		p := pkt
		p.in, p.out = "eth0", dp.iface()
		return forward(t, Compile(c.input6(dp.node)), p) == vAccept
	}
	return true
}

// TestIPv6Semantics walks dual-stack policies through the interpreter:
// selectors match a pod's addresses of both families, ipBlocks (with
// except) and nets match their own family only, notNets of one family do
// not exclude the other, named ports resolve per family.
func TestIPv6Semantics(t *testing.T) {
	type rc struct {
		f               Family
		src, dst, proto string
		port            int
		want            bool
	}
	const (
		v4 = IPv4
		v6 = IPv6
	)
	tests := []struct {
		name  string
		c     cluster
		cases []rc
	}{
		{"no policy", cluster{}, []rc{
			{v6, "b", "a", "tcp", 8080, true}, {v4, "b", "a", "tcp", 8080, true},
			{v6, "v6", "a", "tcp", 8080, true}, {v6, "a", "2001:db8::1", "tcp", 443, true},
		}},
		{"deny all ingress", cluster{nps: []*api.NetworkPolicy{denyAllIngress("prod")}}, []rc{
			{v6, "b", "a", "tcp", 8080, false}, {v4, "b", "a", "tcp", 8080, false},
			{v6, "v6", "a", "tcp", 8080, false}, // same node
			{v6, "2001:db8::1", "a", "tcp", 8080, false},
			{v6, "a", "v6", "tcp", 9090, true}, // dev is not isolated
		}},
		{"podSelector peer, both families", cluster{nps: []*api.NetworkPolicy{
			ingressFrom("prod", "web", sel("app", "web"), []api.NetworkPolicyPeer{{PodSelector: sel("app", "client")}}, tcpPort(8080)),
		}}, []rc{
			{v6, "b", "a", "tcp", 8080, true}, {v4, "b", "a", "tcp", 8080, true},
			{v6, "b", "a", "tcp", 9090, false},
			{v6, "c", "a", "tcp", 8080, false}, // client of another namespace
			{v4, "v4", "a", "tcp", 8080, true},
			{v6, "m", "a", "tcp", 8080, false},
		}},
		{"namespaceSelector peer", cluster{nps: []*api.NetworkPolicy{
			ingressFrom("prod", "web", sel("app", "web"), []api.NetworkPolicyPeer{{NamespaceSelector: sel("team", "b")}}),
		}}, []rc{
			{v6, "c", "a", "tcp", 8080, true}, {v4, "c", "a", "tcp", 8080, true},
			{v6, "v6", "a", "udp", 53, true},
			{v6, "b", "a", "tcp", 8080, false},
		}},
		{"IPv6 ipBlock with except", cluster{nps: []*api.NetworkPolicy{
			ingressFrom("prod", "web", sel("app", "web"), []api.NetworkPolicyPeer{{IPBlock: &api.IPBlock{
				CIDR: "fd00:10:244:2::/64", Except: []string{"fd00:10:244:2::2/128", "fd00:10:244:2::4/126"}}}}),
		}}, []rc{
			{v6, "b", "a", "tcp", 8080, true},
			{v6, "c", "a", "tcp", 8080, false}, // excepted
			{v6, "m", "a", "tcp", 8080, false}, // fd00:10:244:2::5 in the excepted /126
			{v4, "b", "a", "tcp", 8080, false}, // an IPv6 block admits no IPv4
			{v6, "v6", "a", "tcp", 8080, false},
		}},
		{"IPv4 ipBlock admits no IPv6", cluster{nps: []*api.NetworkPolicy{
			ingressFrom("prod", "web", sel("app", "web"), []api.NetworkPolicyPeer{{IPBlock: &api.IPBlock{CIDR: "10.244.0.0/16"}}}),
		}}, []rc{
			{v4, "b", "a", "tcp", 8080, true}, {v6, "b", "a", "tcp", 8080, false},
		}},
		{"egress to an IPv6 block only", cluster{nps: []*api.NetworkPolicy{
			np("prod", "egress", api.NetworkPolicySpec{PolicyTypes: []api.PolicyType{api.PolicyTypeEgress},
				Egress: []api.NetworkPolicyEgressRule{{To: []api.NetworkPolicyPeer{{IPBlock: &api.IPBlock{CIDR: "2001:db8::/32", Except: []string{"2001:db8:bad::/48"}}}}}}}),
		}}, []rc{
			{v6, "a", "2001:db8::1", "tcp", 443, true},
			{v6, "a", "2001:db8:bad::1", "tcp", 443, false},
			{v4, "a", "198.18.0.1", "tcp", 443, false},
			{v6, "a", "c", "tcp", 80, false},
			{v6, "v6", "2001:db8:bad::1", "tcp", 443, true}, // dev: not selected
		}},
		{"named port per family", cluster{nps: []*api.NetworkPolicy{
			ingressFrom("prod", "web", sel("app", "web"), nil, api.NetworkPolicyPort{Protocol: ptr("TCP"), Port: ptr(api.FromString("http"))}),
			ingressFrom("dev", "web", sel("app", "web"), nil, api.NetworkPolicyPort{Protocol: ptr("TCP"), Port: ptr(api.FromString("http"))}),
		}}, []rc{
			{v6, "b", "a", "tcp", 8080, true}, {v4, "b", "a", "tcp", 8080, true},
			{v6, "b", "a", "tcp", 9090, false},
			{v6, "b", "v6", "tcp", 9090, true}, {v6, "b", "v6", "tcp", 8080, false},
		}},
		{"egress named port of selected peers", cluster{nps: []*api.NetworkPolicy{
			np("prod", "egress", api.NetworkPolicySpec{PolicyTypes: []api.PolicyType{api.PolicyTypeEgress},
				Egress: []api.NetworkPolicyEgressRule{{To: []api.NetworkPolicyPeer{{NamespaceSelector: sel(), PodSelector: sel("app", "web")}},
					Ports: []api.NetworkPolicyPort{{Protocol: ptr("TCP"), Port: ptr(api.FromString("http"))}}}}}),
		}}, []rc{
			{v6, "b", "v6", "tcp", 9090, true}, {v6, "b", "v6", "tcp", 8080, false},
			{v6, "b", "a", "tcp", 8080, true}, {v4, "b", "a", "tcp", 8080, true},
			{v6, "b", "2001:db8::1", "tcp", 8080, false},
		}},
		{"global deny of an IPv6 net leaves IPv4 alone", cluster{gnps: []*api.GlobalNetworkPolicy{
			gnp("deny-net", 1, api.GlobalNetworkPolicySpec{Ingress: []api.Rule{
				{Action: api.ActionDeny, Source: api.EntityRule{Nets: []string{"fd00:10:244:2::/64"}}},
				{Action: api.ActionAllow},
			}}),
		}}, []rc{
			{v6, "b", "a", "tcp", 8080, false}, {v4, "b", "a", "tcp", 8080, true},
			{v6, "v6", "a", "tcp", 8080, true},
		}},
		{"global nets of both families", cluster{gnps: []*api.GlobalNetworkPolicy{
			gnp("allow-nets", 1, api.GlobalNetworkPolicySpec{Selector: sel("app", "web"), Ingress: []api.Rule{
				{Action: api.ActionAllow, Source: api.EntityRule{Nets: []string{"10.244.2.0/24", "fd00:10:244:2::/64"}}},
			}}),
		}}, []rc{
			{v6, "b", "a", "tcp", 8080, true}, {v4, "b", "a", "tcp", 8080, true},
			{v4, "v4", "a", "tcp", 8080, false},
			{v6, "a", "v6", "tcp", 9090, false},
		}},
		{"IPv4 notNets do not exclude IPv6", cluster{gnps: []*api.GlobalNetworkPolicy{
			gnp("allow-not", 1, api.GlobalNetworkPolicySpec{Selector: sel("app", "web"), Ingress: []api.Rule{
				{Action: api.ActionAllow, Protocol: ptr("TCP"), Source: api.EntityRule{NotNets: []string{"10.244.2.0/24"}}},
			}}),
		}}, []rc{
			{v4, "b", "a", "tcp", 8080, false}, {v6, "b", "a", "tcp", 8080, true},
			{v4, "v4", "a", "tcp", 8080, true}, {v6, "b", "a", "udp", 53, false},
		}},
		{"ICMPv6 is IPv6's, ICMP IPv4's", cluster{gnps: []*api.GlobalNetworkPolicy{
			gnp("ping", 1, api.GlobalNetworkPolicySpec{Selector: sel("app", "web"), Ingress: []api.Rule{
				{Action: api.ActionAllow, Protocol: ptr(api.ProtocolICMPv6)},
				{Action: api.ActionAllow, Protocol: ptr(api.ProtocolICMP), Source: api.EntityRule{Selector: sel("app", "client")}},
			}}),
		}}, []rc{
			{v6, "b", "a", "icmpv6", 0, true}, {v6, "v6", "a", "icmpv6", 0, true},
			{v4, "b", "a", "icmp", 0, true}, {v4, "b", "a", "icmpv6", 0, false}, // proto 58 in IPv4 is no ICMPv6
			{v6, "b", "a", "icmp", 0, false}, {v6, "b", "a", "tcp", 8080, false},
		}},
		{"global selector source", cluster{gnps: []*api.GlobalNetworkPolicy{
			gnp("deny-clients", 1, api.GlobalNetworkPolicySpec{Ingress: []api.Rule{
				{Action: api.ActionDeny, Source: api.EntityRule{Selector: sel("app", "client"), NamespaceSelector: sel("team", "b")}},
				{Action: api.ActionAllow},
			}}),
		}}, []rc{
			{v6, "c", "a", "tcp", 8080, false}, {v4, "c", "a", "tcp", 8080, false},
			{v6, "b", "a", "tcp", 8080, true}, {v6, "v6", "a", "tcp", 8080, true},
		}},
	}
	total := 0
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, c := range tt.cases {
				total++
				if got := tt.c.reach6(t, c.f, c.src, c.dst, c.proto, c.port); got != c.want {
					t.Errorf("%v %s -> %s %s/%d: reached %v, want %v", c.f, c.src, c.dst, c.proto, c.port, got, c.want)
				}
			}
		})
	}
	t.Logf("%d connection cases", total)
}

// TestIPv6AntiSpoofing: a pod's packet whose source is not one of its
// addresses of the packet's family is dropped, on the forward and on the
// input path, also when the pod has no address of that family; the
// neighbour discovery a pod needs towards its node passes whatever the
// endpoint-to-host action, and only that; ICMPv6 errors of a tracked flow
// (packet too big) pass as related.
func TestIPv6AntiSpoofing(t *testing.T) {
	a := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	isolated := cluster{nps: []*api.NetworkPolicy{denyAllIngress("prod"), denyAllEgress("prod")}}
	open := cluster{}
	gw := a("fe80::ecee:eeff:feee:eeee")
	podLL := a("fe80::1c2d:3eff:fe4f:5a6b")
	nd := func(in string, typ uint8, src, dst netip.Addr) packet {
		return packet{src: src, dst: dst, proto: "icmpv6", icmpType: typ, in: in}
	}
	tests := []struct {
		name   string
		c      cluster
		action string
		input  bool // through INPUT rather than FORWARD
		pkt    packet
		want   verdict
	}{
		{name: "own IPv6 source", c: open,
			pkt: packet{src: a("fd00:10:244:1::1"), dst: a("2001:db8::1"), proto: "tcp", dport: 443, in: "calia", out: "eth0"}, want: vAccept},
		{name: "spoofed IPv6 source", c: open,
			pkt: packet{src: a("fd00:10:244:1::99"), dst: a("2001:db8::1"), proto: "tcp", dport: 443, in: "calia", out: "eth0"}, want: vDrop},
		{name: "another pod's IPv6 source", c: open,
			pkt: packet{src: a("fd00:10:244:1::3"), dst: a("2001:db8::1"), proto: "udp", dport: 53, in: "calia", out: "eth0"}, want: vDrop},
		{name: "spoofed IPv6 in an established flow", c: open,
			pkt: packet{src: a("fd00:10:244:2::1"), dst: a("2001:db8::1"), proto: "tcp", dport: 443, in: "calia", out: "eth0", established: true}, want: vDrop},
		{name: "IPv6 from a pod without an IPv6 address", c: open,
			pkt: packet{src: a("fd00:10:244:1::2"), dst: a("2001:db8::1"), proto: "tcp", dport: 443, in: "caliv4", out: "eth0"}, want: vDrop},
		{name: "link-local IPv6 forwarded from a pod without an IPv6 address", c: open,
			pkt: packet{src: podLL, dst: a("fd00:10:244:1::1"), proto: "icmpv6", icmpType: 135, in: "caliv4", out: "calia"}, want: vDrop},
		{name: "IPv4 from an IPv6-only pod", c: open,
			pkt: packet{src: a("10.244.1.3"), dst: a("198.18.0.1"), proto: "tcp", dport: 443, in: "caliv6", out: "eth0"}, want: vDrop},
		{name: "IPv4 of a dual-stack pod", c: open,
			pkt: packet{src: a("10.244.1.1"), dst: a("198.18.0.1"), proto: "tcp", dport: 443, in: "calia", out: "eth0"}, want: vAccept},
		{name: "second IPv6 address of a multi-address pod", c: open,
			pkt: packet{src: a("fd00:10:244:2::6"), dst: a("2001:db8::1"), proto: "udp", dport: 53, in: "calim", out: "eth0"}, want: vAccept},
		{name: "IPv4 of a pod with two IPv6 addresses", c: open,
			pkt: packet{src: a("10.244.2.5"), dst: a("198.18.0.1"), proto: "udp", dport: 53, in: "calim", out: "eth0"}, want: vAccept},
		{name: "foreign IPv6 from a multi-address pod", c: open,
			pkt: packet{src: a("fd00:10:244:2::7"), dst: a("2001:db8::1"), proto: "udp", dport: 53, in: "calim", out: "eth0"}, want: vDrop},
		{name: "spoofed IPv6 to the node", c: open, input: true, action: EndpointToHostAccept,
			pkt: packet{src: a("fd00:10:244:1::99"), dst: gw, proto: "tcp", dport: 22, in: "calia"}, want: vDrop},
		{name: "own IPv6 to the node, action Accept", c: open, input: true, action: EndpointToHostAccept,
			pkt: packet{src: a("fd00:10:244:1::1"), dst: gw, proto: "tcp", dport: 22, in: "calia"}, want: vAccept},
		{name: "own IPv6 to the node, action Drop", c: open, input: true,
			pkt: packet{src: a("fd00:10:244:1::1"), dst: gw, proto: "icmpv6", icmpType: 128, in: "calia"}, want: vDrop},
		{name: "neighbour solicitation for the gateway, action Drop, isolated pod", c: isolated, input: true,
			pkt: nd("calia", 135, podLL, a("ff02::1:ffee:eeee")), want: vAccept},
		{name: "neighbour solicitation from the pod's global address", c: isolated, input: true,
			pkt: nd("calia", 135, a("fd00:10:244:1::1"), gw), want: vAccept},
		{name: "neighbour advertisement to the node", c: isolated, input: true,
			pkt: nd("calia", 136, a("fd00:10:244:1::1"), gw), want: vAccept},
		{name: "router solicitation", c: isolated, input: true,
			pkt: nd("calia", 133, podLL, a("ff02::2")), want: vAccept},
		{name: "multicast listener report", c: isolated, input: true,
			pkt: nd("calia", 131, podLL, a("ff02::16")), want: vAccept},
		{name: "neighbour solicitation of a pod without an IPv6 address", c: open, input: true,
			pkt: nd("caliv4", 135, podLL, a("ff02::1:ffee:eeee")), want: vAccept},
		{name: "router advertisement from a pod", c: open, input: true, action: EndpointToHostAccept,
			pkt: nd("calia", 134, podLL, a("ff02::1")), want: vDrop},
		{name: "redirect from a pod", c: open, input: true, action: EndpointToHostAccept,
			pkt: nd("calia", 137, podLL, gw), want: vDrop},
		{name: "echo request from the link-local address", c: open, input: true, action: EndpointToHostAccept,
			pkt: nd("calia", 128, podLL, gw), want: vDrop},
		{name: "packet too big into an isolated pod (related)", c: isolated,
			pkt: packet{src: a("2001:db8::1"), dst: a("fd00:10:244:1::1"), proto: "icmpv6", icmpType: 2, in: "eth0", out: "calia", established: true}, want: vAccept},
		{name: "packet too big from an isolated pod (related)", c: isolated,
			pkt: packet{src: a("fd00:10:244:1::1"), dst: a("2001:db8::1"), proto: "icmpv6", icmpType: 2, in: "calia", out: "eth0", established: true}, want: vAccept},
		{name: "new ICMPv6 into an isolated pod", c: isolated,
			pkt: packet{src: a("2001:db8::1"), dst: a("fd00:10:244:1::1"), proto: "icmpv6", icmpType: 128, in: "eth0", out: "calia"}, want: vDrop},
		{name: "IPv6 to a workload interface without endpoint", c: open,
			pkt: packet{src: a("2001:db8::1"), dst: a("fd00:10:244:1::99"), proto: "tcp", dport: 80, in: "eth0", out: "cali00000000000"}, want: vDrop},
		{name: "IPv6 not from or to workloads is left alone", c: isolated,
			pkt: packet{src: a("2001:db8::1"), dst: a("2001:db8::2"), proto: "tcp", dport: 80, in: "eth0", out: "eth1"}, want: vAccept},
	}
	for _, tt := range tests {
		in := tt.c.input6("n1")
		if tt.pkt.in == "calim" {
			in = tt.c.input6("n2")
		}
		in.EndpointToHostAction = tt.action
		rs := Compile(in)
		hookFn := forward
		if tt.input {
			hookFn = input
		}
		if got := hookFn(t, rs, tt.pkt); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestIPv6NAT: the pool sets and masquerade rules exist per family; IPv6
// pools no longer warn.
func TestIPv6NAT(t *testing.T) {
	rs := Compile(Input{Node: "n1", Pools: pools6})
	if len(rs.Warnings) > 0 {
		t.Errorf("warnings: %q", rs.Warnings)
	}
	members := func(name string) []string {
		s, ok := rs.Set(name)
		if !ok {
			t.Fatalf("no set %s", name)
		}
		return s.Members()
	}
	for _, c := range []struct {
		set  string
		want []string
	}{
		{SetAllPools, []string{"10.244.0.0/16"}},
		{SetMasqPools, []string{"10.244.0.0/16"}},
		{SetAllPools6, []string{"fd00:10:244::/48", "fd00:20::/48"}},
		{SetMasqPools6, []string{"fd00:10:244::/48"}},
	} {
		if diff := cmp.Diff(c.want, members(c.set)); diff != "" {
			t.Errorf("set %s (-want +got):\n%s", c.set, diff)
		}
	}
	nat, _ := rs.Chain(TableNAT, ChainPostrouting)
	var got []string
	for _, r := range nat.Rules {
		got = append(got, r.String())
	}
	want := []string{
		"saddr @tabby-masq-pools daddr != @tabby-all-pools masquerade",
		"ip6 saddr @tabby-masq-pools6 ip6 daddr != @tabby-all-pools6 masquerade",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("postrouting (-want +got):\n%s", diff)
	}
}

// TestIPv6Sets: every set holds one family and names it; selector sets of
// both families exist for each selector; IPv6 names fit the kernel limits.
func TestIPv6Sets(t *testing.T) {
	c := cluster{nps: []*api.NetworkPolicy{
		ingressFrom("prod", "web", sel("app", "web"), []api.NetworkPolicyPeer{{PodSelector: sel("app", "multi")}, {IPBlock: &api.IPBlock{CIDR: "::/0", Except: []string{"fd00::/8"}}}}),
	}}
	rs := Compile(c.input6("n1"))
	var lines []string
	for _, s := range rs.Sets {
		if len(s.Name) > MaxSetName {
			t.Errorf("set name %s too long", s.Name)
		}
		if strings.HasPrefix(s.Name, "tabby-all") || strings.HasPrefix(s.Name, "tabby-masq") {
			continue
		}
		lines = append(lines, s.Family.String()+" "+strings.Join(s.Members(), " "))
	}
	slices.Sort(lines)
	want := []string{
		"ipv4 10.244.2.5/32",
		// ::/0 except fd00::/8: an IPv6 /0 is two /1s (ipset cannot
		// hold /0), the upper one split around fd00::/8.
		"ipv6 ::/1 8000::/2 c000::/3 e000::/4 f000::/5 f800::/6 fc00::/8 fe00::/7",
		"ipv6 fd00:10:244:2::5/128 fd00:10:244:2::6/128",
	}
	if diff := cmp.Diff(want, lines); diff != "" {
		t.Errorf("sets (-want +got):\n%s", diff)
	}
}
