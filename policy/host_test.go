package policy

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/api"
)

func hep(name, node, iface string, labels map[string]string, profiles ...string) *api.HostEndpoint {
	return &api.HostEndpoint{Metadata: api.ObjectMeta{Name: name, Labels: labels},
		Spec: api.HostEndpointSpec{Node: node, InterfaceName: iface, Profiles: profiles}}
}

var (
	nodeAddr   = netip.MustParseAddr("198.18.0.11")
	torAddr    = netip.MustParseAddr("198.18.0.1")
	defaultFSI = FailsafesFrom(api.DefaultFailsafeInbound)
	defaultFSO = FailsafesFrom(api.DefaultFailsafeOutbound)
)

func hostInput(heps []*api.HostEndpoint, gnps ...*api.GlobalNetworkPolicy) Input {
	return Input{Node: "n1", HostEndpoints: heps, GlobalPolicies: gnps, Pools: pools[:1],
		EndpointToHostAction: EndpointToHostAccept, FailsafeInbound: defaultFSI, FailsafeOutbound: defaultFSO}
}

// to is a packet from the ToR to the node's port on eth0; from one from
// the node to the ToR's port.
func to(dport int) packet {
	return packet{src: torAddr, dst: nodeAddr, proto: "tcp", sport: 40000, dport: dport, in: "eth0"}
}

func from(dport int) packet {
	return packet{src: nodeAddr, dst: torAddr, proto: "tcp", sport: 40000, dport: dport, out: "eth0"}
}

func output(t testing.TB, rs *Ruleset, pkt packet) verdict {
	t.Helper()
	return tableHook(t, rs, TableFilter, "OUTPUT", pkt)
}

func preDNAT(t testing.TB, rs *Ruleset, pkt packet) verdict {
	t.Helper()
	return tableHook(t, rs, TableMangle, "PREROUTING", pkt)
}

// Without a host endpoint of this node, nothing of the host path is
// emitted: the ruleset is the one of a cluster without host endpoints.
func TestNoHostEndpointNothingPoliced(t *testing.T) {
	base := Compile(hostInput(nil))
	other := Compile(hostInput([]*api.HostEndpoint{hep("n2-eth0", "n2", "eth0", nil)}))
	if !base.Equal(other) {
		t.Errorf("another node's host endpoint changed this node's ruleset:\n%s", strings.Join(other.Lines(), "\n"))
	}
	for _, c := range base.Chains {
		if strings.HasPrefix(c.Name, "tabby-HOST") || c.Table == TableMangle {
			t.Errorf("chain %s/%s without a host endpoint", c.Table, c.Name)
		}
	}
	if len(base.Jumps) != 3 {
		t.Errorf("jumps %v", base.Jumps)
	}
	for _, p := range []packet{to(8080), to(22)} {
		if got := input(t, base, p); got != vAccept {
			t.Errorf("%v: %v without host endpoints", p, got)
		}
	}
}

