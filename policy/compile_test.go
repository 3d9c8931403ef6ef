package policy

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
)

// testPod describes a pod of a test cluster.
type testPod struct {
	name, ns, node string
	ips            []string
	labels         map[string]string
	ports          []api.EndpointPort
}

func (p testPod) iface() string { return "cali" + p.name }

// nsLabels are the test namespaces' labels.
var nsLabels = map[string]map[string]string{
	"prod": {"team": "a"},
	"dev":  {"team": "b"},
}

func (p testPod) endpoint() *api.WorkloadEndpoint {
	var nets []string
	for _, ip := range p.ips {
		nets = append(nets, ip+"/32")
	}
	return &api.WorkloadEndpoint{
		Metadata: api.ObjectMeta{Name: p.node + "-k8s-" + p.name + "-eth0", Namespace: p.ns, Labels: p.labels},
		Spec: api.WorkloadEndpointSpec{
			Node: p.node, Pod: p.name, InterfaceName: p.iface(), IPNetworks: nets,
			NamespaceLabels: nsLabels[p.ns], Ports: p.ports,
		},
	}
}

// The test cluster: two namespaces, two nodes. Pod names are short so that
// "cali"+name is a valid interface name.
var pods = []testPod{
	{name: "pweb", ns: "prod", node: "n1", ips: []string{"10.244.1.1"}, labels: map[string]string{"app": "web"},
		ports: []api.EndpointPort{{Name: "http", Protocol: "TCP", Port: 8080}}},
	{name: "pdb", ns: "prod", node: "n2", ips: []string{"10.244.2.1"}, labels: map[string]string{"app": "db"}},
	{name: "pclient", ns: "prod", node: "n1", ips: []string{"10.244.1.2"}, labels: map[string]string{"app": "client"}},
	{name: "dclient", ns: "dev", node: "n2", ips: []string{"10.244.2.2"}, labels: map[string]string{"app": "client"}},
	{name: "dweb", ns: "dev", node: "n1", ips: []string{"10.244.1.3"}, labels: map[string]string{"app": "web"},
		ports: []api.EndpointPort{{Name: "http", Protocol: "TCP", Port: 9090}}},
	{name: "pmulti", ns: "prod", node: "n2", ips: []string{"10.244.2.5", "10.244.2.6"}, labels: map[string]string{"app": "multi"}},
}

