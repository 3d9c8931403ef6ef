package kube_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/kube"
)

func sel(kv ...string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

func asel(kv ...string) *api.LabelSelector {
	s := &api.LabelSelector{}
	if len(kv) > 0 {
		s.MatchLabels = map[string]string{}
	}
	for i := 0; i+1 < len(kv); i += 2 {
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

func cnpOf(tier npav1.Tier, prio int32, spec func(*npav1.ClusterNetworkPolicySpec)) *npav1.ClusterNetworkPolicy {
	c := &npav1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec: npav1.ClusterNetworkPolicySpec{
			Tier: tier, Priority: prio,
			Subject: npav1.ClusterNetworkPolicySubject{Namespaces: sel("team", "a")},
		},
	}
	if spec != nil {
		spec(&c.Spec)
	}
	return c
}

func gnpOf(tier string, order float64, types []api.PolicyType, ns, pods *api.LabelSelector, in, eg []api.Rule) *api.GlobalNetworkPolicy {
	return &api.GlobalNetworkPolicy{
		TypeMeta: api.TypeMeta{APIVersion: api.APIVersion, Kind: api.KindGlobalNetworkPolicy},
		Metadata: api.ObjectMeta{Name: "cnp.p", Annotations: map[string]string{
			api.AnnotationOrigin: api.OriginKubernetes, kube.AnnotationCNPSource: "p",
		}},
		Spec: api.GlobalNetworkPolicySpec{
			Tier: tier, Order: &order, Types: types, NamespaceSelector: ns, Selector: pods,
			Ingress: in, Egress: eg,
		},
	}
}

func tcp(ports ...api.IntOrString) npav1.ClusterNetworkPolicyProtocol {
	p := npav1.ClusterNetworkPolicyProtocol{TCP: &npav1.ClusterNetworkPolicyProtocolTCP{}}
	if len(ports) > 0 {
		if ports[0].IsString {
			lo, hi, _ := strings.Cut(ports[0].StrVal, ":")
			p.TCP.DestinationPort = &npav1.Port{Range: &npav1.PortRange{Start: atoi(lo), End: atoi(hi)}}
		} else {
			p.TCP.DestinationPort = &npav1.Port{Number: ports[0].IntVal}
		}
	}
	return p
}

func atoi(s string) int32 {
	n := int32(0)
	for _, c := range s {
		n = n*10 + int32(c-'0')
	}
	return n
}

func proto(p string) *string { return &p }

var (
	in     = []api.PolicyType{api.PolicyTypeIngress}
	eg     = []api.PolicyType{api.PolicyTypeEgress}
	nsPeer = npav1.ClusterNetworkPolicyIngressPeer{Namespaces: sel("team", "b")}
)

func TestClusterNetworkPolicyTranslation(t *testing.T) {
	nodes := kube.NodeAddrs{
		{Name: "n1", Labels: map[string]string{"role": "infra"}, Addrs: []netip.Addr{netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("fd00::1")}},
		{Name: "n2", Labels: map[string]string{"role": "worker"}, Addrs: []netip.Addr{netip.MustParseAddr("198.18.0.2")}},
	}
	tests := []struct {
		name string
		cnp  *npav1.ClusterNetworkPolicy
		want *api.GlobalNetworkPolicy
	}{{
		name: "admin ingress accept from namespaces, one rule per protocol, range and number",
		cnp: cnpOf(npav1.AdminTier, 7, func(s *npav1.ClusterNetworkPolicySpec) {
			s.Ingress = []npav1.ClusterNetworkPolicyIngressRule{{
				Action: npav1.ClusterNetworkPolicyRuleActionAccept, From: []npav1.ClusterNetworkPolicyIngressPeer{nsPeer},
				Protocols: []npav1.ClusterNetworkPolicyProtocol{tcp(api.FromInt(80)), tcp(api.FromString("1000:2000")),
					{UDP: &npav1.ClusterNetworkPolicyProtocolUDP{}}},
			}}
		}),
		want: gnpOf("kube-admin", 7, in, asel("team", "a"), nil, []api.Rule{
			{Action: "Allow", Protocol: proto("TCP"), Source: api.EntityRule{NamespaceSelector: asel("team", "b")}, Destination: api.EntityRule{Ports: []api.IntOrString{api.FromInt(80)}}},
			{Action: "Allow", Protocol: proto("TCP"), Source: api.EntityRule{NamespaceSelector: asel("team", "b")}, Destination: api.EntityRule{Ports: []api.IntOrString{api.FromString("1000:2000")}}},
			{Action: "Allow", Protocol: proto("UDP"), Source: api.EntityRule{NamespaceSelector: asel("team", "b")}},
		}, nil),
	}, {
		name: "baseline pods subject, egress deny to pods and networks with a named port: one rule per protocol",
		cnp: cnpOf(npav1.BaselineTier, 0, func(s *npav1.ClusterNetworkPolicySpec) {
			s.Subject = npav1.ClusterNetworkPolicySubject{Pods: &npav1.NamespacedPod{NamespaceSelector: *sel(), PodSelector: *sel("app", "db")}}
			s.Egress = []npav1.ClusterNetworkPolicyEgressRule{{
				Action: npav1.ClusterNetworkPolicyRuleActionDeny,
				To: []npav1.ClusterNetworkPolicyEgressPeer{
					{Pods: &npav1.NamespacedPod{NamespaceSelector: *sel("team", "c"), PodSelector: *sel()}},
					{Networks: []npav1.CIDR{"10.244.0.0/16", "fd00:10::/64"}},
				},
				Protocols: []npav1.ClusterNetworkPolicyProtocol{{DestinationNamedPort: "web"}},
			}}
		}),
		want: func() *api.GlobalNetworkPolicy {
			web := []api.IntOrString{api.FromString("web")}
			var rules []api.Rule
			for _, peer := range []api.EntityRule{{NamespaceSelector: asel("team", "c"), Selector: asel()}, {Nets: []string{"10.244.0.0/16", "fd00:10::/64"}}} {
				for _, p := range []string{"TCP", "UDP", "SCTP"} {
					d := peer
					d.Ports = web
					rules = append(rules, api.Rule{Action: "Deny", Protocol: proto(p), Destination: d})
				}
			}
			return gnpOf("kube-baseline", 0, eg, asel(), asel("app", "db"), nil, rules)
		}(),
	}, {
		name: "pass to the nodes a selector picks, by address; no protocols: any",
		cnp: cnpOf(npav1.AdminTier, 1000, func(s *npav1.ClusterNetworkPolicySpec) {
			s.Egress = []npav1.ClusterNetworkPolicyEgressRule{{
				Action: npav1.ClusterNetworkPolicyRuleActionPass,
				To:     []npav1.ClusterNetworkPolicyEgressPeer{{Nodes: sel("role", "infra")}, {Nodes: sel("role", "none")}},
			}}
		}),
		want: gnpOf("kube-admin", 1000, eg, asel("team", "a"), nil, nil, []api.Rule{
			{Action: "Pass", Destination: api.EntityRule{Nets: []string{"198.18.0.1/32", "fd00::1/128"}}},
		}),
	}, {
		name: "no rules: selects, governs ingress, and every packet reaches the tier's end",
		cnp:  cnpOf(npav1.AdminTier, 3, nil),
		want: gnpOf("kube-admin", 3, in, asel("team", "a"), nil, nil, nil),
	}, {
		name: "both directions",
		cnp: cnpOf(npav1.BaselineTier, 5, func(s *npav1.ClusterNetworkPolicySpec) {
			s.Ingress = []npav1.ClusterNetworkPolicyIngressRule{{Action: npav1.ClusterNetworkPolicyRuleActionDeny, From: []npav1.ClusterNetworkPolicyIngressPeer{nsPeer}}}
			s.Egress = []npav1.ClusterNetworkPolicyEgressRule{{Action: npav1.ClusterNetworkPolicyRuleActionAccept, To: []npav1.ClusterNetworkPolicyEgressPeer{{Namespaces: sel()}}}}
		}),
		want: gnpOf("kube-baseline", 5, []api.PolicyType{api.PolicyTypeIngress, api.PolicyTypeEgress}, asel("team", "a"), nil,
			[]api.Rule{{Action: "Deny", Source: api.EntityRule{NamespaceSelector: asel("team", "b")}}},
			[]api.Rule{{Action: "Allow", Destination: api.EntityRule{NamespaceSelector: asel()}}}),
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := kube.ClusterNetworkPolicy(tt.cnp, nodes)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("translation (-want +got):\n%s", d)
			}
		})
	}
}