func TestHostEndpointDefaultDenyAndFailsafes(t *testing.T) {
	nodeLabels := map[string]string{"role": "node"}
	denyAll := gnp("deny-hosts", 10, api.GlobalNetworkPolicySpec{Selector: sel("role", "node"),
		Types: []api.PolicyType{api.PolicyTypeIngress, api.PolicyTypeEgress}})
	allow8080 := gnp("allow-8080", 5, api.GlobalNetworkPolicySpec{Selector: sel("role", "node"),
		Ingress: []api.Rule{{Action: api.ActionAllow, Protocol: ptr("TCP"), Destination: api.EntityRule{Ports: []api.IntOrString{api.FromInt(8080)}}}}})
	deny22 := gnp("deny-ssh", 1, api.GlobalNetworkPolicySpec{Selector: sel("role", "node"),
		Ingress: []api.Rule{{Action: api.ActionDeny, Protocol: ptr("TCP"), Destination: api.EntityRule{Ports: []api.IntOrString{api.FromInt(22)}}}}})
	egress443 := gnp("egress-443", 5, api.GlobalNetworkPolicySpec{Selector: sel("role", "node"),
		Egress: []api.Rule{{Action: api.ActionAllow, Protocol: ptr("TCP"), Destination: api.EntityRule{Ports: []api.IntOrString{api.FromInt(443)}}}}})
	star := hep("n1-star", "n1", "*", nodeLabels)
	auto := hep("n1-auto-hep", "n1", "*", nodeLabels, api.DefaultAllowProfile)
	established := to(8080)
	established.established = true
	lo := packet{src: nodeAddr, dst: nodeAddr, proto: "tcp", sport: 1, dport: 8080, in: "lo"}

	type c struct {
		name string
		pkt  packet
		out  bool
		want verdict
	}
	tests := []struct {
		name  string
		heps  []*api.HostEndpoint
		gnps  []*api.GlobalNetworkPolicy
		cases []c
	}{
		{"no policy: default deny but failsafes", []*api.HostEndpoint{star}, nil, []c{
			{"8080", to(8080), false, vDrop}, {"ssh", to(22), false, vAccept}, {"kubelet", to(10250), false, vAccept},
			{"bgp", to(179), false, vAccept}, {"etcd", to(2379), false, vAccept}, {"established", established, false, vAccept},
			{"lo", lo, false, vAccept}, {"out 8080", from(8080), true, vDrop}, {"out bgp", from(179), true, vAccept},
			{"out etcd", from(2379), true, vAccept}, {"out ssh", from(22), true, vDrop},
		}},
		{"default-allow profile", []*api.HostEndpoint{auto}, nil, []c{
			{"8080", to(8080), false, vAccept}, {"out 8080", from(8080), true, vAccept},
		}},
		{"default-allow profile, a policy selects it", []*api.HostEndpoint{auto}, []*api.GlobalNetworkPolicy{denyAll}, []c{
			{"8080", to(8080), false, vDrop}, {"ssh", to(22), false, vAccept}, {"out 8080", from(8080), true, vDrop},
		}},
		{"default deny policy", []*api.HostEndpoint{star}, []*api.GlobalNetworkPolicy{denyAll}, []c{
			{"8080", to(8080), false, vDrop}, {"ssh", to(22), false, vAccept}, {"out bgp", from(179), true, vAccept},
		}},
		{"allow rule opens it", []*api.HostEndpoint{star}, []*api.GlobalNetworkPolicy{denyAll, allow8080}, []c{
			{"8080", to(8080), false, vAccept}, {"8081", to(8081), false, vDrop},
		}},
		{"a deny of a failsafe port: failsafes win", []*api.HostEndpoint{star}, []*api.GlobalNetworkPolicy{deny22, denyAll}, []c{
			{"ssh", to(22), false, vAccept},
		}},
		{"egress policy", []*api.HostEndpoint{star}, []*api.GlobalNetworkPolicy{denyAll, egress443}, []c{
			{"out 443", from(443), true, vAccept}, {"out 8443", from(8443), true, vDrop},
		}},
		{"a named endpoint wins over *", []*api.HostEndpoint{star, hep("n1-eth0", "n1", "eth0", map[string]string{"role": "uplink"})},
			[]*api.GlobalNetworkPolicy{allow8080}, []c{
				{"eth0 8080 (named, no policy)", to(8080), false, vDrop},
				{"eth1 8080 (*)", packet{src: torAddr, dst: nodeAddr, proto: "tcp", sport: 1, dport: 8080, in: "eth1"}, false, vAccept},
			}},
		{"named endpoint only polices its interface", []*api.HostEndpoint{hep("n1-eth0", "n1", "eth0", nil)}, nil, []c{
			{"eth0", to(8080), false, vDrop},
			{"eth1", packet{src: torAddr, dst: nodeAddr, proto: "tcp", sport: 1, dport: 8080, in: "eth1"}, false, vAccept},
		}},
	}
	for _, tt := range tests {
		rs := Compile(hostInput(tt.heps, tt.gnps...))
		for _, c := range tt.cases {
			got := vAccept
			if c.out {
				got = output(t, rs, c.pkt)
			} else {
				got = input(t, rs, c.pkt)
			}
			if got != c.want {
				t.Errorf("%s: %s: %v, want %v", tt.name, c.name, got, c.want)
			}
		}
	}
}

// Failsafes are configurable, a net limits them, and an empty list leaves
// none.
func TestFailsafeConfig(t *testing.T) {
	in := hostInput([]*api.HostEndpoint{hep("n1-star", "n1", "*", nil)})
	in.FailsafeInbound = FailsafesFrom([]api.ProtoPort{{Protocol: "TCP", Port: 2222, Net: "198.18.0.0/30"}})
	in.FailsafeOutbound = nil
	rs := Compile(in)
	if got := input(t, rs, to(2222)); got != vAccept {
		t.Errorf("2222 from the failsafe net: %v", got)
	}
	far := to(2222)
	far.src = netip.MustParseAddr("198.18.0.9")
	if got := input(t, rs, far); got != vDrop {
		t.Errorf("2222 from outside the failsafe net: %v", got)
	}
	if got := input(t, rs, to(22)); got != vDrop {
		t.Errorf("22, not a failsafe any more: %v", got)
	}
	if got := output(t, rs, from(179)); got != vDrop {
		t.Errorf("out 179 without outbound failsafes: %v", got)
	}
}