var pools = []*api.IPPool{
	{Metadata: api.ObjectMeta{Name: "p1"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", NATOutgoing: true}},
	{Metadata: api.ObjectMeta{Name: "p2"}, Spec: api.IPPoolSpec{CIDR: "10.250.0.0/16"}},
}

func findPod(name string) (testPod, bool) {
	for _, p := range pods {
		if p.name == name {
			return p, true
		}
	}
	return testPod{}, false
}

// cluster is the policy set of one test case.
type cluster struct {
	nps    []*api.NetworkPolicy
	gnps   []*api.GlobalNetworkPolicy
	tiers  []*api.Tier // stored tiers (api.EffectiveTiers adds the built-in ones)
	staged []*api.StagedGlobalNetworkPolicy
}

func (c cluster) input(node string) Input {
	in := Input{Node: node, NetworkPolicies: c.nps, GlobalPolicies: c.gnps, Pools: pools,
		Tiers: api.EffectiveTiers(c.tiers), StagedPolicies: c.staged}
	for _, p := range pods {
		in.Endpoints = append(in.Endpoints, p.endpoint())
	}
	return in
}

// reach reports whether a new connection from src to dst (pod names or
// addresses outside the cluster) passes both nodes it crosses.
func (c cluster) reach(t *testing.T, src, dst, proto string, port int) bool {
	t.Helper()
	sp, srcIsPod := findPod(src)
	dp, dstIsPod := findPod(dst)
	pkt := packet{proto: proto, sport: 40000, dport: port, in: "eth0", out: "eth0"}
	if srcIsPod {
		pkt.src = netip.MustParseAddr(sp.ips[0])
		pkt.in = sp.iface()
	} else {
		pkt.src = netip.MustParseAddr(src)
	}
	if dstIsPod {
		pkt.dst = netip.MustParseAddr(dp.ips[0])
	} else {
		pkt.dst = netip.MustParseAddr(dst)
	}
	if srcIsPod {
		p := pkt
		if dstIsPod && dp.node == sp.node {
			p.out = dp.iface()
		}
		if forward(t, Compile(c.input(sp.node)), p) != vAccept {
			return false
		}
		if dstIsPod && dp.node == sp.node {
			return true
		}
	}
	if dstIsPod {
		p := pkt
		p.in, p.out = "eth0", dp.iface()
		return forward(t, Compile(c.input(dp.node)), p) == vAccept
	}
	return true
}

func ptr[T any](v T) *T { return &v }

func sel(kv ...string) *api.LabelSelector {
	s := &api.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

func np(ns, name string, spec api.NetworkPolicySpec) *api.NetworkPolicy {
	return &api.NetworkPolicy{Metadata: api.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
}

func gnp(name string, order float64, spec api.GlobalNetworkPolicySpec) *api.GlobalNetworkPolicy {
	spec.Order = &order
	return &api.GlobalNetworkPolicy{Metadata: api.ObjectMeta{Name: name}, Spec: spec}
}

func tcpPort(p int32) api.NetworkPolicyPort {
	return api.NetworkPolicyPort{Protocol: ptr("TCP"), Port: ptr(api.FromInt(p))}
}

var (
	denyAllIngress = func(ns string) *api.NetworkPolicy {
		return np(ns, "deny-ingress", api.NetworkPolicySpec{PolicyTypes: []api.PolicyType{api.PolicyTypeIngress}})
	}
	denyAllEgress = func(ns string) *api.NetworkPolicy {
		return np(ns, "deny-egress", api.NetworkPolicySpec{PolicyTypes: []api.PolicyType{api.PolicyTypeEgress}})
	}
	ingressFrom = func(ns, name string, podSel *api.LabelSelector, peers []api.NetworkPolicyPeer, ports ...api.NetworkPolicyPort) *api.NetworkPolicy {
		if podSel == nil {
			podSel = sel()
		}
		return np(ns, name, api.NetworkPolicySpec{PodSelector: *podSel,
			Ingress: []api.NetworkPolicyIngressRule{{From: peers, Ports: ports}}})
	}
)

type reachCase struct {
	src, dst, proto string
	port            int
	want            bool
}

func TestKubernetesSemantics(t *testing.T) {
	tests := []struct {
		name  string
		c     cluster
		cases []reachCase
	}{
		{"no policy: default allow", cluster{}, []reachCase{
			{"dclient", "pweb", "tcp", 80, true},
			{"pweb", "pdb", "udp", 53, true},
			{"pclient", "pweb", "tcp", 8080, true}, // same node
			{"pweb", "198.18.0.1", "tcp", 80, true},
			{"198.18.0.1", "pdb", "tcp", 5432, true},
		}},
		{"default-deny ingress isolates only the ingress of its namespace", cluster{nps: []*api.NetworkPolicy{denyAllIngress("prod")}}, []reachCase{
			{"dclient", "pweb", "tcp", 80, false},
			{"pclient", "pweb", "tcp", 80, false}, // same node, same namespace
			{"198.18.0.1", "pdb", "tcp", 5432, false},
			{"pweb", "dweb", "tcp", 9090, true}, // egress not isolated, dev not selected
			{"pweb", "198.18.0.1", "tcp", 80, true},
		}},
		{"default-deny egress", cluster{nps: []*api.NetworkPolicy{denyAllEgress("prod")}}, []reachCase{
			{"pweb", "dweb", "tcp", 9090, false},
			{"pweb", "198.18.0.1", "tcp", 80, false},
			{"dclient", "pweb", "tcp", 80, true},
		}},
		{"empty podSelector peer: every pod of the policy's namespace", cluster{nps: []*api.NetworkPolicy{
			ingressFrom("prod", "same-ns", nil, []api.NetworkPolicyPeer{{PodSelector: sel()}}),
		}}, []reachCase{
			{"pclient", "pweb", "tcp", 80, true},
			{"pdb", "pweb", "tcp", 80, true},
			{"dclient", "pweb", "tcp", 80, false},
			{"198.18.0.1", "pweb", "tcp", 80, false},
		}},
		{"ingress [{}] allows everything, union with deny-all", cluster{nps: []*api.NetworkPolicy{
			denyAllIngress("prod"),
			np("prod", "allow-all", api.NetworkPolicySpec{PodSelector: *sel(), Ingress: []api.NetworkPolicyIngressRule{{}}}),
		}}, []reachCase{
			{"dclient", "pweb", "tcp", 80, true},
			{"198.18.0.1", "pdb", "udp", 53, true},
		}},
		{"empty ingress list denies (policyTypes Ingress)", cluster{nps: []*api.NetworkPolicy{
			np("prod", "empty", api.NetworkPolicySpec{PodSelector: *sel("app", "web"), Ingress: []api.NetworkPolicyIngressRule{},
				PolicyTypes: []api.PolicyType{api.PolicyTypeIngress}}),
		}}, []reachCase{
			{"pclient", "pweb", "tcp", 80, false},
			{"pclient", "pdb", "tcp", 80, true}, // not selected
		}},
		{"missing ingress with policyTypes [Egress] leaves ingress alone", cluster{nps: []*api.NetworkPolicy{
			np("prod", "egress-only", api.NetworkPolicySpec{PodSelector: *sel("app", "web"),
				Egress:      []api.NetworkPolicyEgressRule{{}},
				PolicyTypes: []api.PolicyType{api.PolicyTypeEgress}}),
		}}, []reachCase{
			{"dclient", "pweb", "tcp", 80, true},
			{"pweb", "dclient", "tcp", 80, true},
		}},
		{"egress rules without policyTypes isolate ingress too", cluster{nps: []*api.NetworkPolicy{
			np("prod", "egress-rules", api.NetworkPolicySpec{PodSelector: *sel("app", "web"),
				Egress: []api.NetworkPolicyEgressRule{{}}}),
		}}, []reachCase{
			{"dclient", "pweb", "tcp", 80, false},
			{"pweb", "dclient", "tcp", 80, true},
		}},
		{"namespaceSelector and podSelector in one peer: both must match", cluster{nps: []*api.NetworkPolicy{
			ingressFrom("prod", "one-peer", nil, []api.NetworkPolicyPeer{{NamespaceSelector: sel("team", "b"), PodSelector: sel("app", "client")}}),
		}}, []reachCase{
			{"dclient", "pweb", "tcp", 80, true},
			{"pclient", "pweb", "tcp", 80, false}, // right pod, wrong namespace
			{"dweb", "pweb", "tcp", 80, false},    // right namespace, wrong pod
		}},
		{"namespaceSelector and podSelector as two peers: either matches", cluster{nps: []*api.NetworkPolicy{
			ingressFrom("prod", "two-peers", sel("app", "web"), []api.NetworkPolicyPeer{{NamespaceSelector: sel("team", "b")}, {PodSelector: sel("app", "client")}}),
		}}, []reachCase{
			{"dclient", "pweb", "tcp", 80, true},
			{"dweb", "pweb", "tcp", 80, true},    // by namespace
			{"pclient", "pweb", "tcp", 80, true}, // by pod, in the policy's namespace
			{"pdb", "pweb", "tcp", 80, false},
		}},
		{"namespaceSelector by the kubernetes.io/metadata.name label", cluster{nps: []*api.NetworkPolicy{
			ingressFrom("prod", "by-name", nil, []api.NetworkPolicyPeer{{NamespaceSelector: sel(NamespaceNameLabel, "dev")}}),
		}}, []reachCase{
			{"dclient", "pweb", "tcp", 80, true},
			{"pclient", "pweb", "tcp", 80, false},
		}},
		{"ipBlock with except", cluster{nps: []*api.NetworkPolicy{
			np("prod", "egress-block", api.NetworkPolicySpec{PodSelector: *sel("app", "client"),
				Egress:      []api.NetworkPolicyEgressRule{{To: []api.NetworkPolicyPeer{{IPBlock: &api.IPBlock{CIDR: "198.18.0.0/16", Except: []string{"198.18.5.0/24"}}}}}},
				PolicyTypes: []api.PolicyType{api.PolicyTypeEgress}}),
		}}, []reachCase{
			{"pclient", "198.18.0.1", "tcp", 80, true},
			{"pclient", "198.18.5.5", "tcp", 80, false},
			{"pclient", "198.18.6.5", "udp", 53, true},
			{"pclient", "pweb", "tcp", 8080, false},
		}},
		{"ipBlock peer for ingress", cluster{nps: []*api.NetworkPolicy{
			ingressFrom("prod", "from-block", nil, []api.NetworkPolicyPeer{{IPBlock: &api.IPBlock{CIDR: "10.244.2.0/24", Except: []string{"10.244.2.2/32"}}}}),
		}}, []reachCase{
			{"pdb", "pweb", "tcp", 80, true},
			{"dclient", "pweb", "tcp", 80, false},
			{"pclient", "pweb", "tcp", 80, false},
		}},
		{"named port resolved per destination", cluster{nps: []*api.NetworkPolicy{
			ingressFrom("prod", "http", sel("app", "web"), nil, api.NetworkPolicyPort{Protocol: ptr("TCP"), Port: ptr(api.FromString("http"))}),
			ingressFrom("dev", "http", sel("app", "web"), nil, api.NetworkPolicyPort{Protocol: ptr("TCP"), Port: ptr(api.FromString("http"))}),
		}}, []reachCase{
			{"pclient", "pweb", "tcp", 8080, true},
			{"pclient", "pweb", "tcp", 9090, false},
			{"pclient", "dweb", "tcp", 9090, true},
			{"pclient", "dweb", "tcp", 8080, false},
			{"pclient", "pweb", "udp", 8080, false},
		}},
		{"egress to a named port of the peer", cluster{nps: []*api.NetworkPolicy{
			np("prod", "to-http", api.NetworkPolicySpec{PodSelector: *sel("app", "client"),
				Egress: []api.NetworkPolicyEgressRule{{
					To:    []api.NetworkPolicyPeer{{PodSelector: sel("app", "web")}},
					Ports: []api.NetworkPolicyPort{{Protocol: ptr("TCP"), Port: ptr(api.FromString("http"))}},
				}},
				PolicyTypes: []api.PolicyType{api.PolicyTypeEgress}}),
		}}, []reachCase{
			{"pclient", "pweb", "tcp", 8080, true},
			{"pclient", "pweb", "tcp", 9090, false},
			{"pclient", "dweb", "tcp", 9090, false}, // podSelector alone: prod only
		}},
		{"endPort range", cluster{nps: []*api.NetworkPolicy{
			ingressFrom("prod", "range", nil, nil, api.NetworkPolicyPort{Protocol: ptr("TCP"), Port: ptr(api.FromInt(8000)), EndPort: ptr(int32(8100))}),
		}}, []reachCase{
			{"dclient", "pdb", "tcp", 8000, true},
			{"dclient", "pdb", "tcp", 8050, true},
			{"dclient", "pdb", "tcp", 8100, true},
			{"dclient", "pdb", "tcp", 8101, false},
			{"dclient", "pdb", "tcp", 7999, false},
			{"dclient", "pdb", "udp", 8050, false},
		}},
		{"UDP and SCTP ports, port without number", cluster{nps: []*api.NetworkPolicy{
			ingressFrom("prod", "protos", nil, nil,
				api.NetworkPolicyPort{Protocol: ptr("UDP"), Port: ptr(api.FromInt(53))},
				api.NetworkPolicyPort{Protocol: ptr("SCTP"), Port: ptr(api.FromInt(3868))},
				api.NetworkPolicyPort{Protocol: ptr("TCP"), Port: ptr(api.FromInt(80))},
				api.NetworkPolicyPort{Protocol: ptr("TCP"), Port: ptr(api.FromInt(443))}),
			ingressFrom("dev", "any-udp", nil, nil, api.NetworkPolicyPort{Protocol: ptr("UDP")}),
		}}, []reachCase{
			{"dclient", "pweb", "udp", 53, true},
			{"dclient", "pweb", "tcp", 53, false},
			{"dclient", "pweb", "sctp", 3868, true},
			{"dclient", "pweb", "tcp", 443, true},
			{"dclient", "pweb", "tcp", 444, false},
			{"pweb", "dweb", "udp", 12345, true},
			{"pweb", "dweb", "tcp", 12345, false},
		}},
		{"peers and ports: any peer on any listed port", cluster{nps: []*api.NetworkPolicy{
			ingressFrom("prod", "combo", sel("app", "db"),
				[]api.NetworkPolicyPeer{{PodSelector: sel("app", "web")}, {NamespaceSelector: sel("team", "b"), PodSelector: sel("app", "client")}},
				tcpPort(5432), tcpPort(5433)),
		}}, []reachCase{
			{"pweb", "pdb", "tcp", 5432, true},
			{"dclient", "pdb", "tcp", 5433, true},
			{"pclient", "pdb", "tcp", 5432, false},
			{"pweb", "pdb", "tcp", 80, false},
		}},
		{"a global deny overrides a namespaced allow", cluster{
			nps: []*api.NetworkPolicy{np("prod", "allow-all", api.NetworkPolicySpec{PodSelector: *sel(), Ingress: []api.NetworkPolicyIngressRule{{}}})},
			gnps: []*api.GlobalNetworkPolicy{gnp("deny-dev", 10, api.GlobalNetworkPolicySpec{
				NamespaceSelector: sel("team", "a"),
				Ingress: []api.Rule{
					{Action: api.ActionDeny, Source: api.EntityRule{NamespaceSelector: sel("team", "b")}},
					{Action: api.ActionAllow, Protocol: ptr("TCP"), Source: api.EntityRule{Nets: []string{"198.18.0.0/24"}}, Destination: api.EntityRule{Ports: []api.IntOrString{api.FromString("8000:8999")}}},
				}})},
		}, []reachCase{
			{"dclient", "pweb", "tcp", 80, false}, // global deny first
			{"pclient", "pweb", "tcp", 80, true},  // no global rule matches: namespaced allow
			{"198.18.0.9", "pweb", "tcp", 8080, true},
			{"198.18.0.9", "pweb", "tcp", 80, true}, // the namespaced allow-all
			{"dclient", "dweb", "tcp", 80, true},    // dev not selected by either
		}},
		{"a global allow ends evaluation before a namespaced deny", cluster{
			nps: []*api.NetworkPolicy{denyAllIngress("prod")},
			gnps: []*api.GlobalNetworkPolicy{gnp("allow-clients", 5, api.GlobalNetworkPolicySpec{
				Selector: sel("app", "web"),
				Ingress:  []api.Rule{{Action: api.ActionAllow, Protocol: ptr("TCP"), Source: api.EntityRule{Selector: sel("app", "client")}, Destination: api.EntityRule{Ports: []api.IntOrString{api.FromInt(8080)}}}},
			})},
		}, []reachCase{
			{"dclient", "pweb", "tcp", 8080, true},
			{"dclient", "pweb", "tcp", 80, false},
			{"pdb", "pweb", "tcp", 8080, false},
			{"pclient", "pdb", "tcp", 8080, false}, // pdb: only the namespaced deny
		}},
		{"global policies in order", cluster{gnps: []*api.GlobalNetworkPolicy{
			gnp("b-deny", 2, api.GlobalNetworkPolicySpec{Selector: sel("app", "db"), Ingress: []api.Rule{{Action: api.ActionDeny, Protocol: ptr("TCP")}}}),
			gnp("a-allow", 1, api.GlobalNetworkPolicySpec{Selector: sel("app", "db"), Ingress: []api.Rule{{Action: api.ActionAllow, Protocol: ptr("TCP"), Destination: api.EntityRule{Ports: []api.IntOrString{api.FromInt(5432)}}}}}),
			gnp("c-allow-udp", 3, api.GlobalNetworkPolicySpec{Selector: sel("app", "db"), Ingress: []api.Rule{{Action: api.ActionAllow, Protocol: ptr("UDP")}}}),
		}}, []reachCase{
			{"pweb", "pdb", "tcp", 5432, true}, // order 1 allows before order 2 denies
			{"pweb", "pdb", "tcp", 80, false},  // order 2 denies
			{"pweb", "pdb", "udp", 53, true},   // order 3 allows
			{"pweb", "pdb", "sctp", 9, false},  // selected by global policies, nothing allows
		}},
		{"global egress with nets and notNets", cluster{gnps: []*api.GlobalNetworkPolicy{
			gnp("egress", 1, api.GlobalNetworkPolicySpec{Selector: sel("app", "client"), Types: []api.PolicyType{api.PolicyTypeEgress},
				Egress: []api.Rule{
					{Action: api.ActionDeny, Destination: api.EntityRule{Nets: []string{"198.18.0.0/16"}, NotNets: []string{"198.18.0.0/24"}}},
					{Action: api.ActionAllow},
				}}),
		}}, []reachCase{
			{"pclient", "198.18.0.1", "tcp", 80, true},
			{"pclient", "198.18.7.1", "tcp", 80, false},
			{"pclient", "pweb", "tcp", 80, true},
			{"pweb", "198.18.7.1", "tcp", 80, true},
		}},
		{"global named port of the destination", cluster{gnps: []*api.GlobalNetworkPolicy{
			gnp("http", 1, api.GlobalNetworkPolicySpec{Selector: sel("app", "web"),
				Ingress: []api.Rule{{Action: api.ActionAllow, Protocol: ptr("TCP"), Destination: api.EntityRule{Ports: []api.IntOrString{api.FromString("http")}}}}}),
		}}, []reachCase{
			{"dclient", "pweb", "tcp", 8080, true},
			{"dclient", "dweb", "tcp", 9090, true},
			{"dclient", "dweb", "tcp", 8080, false},
		}},
		{"same-node traffic meets the destination's ingress policy", cluster{nps: []*api.NetworkPolicy{
			np("prod", "client-egress", api.NetworkPolicySpec{PodSelector: *sel("app", "client"), Egress: []api.NetworkPolicyEgressRule{{}}, PolicyTypes: []api.PolicyType{api.PolicyTypeEgress}}),
			ingressFrom("prod", "web-from-db", sel("app", "web"), []api.NetworkPolicyPeer{{PodSelector: sel("app", "db")}}),
		}}, []reachCase{
			{"pclient", "pweb", "tcp", 80, false}, // egress allowed, ingress not
			{"pdb", "pweb", "tcp", 80, true},
		}},
	}
	total := 0
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, rc := range tt.cases {
				total++
				if got := tt.c.reach(t, rc.src, rc.dst, rc.proto, rc.port); got != rc.want {
					t.Errorf("%s -> %s %s/%d: allowed = %v, want %v", rc.src, rc.dst, rc.proto, rc.port, got, rc.want)
				}
			}
		})
	}
	t.Logf("%d connection cases", total)
}

func TestAntiSpoofingAndConntrack(t *testing.T) {
	rs := Compile(cluster{nps: []*api.NetworkPolicy{denyAllIngress("prod"), denyAllEgress("prod")}}.input("n1"))
	rs2 := Compile(cluster{}.input("n2"))
	web := netip.MustParseAddr("10.244.1.1")
	tests := []struct {
		name string
		rs   *Ruleset
		pkt  packet
		want verdict
	}{
		{"spoofed source from a pod without policy", rs2,
			packet{src: netip.MustParseAddr("10.244.9.9"), dst: netip.MustParseAddr("198.18.0.1"), proto: "tcp", dport: 80, in: "calidclient", out: "eth0"}, vDrop},
		{"own source from a pod without policy", rs2,
			packet{src: netip.MustParseAddr("10.244.2.2"), dst: netip.MustParseAddr("198.18.0.1"), proto: "tcp", dport: 80, in: "calidclient", out: "eth0"}, vAccept},
		{"spoofed packet of an established flow", rs2,
			packet{src: netip.MustParseAddr("10.244.2.1"), dst: netip.MustParseAddr("198.18.0.1"), proto: "tcp", dport: 80, in: "calidclient", out: "eth0", established: true}, vDrop},
		{"second address of a multi-address pod", rs2,
			packet{src: netip.MustParseAddr("10.244.2.6"), dst: netip.MustParseAddr("198.18.0.1"), proto: "udp", dport: 53, in: "calipmulti", out: "eth0"}, vAccept},
		{"foreign address from a multi-address pod", rs2,
			packet{src: netip.MustParseAddr("10.244.2.7"), dst: netip.MustParseAddr("198.18.0.1"), proto: "udp", dport: 53, in: "calipmulti", out: "eth0"}, vDrop},
		{"established reply into an isolated pod", rs,
			packet{src: netip.MustParseAddr("198.18.0.1"), dst: web, proto: "tcp", sport: 80, dport: 40000, in: "eth0", out: "calipweb", established: true}, vAccept},
		{"established reply from an isolated pod", rs,
			packet{src: web, dst: netip.MustParseAddr("198.18.0.1"), proto: "tcp", sport: 80, dport: 40000, in: "calipweb", out: "eth0", established: true}, vAccept},
		{"new connection into an isolated pod", rs,
			packet{src: netip.MustParseAddr("198.18.0.1"), dst: web, proto: "tcp", dport: 80, in: "eth0", out: "calipweb"}, vDrop},
		{"to a workload interface without endpoint", rs,
			packet{src: netip.MustParseAddr("198.18.0.1"), dst: netip.MustParseAddr("10.244.1.99"), proto: "tcp", dport: 80, in: "eth0", out: "cali00000000000"}, vDrop},
		{"from a workload interface without endpoint", rs,
			packet{src: netip.MustParseAddr("10.244.1.99"), dst: netip.MustParseAddr("198.18.0.1"), proto: "tcp", dport: 80, in: "cali00000000000", out: "eth0"}, vDrop},
		{"traffic not from or to workloads is left alone", rs,
			packet{src: netip.MustParseAddr("198.18.0.3"), dst: netip.MustParseAddr("198.18.1.1"), proto: "tcp", dport: 80, in: "eth0", out: "eth1"}, vAccept},
	}
	for _, tt := range tests {
		if got := forward(t, tt.rs, tt.pkt); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestLayout pins the rendered chains of a small node, so that a change of
// the layout is a visible diff.
func TestLayout(t *testing.T) {
	in := Input{
		Node: "n1",
		Endpoints: []*api.WorkloadEndpoint{
			testPod{name: "a", ns: "prod", node: "n1", ips: []string{"10.244.1.1"}, labels: map[string]string{"app": "web"}}.endpoint(),
			testPod{name: "b", ns: "prod", node: "n2", ips: []string{"10.244.2.1"}, labels: map[string]string{"app": "client"}}.endpoint(),
		},
		NetworkPolicies: []*api.NetworkPolicy{
			ingressFrom("prod", "web", sel("app", "web"), []api.NetworkPolicyPeer{{PodSelector: sel("app", "client")}}, tcpPort(80), tcpPort(443)),
		},
		Pools:              pools[:1],
		HostProtectedPorts: []HostPort{{"tcp", 2379}, {"tcp", 50051}, {"tcp", 2379}},
	}
	rs := Compile(in)
	pi := policyChainName("np/prod/web", ingress)
	clients := setName('s', selection{namespace: "prod", pods: sel("app", "client")}.key())
	clients6 := familySetName('s', IPv6, selection{namespace: "prod", pods: sel("app", "client")}.key())
	want := []string{
		"table filter",
		"hook FORWARD jump tabby-FORWARD",
		"hook INPUT jump tabby-INPUT",
		"chain tabby-FORWARD",
		`  iifname "cali*" jump tabby-from-wl`,
		`  oifname "cali*" jump tabby-to-wl`,
		`  iifname "cali*" accept`,
		`  oifname "cali*" accept`,
		"chain tabby-INPUT",
		`  iifname "cali*" l4proto tcp dport { 2379, 50051 } drop`,
		`  iifname "cali*" icmpv6 type { 130, 131, 132, 133, 135, 136 } accept`,
		`  iifname "cali*" jump tabby-from-wl`,
		`  iifname "cali*" drop`,
		"chain tabby-from-wl",
		`  iifname vmap { "calia" : goto tabby-fw-calia } else drop`,
		"chain tabby-fw-calia",
		"  saddr != 10.244.1.1/32 drop",
		"  meta nfproto ipv6 drop",
		"  ct state established,related accept",
		"chain " + pi,
		"  saddr @" + clients + " l4proto tcp dport { 80, 443 } mark set mark & 0xfffeffff | 0x10000",
		"  ip6 saddr @" + clients6 + " l4proto tcp dport { 80, 443 } mark set mark & 0xfffeffff | 0x10000",
		"  mark & 0x10000 == 0x10000 return",
		"chain tabby-to-wl",
		`  oifname vmap { "calia" : goto tabby-tw-calia } else drop`,
		"chain tabby-tw-calia",
		"  ct state established,related accept",
		"  mark set mark & 0xfffeffff | 0x0",
		"  jump " + pi,
		"  mark & 0x10000 == 0x10000 return",
		"  drop",
		"table nat",
		"hook POSTROUTING jump tabby-POSTROUTING",
		"chain tabby-POSTROUTING",
		"  saddr @tabby-masq-pools daddr != @tabby-all-pools masquerade",
		"  ip6 saddr @tabby-masq-pools6 ip6 daddr != @tabby-all-pools6 masquerade",
		"set tabby-all-pools ipv4 net { 10.244.0.0/16 }",
		"set tabby-all-pools6 ipv6 net {  }",
		"set tabby-masq-pools ipv4 net { 10.244.0.0/16 }",
		"set tabby-masq-pools6 ipv6 net {  }",
		"set " + clients + " ipv4 net { 10.244.2.1/32 }",
		"set " + clients6 + " ipv6 net {  }",
	}
	if diff := cmp.Diff(want, rs.Lines()); diff != "" {
		t.Errorf("ruleset (-want +got):\n%s", diff)
	}
	if len(rs.Warnings) > 0 {
		t.Errorf("warnings: %v", rs.Warnings)
	}
}

func TestNATSets(t *testing.T) {
	in := Input{Node: "n1", Pools: []*api.IPPool{
		{Metadata: api.ObjectMeta{Name: "a"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", NATOutgoing: true}},
		{Metadata: api.ObjectMeta{Name: "b"}, Spec: api.IPPoolSpec{CIDR: "10.250.0.0/24"}},
		{Metadata: api.ObjectMeta{Name: "c"}, Spec: api.IPPoolSpec{CIDR: "10.251.0.0/24", NATOutgoing: true, Disabled: true}},
		{Metadata: api.ObjectMeta{Name: "bad"}, Spec: api.IPPoolSpec{CIDR: "nonsense"}},
	}}
	rs := Compile(in)
	all, _ := rs.Set(SetAllPools)
	masq, _ := rs.Set(SetMasqPools)
	if diff := cmp.Diff([]string{"10.244.0.0/16", "10.250.0.0/24", "10.251.0.0/24"}, all.Members()); diff != "" {
		t.Errorf("all pools (-want +got):\n%s", diff)
	}
	// A disabled pool hands out no new addresses, but its pods still need NAT.
	if diff := cmp.Diff([]string{"10.244.0.0/16", "10.251.0.0/24"}, masq.Members()); diff != "" {
		t.Errorf("masquerade pools (-want +got):\n%s", diff)
	}
	if len(rs.Warnings) != 1 || !strings.Contains(rs.Warnings[0], "bad") {
		t.Errorf("warnings = %q, want one about pool bad", rs.Warnings)
	}
}

func TestNetsExcept(t *testing.T) {
	pfx := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	tests := []struct {
		nets, except, want []netip.Prefix
	}{
		{pfx("10.0.0.0/8"), nil, pfx("10.0.0.0/8")},
		{pfx("10.0.0.0/8"), pfx("10.0.0.0/8"), nil},
		{pfx("10.0.0.0/24"), pfx("10.0.0.0/25"), pfx("10.0.0.128/25")},
		{pfx("10.0.0.0/24"), pfx("10.0.0.64/26"), pfx("10.0.0.0/26", "10.0.0.128/25")},
		{pfx("10.0.0.0/30"), pfx("10.0.0.1/32"), pfx("10.0.0.0/32", "10.0.0.2/31")},
		{pfx("10.0.0.0/24"), pfx("10.0.0.0/26", "10.0.0.192/26"), pfx("10.0.0.64/26", "10.0.0.128/26")},
		{pfx("10.0.0.0/24"), pfx("192.168.0.0/16"), pfx("10.0.0.0/24")},
		{pfx("10.0.0.5/24"), nil, pfx("10.0.0.0/24")}, // masked
		{pfx("0.0.0.0/0"), nil, pfx("0.0.0.0/1", "128.0.0.0/1")},
		{pfx("0.0.0.0/0"), pfx("128.0.0.0/2"), pfx("0.0.0.0/1", "192.0.0.0/2")},
		{pfx("10.0.0.0/8", "10.1.0.0/16"), nil, pfx("10.0.0.0/8")}, // overlap collapsed
	}
	for _, tt := range tests {
		got := netsExcept(tt.nets, tt.except)
		if diff := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
			t.Errorf("netsExcept(%v, %v) (-want +got):\n%s", tt.nets, tt.except, diff)
		}
	}
}

func TestNamesFitKernelLimits(t *testing.T) {
	var nps []*api.NetworkPolicy
	for i := range 20 {
		nps = append(nps, ingressFrom("prod", fmt.Sprintf("a-very-long-policy-name-that-goes-on-and-on-%d", i), sel(),
			[]api.NetworkPolicyPeer{{NamespaceSelector: sel("team", fmt.Sprint(i)), PodSelector: sel("x", "y")}, {IPBlock: &api.IPBlock{CIDR: "10.0.0.0/8"}}},
			api.NetworkPolicyPort{Protocol: ptr("TCP"), Port: ptr(api.FromString("http"))}))
	}
	rs := Compile(cluster{nps: nps}.input("n1"))
	for _, c := range rs.Chains {
		if len(c.Name) > MaxChainName || !strings.HasPrefix(c.Name, Prefix) {
			t.Errorf("chain name %q: longer than %d or without prefix", c.Name, MaxChainName)
		}
	}
	for _, s := range rs.Sets {
		if len(s.Name) > MaxSetName || !strings.HasPrefix(s.Name, Prefix) {
			t.Errorf("set name %q: longer than %d or without prefix", s.Name, MaxSetName)
		}
	}
}

func TestDeterministic(t *testing.T) {
	c := cluster{
		nps: []*api.NetworkPolicy{denyAllIngress("prod"), ingressFrom("prod", "x", nil, []api.NetworkPolicyPeer{{PodSelector: sel("app", "client")}})},
		gnps: []*api.GlobalNetworkPolicy{
			gnp("g", 1, api.GlobalNetworkPolicySpec{Ingress: []api.Rule{{Action: api.ActionAllow}}}),
		},
	}
	first := Compile(c.input("n1")).Lines()
	// Shuffled input order gives the same output.
	rev := c
	rev.nps = []*api.NetworkPolicy{c.nps[1], c.nps[0]}
	in := rev.input("n1")
	for i, j := 0, len(in.Endpoints)-1; i < j; i, j = i+1, j-1 {
		in.Endpoints[i], in.Endpoints[j] = in.Endpoints[j], in.Endpoints[i]
	}
	if diff := cmp.Diff(first, Compile(in).Lines()); diff != "" {
		t.Errorf("compiling reordered input (-first +second):\n%s", diff)
	}
}

// TestOnlyUsedPolicies: policies selecting no local endpoint cost this node
// no chains and no sets.
func TestOnlyUsedPolicies(t *testing.T) {
	c := cluster{nps: []*api.NetworkPolicy{
		ingressFrom("dev", "web", sel("app", "web"), []api.NetworkPolicyPeer{{PodSelector: sel("app", "client")}}), // dweb on n1
		ingressFrom("prod", "db", sel("app", "db"), []api.NetworkPolicyPeer{{PodSelector: sel("app", "web")}}),     // pdb on n2
	}}
	rs := Compile(c.input("n1"))
	if _, ok := rs.Chain(TableFilter, policyChainName("np/dev/web", ingress)); !ok {
		t.Error("chain of dev/web missing on n1")
	}
	if _, ok := rs.Chain(TableFilter, policyChainName("np/prod/db", ingress)); ok {
		t.Error("chain of prod/db present on n1, which has no prod db pod")
	}
	if _, ok := rs.Set(setName('s', selection{namespace: "prod", pods: sel("app", "web")}.key())); ok {
		t.Error("set of prod/db's peers present on n1")
	}
}

func TestDispatchFanout(t *testing.T) {
	var in Input
	in.Node = "n1"
	var ifaces []string
	for i := range 100 {
		iface := fmt.Sprintf("cali%011x", i*7919)
		ifaces = append(ifaces, iface)
		in.Endpoints = append(in.Endpoints, &api.WorkloadEndpoint{
			Metadata: api.ObjectMeta{Name: fmt.Sprintf("w%d", i), Namespace: "default"},
			Spec:     api.WorkloadEndpointSpec{Node: "n1", InterfaceName: iface, IPNetworks: []string{fmt.Sprintf("10.244.%d.%d/32", i/200, i%200+1)}},
		})
	}
	in.NetworkPolicies = []*api.NetworkPolicy{denyAllIngress("default")}
	rs := Compile(in)
	top, _ := rs.Chain(TableFilter, ChainToWL)
	if top.Dispatch == nil || len(top.Dispatch.Targets) != 100 {
		t.Errorf("to-workload dispatch %+v, want 100 targets", top.Dispatch)
	}
	for i, iface := range ifaces {
		src := netip.MustParseAddr(fmt.Sprintf("10.244.%d.%d", i/200, i%200+1))
		ok := packet{src: src, dst: netip.MustParseAddr("198.18.0.1"), proto: "tcp", dport: 80, in: iface, out: "eth0"}
		if got := forward(t, rs, ok); got != vAccept {
			t.Errorf("from %s: %v, want ACCEPT", iface, got)
		}
		in := packet{src: netip.MustParseAddr("198.18.0.1"), dst: src, proto: "tcp", dport: 80, in: "eth0", out: iface}
		if got := forward(t, rs, in); got != vDrop {
			t.Errorf("to %s: %v, want DROP (default deny)", iface, got)
		}
	}
	if got := rs.RulesPerEndpoint(); got < 4 || got > 12 {
		t.Errorf("rules per endpoint = %.1f, want a handful", got)
	}
}