// An object Tabby cannot enforce exactly is refused whole, with the path
// of the field that decided.
func TestClusterNetworkPolicyRefused(t *testing.T) {
	egress := func(p npav1.ClusterNetworkPolicyEgressPeer, protos ...npav1.ClusterNetworkPolicyProtocol) func(*npav1.ClusterNetworkPolicySpec) {
		return func(s *npav1.ClusterNetworkPolicySpec) {
			s.Egress = []npav1.ClusterNetworkPolicyEgressRule{
				{Action: npav1.ClusterNetworkPolicyRuleActionAccept, To: []npav1.ClusterNetworkPolicyEgressPeer{{Namespaces: sel()}}},
				{Action: npav1.ClusterNetworkPolicyRuleActionDeny, To: []npav1.ClusterNetworkPolicyEgressPeer{{Namespaces: sel()}, p}, Protocols: protos},
			}
		}
	}
	badOp := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}}}
	tests := []struct {
		name string
		cnp  *npav1.ClusterNetworkPolicy
		want string
	}{
		{"domain names", cnpOf(npav1.AdminTier, 1, egress(npav1.ClusterNetworkPolicyEgressPeer{DomainNames: []npav1.DomainName{"example.org"}})),
			"spec.egress[1].to[1].domainNames: not supported"},
		{"two peer fields", cnpOf(npav1.AdminTier, 1, egress(npav1.ClusterNetworkPolicyEgressPeer{Namespaces: sel(), Networks: []npav1.CIDR{"10.0.0.0/8"}})),
			"spec.egress[1].to[1]: exactly one peer field must be set, found 2"},
		{"host bits", cnpOf(npav1.AdminTier, 1, egress(npav1.ClusterNetworkPolicyEgressPeer{Networks: []npav1.CIDR{"10.1.2.3/8"}})),
			`spec.egress[1].to[1].networks[0]: "10.1.2.3/8" has host bits set (use 10.0.0.0/8)`},
		{"bad selector operator", cnpOf(npav1.AdminTier, 1, egress(npav1.ClusterNetworkPolicyEgressPeer{Nodes: badOp})),
			`spec.egress[1].to[1].nodes: "Near" is not a valid label selector operator`},
		{"bad label value", cnpOf(npav1.AdminTier, 1, func(s *npav1.ClusterNetworkPolicySpec) { s.Subject.Namespaces = sel("team", "a b") }),
			"spec.subject.namespaces: values[0][team]: Invalid value"},
		{"bad pod selector", cnpOf(npav1.AdminTier, 1, func(s *npav1.ClusterNetworkPolicySpec) {
			s.Subject = npav1.ClusterNetworkPolicySubject{Pods: &npav1.NamespacedPod{PodSelector: *badOp}}
		}), "spec.subject.pods.podSelector:"},
		{"range backwards", cnpOf(npav1.AdminTier, 1, egress(npav1.ClusterNetworkPolicyEgressPeer{Namespaces: sel()}, tcp(api.FromString("90:80")))),
			"spec.egress[1].protocols[0].tcp.destinationPort: range 90-80: start must not be greater than end"},
		{"two protocols in one entry", cnpOf(npav1.AdminTier, 1, egress(npav1.ClusterNetworkPolicyEgressPeer{Namespaces: sel()},
			npav1.ClusterNetworkPolicyProtocol{TCP: &npav1.ClusterNetworkPolicyProtocolTCP{}, DestinationNamedPort: "web"})),
			"spec.egress[1].protocols[0]: exactly one of tcp, udp, sctp and destinationNamedPort must be set, found 2"},
		{"unknown tier", cnpOf("Middle", 1, nil), `spec.tier: "Middle" is not one of Admin, Baseline`},
		{"unknown action", cnpOf(npav1.AdminTier, 1, func(s *npav1.ClusterNetworkPolicySpec) {
			s.Ingress = []npav1.ClusterNetworkPolicyIngressRule{{Action: "Allow", From: []npav1.ClusterNetworkPolicyIngressPeer{nsPeer}}}
		}), `spec.ingress[0].action: "Allow" is not one of Accept, Deny, Pass`},
		{"no subject", cnpOf(npav1.AdminTier, 1, func(s *npav1.ClusterNetworkPolicySpec) { s.Subject.Namespaces = nil }),
			"spec.subject: one of namespaces and pods must be set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := kube.ClusterNetworkPolicy(tt.cnp, nil)
			if err == nil {
				t.Fatalf("translated to %+v, want an error containing %q", got, tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q, want one containing %q", err, tt.want)
			}
			if got != nil {
				t.Errorf("refused, yet a policy came out: %+v", got)
			}
		})
	}
}

func TestNodeInfoOf(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"a": "b"}}}
	n.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeHostName, Address: "n"}, {Type: corev1.NodeInternalIP, Address: "198.18.0.9"},
		{Type: corev1.NodeExternalIP, Address: "198.18.0.9"}, {Type: corev1.NodeInternalIP, Address: "fd00::9"},
	}
	want := kube.NodeInfo{Name: "n", Labels: map[string]string{"a": "b"}, Addrs: []netip.Addr{netip.MustParseAddr("198.18.0.9"), netip.MustParseAddr("fd00::9")}}
	if d := cmp.Diff(want, kube.NodeInfoOf(n), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); d != "" {
		t.Error(d)
	}
}