func TestHostEndpointForward(t *testing.T) {
	star := hep("n1-star", "n1", "*", map[string]string{"role": "node"})
	pod := testPod{name: "a", ns: "prod", node: "n1", ips: []string{"10.244.1.1"}}
	through := packet{src: torAddr, dst: netip.MustParseAddr("198.19.0.5"), proto: "tcp", sport: 1, dport: 80, in: "eth0", out: "eth1"}
	toPod := packet{src: torAddr, dst: netip.MustParseAddr("10.244.1.1"), proto: "tcp", sport: 1, dport: 80, in: "eth0", out: pod.iface()}
	fromPod := packet{src: netip.MustParseAddr("10.244.1.1"), dst: torAddr, proto: "tcp", sport: 1, dport: 80, in: pod.iface(), out: "eth0"}
	normalDeny := gnp("deny", 10, api.GlobalNetworkPolicySpec{Selector: sel("role", "node"), Types: []api.PolicyType{api.PolicyTypeIngress, api.PolicyTypeEgress}})
	fwdDeny := gnp("fwd-deny", 10, api.GlobalNetworkPolicySpec{Selector: sel("role", "node"), ApplyOnForward: true,
		Ingress: []api.Rule{{Action: api.ActionDeny, Protocol: ptr("TCP"), Destination: api.EntityRule{Ports: []api.IntOrString{api.FromInt(80)}}}}})
	fwdEgressDeny := gnp("fwd-egress-deny", 10, api.GlobalNetworkPolicySpec{Selector: sel("role", "node"), ApplyOnForward: true,
		Types: []api.PolicyType{api.PolicyTypeEgress}})
	for _, tt := range []struct {
		name                   string
		gnps                   []*api.GlobalNetworkPolicy
		through, toPod, fromPd verdict
	}{
		{"no applyOnForward policy: forwarded traffic allowed", []*api.GlobalNetworkPolicy{normalDeny}, vAccept, vAccept, vAccept},
		{"applyOnForward ingress deny", []*api.GlobalNetworkPolicy{fwdDeny}, vDrop, vDrop, vAccept},
		{"applyOnForward egress, nothing allowed", []*api.GlobalNetworkPolicy{fwdEgressDeny}, vDrop, vAccept, vDrop},
	} {
		in := hostInput([]*api.HostEndpoint{star}, tt.gnps...)
		in.Endpoints = []*api.WorkloadEndpoint{pod.endpoint()}
		rs := Compile(in)
		for _, c := range []struct {
			name string
			pkt  packet
			want verdict
		}{{"through", through, tt.through}, {"to a pod", toPod, tt.toPod}, {"from a pod", fromPod, tt.fromPd}} {
			if got := forward(t, rs, c.pkt); got != c.want {
				t.Errorf("%s: %s: %v, want %v", tt.name, c.name, got, c.want)
			}
		}
	}
}

func TestPreDNAT(t *testing.T) {
	star := hep("n1-star", "n1", "*", map[string]string{"role": "node"})
	nodePort := gnp("block-nodeport", 10, api.GlobalNetworkPolicySpec{Selector: sel("role", "node"), PreDNAT: true, ApplyOnForward: true,
		Ingress: []api.Rule{{Action: api.ActionDeny, Protocol: ptr("TCP"), Destination: api.EntityRule{Ports: []api.IntOrString{api.FromInt(30080)}}}}})
	denyAll := gnp("predenat-deny-all", 20, api.GlobalNetworkPolicySpec{Selector: sel("role", "node"), PreDNAT: true, ApplyOnForward: true,
		Ingress: []api.Rule{{Action: api.ActionDeny}}})
	rs := Compile(hostInput([]*api.HostEndpoint{star}, nodePort))
	if got := preDNAT(t, rs, to(30080)); got != vDrop {
		t.Errorf("NodePort with a preDNAT deny: %v", got)
	}
	if got := preDNAT(t, rs, to(30081)); got != vAccept {
		t.Errorf("another port: %v", got)
	}
	// preDNAT policy is not normal policy: INPUT does not see it (the
	// endpoint has no normal policy: default deny, failsafes).
	if got := input(t, rs, to(30081)); got != vDrop {
		t.Errorf("INPUT after preDNAT: %v", got)
	}
	rs = Compile(hostInput([]*api.HostEndpoint{star}, denyAll))
	if got := preDNAT(t, rs, to(22)); got != vAccept {
		t.Errorf("failsafe under a preDNAT deny-all: %v", got)
	}
	est := to(30080)
	est.established = true
	if got := preDNAT(t, rs, est); got != vAccept {
		t.Errorf("established under a preDNAT deny-all: %v", got)
	}
	pod := packet{src: netip.MustParseAddr("10.244.1.1"), dst: nodeAddr, proto: "tcp", sport: 1, dport: 30080, in: "caliA"}
	if got := preDNAT(t, rs, pod); got != vAccept {
		t.Errorf("from a pod: %v (preDNAT polices host endpoints only)", got)
	}
}

// Once the node has a host endpoint, the node's traffic to a local pod
// meets the pod's ingress policy; a pod's traffic to its node meets the
// "*" endpoint's ingress policy.
func TestNodeAndPods(t *testing.T) {
	pod := testPod{name: "a", ns: "prod", node: "n1", ips: []string{"10.244.1.1"}, labels: map[string]string{"app": "web"}}
	denyIngress := np("prod", "deny", api.NetworkPolicySpec{PodSelector: api.LabelSelector{}, PolicyTypes: []api.PolicyType{api.PolicyTypeIngress}})
	allowNode := np("prod", "allow-node", api.NetworkPolicySpec{PodSelector: api.LabelSelector{},
		Ingress: []api.NetworkPolicyIngressRule{{From: []api.NetworkPolicyPeer{{IPBlock: &api.IPBlock{CIDR: "198.18.0.11/32"}}}}}})
	nodeToPod := packet{src: nodeAddr, dst: netip.MustParseAddr("10.244.1.1"), proto: "tcp", sport: 1, dport: 80, out: pod.iface()}
	podToNode := packet{src: netip.MustParseAddr("10.244.1.1"), dst: nodeAddr, proto: "tcp", sport: 1, dport: 8080, in: pod.iface()}
	star := hep("n1-star", "n1", "*", map[string]string{"role": "node"})
	deny8080 := gnp("deny-8080", 10, api.GlobalNetworkPolicySpec{Selector: sel("role", "node"),
		Ingress: []api.Rule{{Action: api.ActionDeny, Protocol: ptr("TCP"), Destination: api.EntityRule{Ports: []api.IntOrString{api.FromInt(8080)}}}, {Action: api.ActionAllow}}})
	for _, tt := range []struct {
		name       string
		heps       []*api.HostEndpoint
		nps        []*api.NetworkPolicy
		gnps       []*api.GlobalNetworkPolicy
		toPod, toN verdict
	}{
		{"no host endpoint: node to pod unpoliced", nil, []*api.NetworkPolicy{denyIngress}, nil, vAccept, vAccept},
		{"host endpoint: the pod's ingress policy decides", []*api.HostEndpoint{star}, []*api.NetworkPolicy{denyIngress}, nil, vDrop, vAccept},
		{"host endpoint: allowed from the node's address", []*api.HostEndpoint{star}, []*api.NetworkPolicy{denyIngress, allowNode}, nil, vAccept, vAccept},
		{"host endpoint, no pod policy", []*api.HostEndpoint{star}, nil, nil, vAccept, vAccept},
		{"* ingress policy polices pods to the node", []*api.HostEndpoint{star}, nil, []*api.GlobalNetworkPolicy{deny8080}, vAccept, vDrop},
		{"a named endpoint does not", []*api.HostEndpoint{hep("n1-eth0", "n1", "eth0", map[string]string{"role": "node"})}, nil, []*api.GlobalNetworkPolicy{deny8080}, vAccept, vAccept},
	} {
		in := hostInput(tt.heps, tt.gnps...)
		in.Endpoints, in.NetworkPolicies = []*api.WorkloadEndpoint{pod.endpoint()}, tt.nps
		rs := Compile(in)
		if got := output(t, rs, nodeToPod); got != tt.toPod {
			t.Errorf("%s: node to pod: %v, want %v", tt.name, got, tt.toPod)
		}
		if got := input(t, rs, podToNode); got != tt.toN {
			t.Errorf("%s: pod to node: %v, want %v", tt.name, got, tt.toN)
		}
		// The node's neighbour solicitations reach an isolated IPv6 pod.
		ns := packet{src: netip.MustParseAddr("fe80::1"), dst: netip.MustParseAddr("fd00::5"), proto: "icmpv6", icmpType: 135, out: pod.iface()}
		if got := output(t, rs, ns); got != vAccept {
			t.Errorf("%s: node's neighbour solicitation to the pod: %v", tt.name, got)
		}
	}
}

func TestHostEndpointWarningsAndNames(t *testing.T) {
	rs := Compile(hostInput([]*api.HostEndpoint{
		hep("a", "n1", "eth0", nil), hep("b", "n1", "eth0", nil), hep("c", "n1", "*", nil), hep("d", "n1", "*", nil),
	}))
	want := []string{"host endpoints a and b share interface eth0: b not policed", "host endpoints c and d share interface *: d not policed"}
	for _, w := range want {
		if !slices.Contains(rs.Warnings, w) {
			t.Errorf("warnings %q lack %q", rs.Warnings, w)
		}
	}
	for _, c := range rs.Chains {
		if len(c.Name) > MaxChainName {
			t.Errorf("chain name %s is too long", c.Name)
		}
	}
	if !Compile(hostInput([]*api.HostEndpoint{hep("a", "n1", "eth0", nil)})).Equal(Compile(hostInput([]*api.HostEndpoint{hep("a", "n1", "eth0", nil)}))) {
		t.Error("not deterministic")
	}
}

// The caching Compiler compiles host endpoints as Compile does, pass after
// pass, and a preDNAT policy's filter template does not stay behind.
func TestHostEndpointsCached(t *testing.T) {
	star := hep("n1-star", "n1", "*", map[string]string{"role": "node"})
	pre := gnp("pre", 1, api.GlobalNetworkPolicySpec{Selector: sel("role", "node"), PreDNAT: true, ApplyOnForward: true,
		Ingress: []api.Rule{{Action: api.ActionDeny, Protocol: ptr("TCP"), Destination: api.EntityRule{Ports: []api.IntOrString{api.FromInt(30080)}}}}})
	deny := gnp("deny", 2, api.GlobalNetworkPolicySpec{Selector: sel("role", "node")})
	pod := testPod{name: "a", ns: "prod", node: "n1", ips: []string{"10.244.1.1"}, labels: map[string]string{"role": "node"}}
	cc := NewCompiler()
	for i, in := range []Input{hostInput([]*api.HostEndpoint{star}, pre, deny), hostInput([]*api.HostEndpoint{star}, pre), hostInput(nil, pre), hostInput([]*api.HostEndpoint{star}, pre, deny)} {
		in.Endpoints = []*api.WorkloadEndpoint{pod.endpoint()}
		got, want := cc.Compile(in), Compile(in)
		if !got.Equal(want) {
			t.Fatalf("pass %d: cached and fresh differ:\n%s\n---\n%s", i, strings.Join(got.Lines(), "\n"), strings.Join(want.Lines(), "\n"))
		}
		for _, c := range want.Chains {
			if c.Table == TableFilter && c.Name == policyChainName("gnp/pre", ingress) {
				t.Errorf("pass %d: the preDNAT policy has a filter chain", i)
			}
		}
	}
}

func TestFailsafeConflicts(t *testing.T) {
	heps := []*api.HostEndpoint{hep("n1-auto-hep", "n1", "*", map[string]string{"role": "node"}), hep("n2-auto-hep", "n2", "*", map[string]string{"role": "other"})}
	fsIn := FailsafesFrom([]api.ProtoPort{{Protocol: "TCP", Port: 22}, {Protocol: "TCP", Port: 179}})
	fsOut := FailsafesFrom([]api.ProtoPort{{Protocol: "TCP", Port: 179}})
	tcp := func(ports ...int32) api.EntityRule {
		var p []api.IntOrString
		for _, x := range ports {
			p = append(p, api.FromInt(x))
		}
		return api.EntityRule{Ports: p}
	}
	tests := []struct {
		name string
		g    *api.GlobalNetworkPolicy
		want []string // substrings, one per message
	}{
		{"selects no host endpoint", gnp("x", 1, api.GlobalNetworkPolicySpec{Selector: sel("role", "db")}), nil},
		{"default deny", gnp("deny", 1, api.GlobalNetworkPolicySpec{Selector: sel("role", "node"), Types: []api.PolicyType{api.PolicyTypeIngress, api.PolicyTypeEgress}}),
			[]string{"deny does not allow failsafe inbound port tcp/22 on host endpoint(s) n1-auto-hep", "inbound port tcp/179", "outbound port tcp/179"}},
		{"allows them", gnp("ok", 1, api.GlobalNetworkPolicySpec{Selector: sel("role", "node"), Ingress: []api.Rule{{Action: api.ActionAllow, Protocol: ptr("TCP"), Destination: tcp(22, 179)}}}), nil},
		{"denies ssh first", gnp("no-ssh", 1, api.GlobalNetworkPolicySpec{Selector: sel("role", "node"), Ingress: []api.Rule{
			{Action: api.ActionDeny, Protocol: ptr("TCP"), Destination: tcp(22)}, {Action: api.ActionAllow}}}),
			[]string{"no-ssh denies failsafe inbound port tcp/22"}},
		{"allows from one net only", gnp("net", 1, api.GlobalNetworkPolicySpec{Selector: sel("role", "node"), Ingress: []api.Rule{
			{Action: api.ActionAllow, Source: api.EntityRule{Nets: []string{"198.18.0.0/24"}}}, {Action: api.ActionAllow, Protocol: ptr("TCP"), Destination: tcp(179)}}}),
			[]string{"net does not allow failsafe inbound port tcp/22"}},
		{"preDNAT without a deny", gnp("pre", 1, api.GlobalNetworkPolicySpec{Selector: sel("role", "node"), PreDNAT: true, ApplyOnForward: true,
			Ingress: []api.Rule{{Action: api.ActionDeny, Protocol: ptr("TCP"), Destination: tcp(30080)}}}), nil},
		{"preDNAT deny all", gnp("pre-all", 1, api.GlobalNetworkPolicySpec{Selector: sel("role", "node"), PreDNAT: true, ApplyOnForward: true,
			Ingress: []api.Rule{{Action: api.ActionDeny}}}), []string{"tcp/22", "tcp/179"}},
	}
	for _, tt := range tests {
		got := FailsafeConflicts(tt.g, heps, fsIn, fsOut)
		if len(got) != len(tt.want) {
			t.Errorf("%s: %d messages %q, want %d", tt.name, len(got), got, len(tt.want))
			continue
		}
		for i, w := range tt.want {
			if !strings.Contains(got[i], w) || !strings.Contains(got[i], "still let it through") {
				t.Errorf("%s: message %q lacks %q", tt.name, got[i], w)
			}
		}
	}
}

// With a pool encapsulating, VXLAN between cluster nodes passes a
// default-deny host policy in both directions, and VXLAN from anything
// else is still dropped by the tunnel guard.
func TestHostEndpointsKeepTheOverlay(t *testing.T) {
	peer := netip.MustParseAddr("198.18.0.12")
	denyAll := gnp("deny-hosts", 10, api.GlobalNetworkPolicySpec{Selector: sel("role", "node"),
		Types: []api.PolicyType{api.PolicyTypeIngress, api.PolicyTypeEgress}})
	in := hostInput([]*api.HostEndpoint{hep("n1-star", "n1", "*", map[string]string{"role": "node"})}, denyAll)
	in.TunnelGuard = &TunnelGuard{Port: 4789, Nodes: []netip.Addr{nodeAddr, peer}}
	rs := Compile(in)
	vx := func(src, dst netip.Addr, in, out string) packet {
		return packet{src: src, dst: dst, proto: "udp", sport: 50000, dport: 4789, in: in, out: out}
	}
	for _, tc := range []struct {
		name string
		got  verdict
		want verdict
	}{
		{"from a node", input(t, rs, vx(peer, nodeAddr, "eth0", "")), vAccept},
		{"from the ToR", input(t, rs, vx(torAddr, nodeAddr, "eth0", "")), vDrop},
		{"to a node", output(t, rs, vx(nodeAddr, peer, "", "eth0")), vAccept},
		{"to the ToR", output(t, rs, vx(nodeAddr, torAddr, "", "eth0")), vDrop},
		{"other UDP from a node", input(t, rs, packet{src: peer, dst: nodeAddr, proto: "udp", sport: 1, dport: 4790, in: "eth0"}), vDrop},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	// Without host endpoints the overlay rules are not emitted at all.
	in.HostEndpoints = nil
	for _, ch := range Compile(in).Chains {
		if ch.Name == ChainHostOut || ch.Name == ChainHostIn {
			t.Errorf("chain %s without host endpoints", ch.Name)
		}
	}
}
