package kube

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tabbynet/tabby/api"
)

func ptr[T any](v T) *T { return &v }

func TestNetworkPolicy(t *testing.T) {
	tcp, udp, sctp := corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP
	port := func(p intstr.IntOrString) *intstr.IntOrString { return &p }
	meta := metav1.ObjectMeta{Name: "np", Namespace: "ns1"}
	wantMeta := api.ObjectMeta{Name: "k8s.np", Namespace: "ns1", Annotations: map[string]string{api.AnnotationOrigin: api.OriginKubernetes}}
	ing, eg := api.PolicyTypeIngress, api.PolicyTypeEgress
	tests := []struct {
		name string
		in   networkingv1.NetworkPolicySpec
		want api.NetworkPolicySpec
	}{
		{
			name: "deny all ingress: no rules",
			in:   networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{"Ingress"}},
			want: api.NetworkPolicySpec{PolicyTypes: []api.PolicyType{ing}},
		},
		{
			name: "allow all ingress: one empty rule",
			in:   networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{}}, PolicyTypes: []networkingv1.PolicyType{"Ingress"}},
			want: api.NetworkPolicySpec{Ingress: []api.NetworkPolicyIngressRule{{}}, PolicyTypes: []api.PolicyType{ing}},
		},
		{
			name: "deny all egress: empty egress list with type Egress",
			in:   networkingv1.NetworkPolicySpec{Egress: []networkingv1.NetworkPolicyEgressRule{}, PolicyTypes: []networkingv1.PolicyType{"Ingress", "Egress"}},
			want: api.NetworkPolicySpec{Egress: []api.NetworkPolicyEgressRule{}, PolicyTypes: []api.PolicyType{ing, eg}},
		},
		{
			name: "selectors, ipBlock with except, ports with endPort and names",
			in: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"},
					MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}}}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From: []networkingv1.NetworkPolicyPeer{
						{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
							NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "x"}}},
						{NamespaceSelector: &metav1.LabelSelector{}},
						{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}},
					},
					Ports: []networkingv1.NetworkPolicyPort{
						{Protocol: &tcp, Port: port(intstr.FromInt32(5432))},
						{Protocol: &udp, Port: port(intstr.FromInt32(1000)), EndPort: ptr(int32(2000))},
						{Protocol: &sctp},
						{Protocol: &tcp, Port: port(intstr.FromString("metrics"))},
					},
				}},
				Egress:      []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}}},
				PolicyTypes: []networkingv1.PolicyType{"Ingress", "Egress"},
			},
			want: api.NetworkPolicySpec{
				PodSelector: api.LabelSelector{MatchLabels: map[string]string{"app": "db"},
					MatchExpressions: []api.LabelSelectorRequirement{{Key: "tier", Operator: "In", Values: []string{"a", "b"}}}},
				Ingress: []api.NetworkPolicyIngressRule{{
					From: []api.NetworkPolicyPeer{
						{PodSelector: &api.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
							NamespaceSelector: &api.LabelSelector{MatchLabels: map[string]string{"team": "x"}}},
						{NamespaceSelector: &api.LabelSelector{}},
						{IPBlock: &api.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}},
					},
					Ports: []api.NetworkPolicyPort{
						{Protocol: ptr("TCP"), Port: ptr(api.FromInt(5432))},
						{Protocol: ptr("UDP"), Port: ptr(api.FromInt(1000)), EndPort: ptr(int32(2000))},
						{Protocol: ptr("SCTP")},
						{Protocol: ptr("TCP"), Port: ptr(api.FromString("metrics"))},
					},
				}},
				Egress:      []api.NetworkPolicyEgressRule{{To: []api.NetworkPolicyPeer{{PodSelector: &api.LabelSelector{}}}}},
				PolicyTypes: []api.PolicyType{ing, eg},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := NetworkPolicy(&networkingv1.NetworkPolicy{ObjectMeta: meta, Spec: tt.in})
			if err != nil {
				t.Fatal(err)
			}
			want := &api.NetworkPolicy{Metadata: wantMeta, Spec: tt.want}
			want.SetDefaults()
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("(-want +got)\n%s", d)
			}
		})
	}
}

func TestNetworkPolicyFailsClosed(t *testing.T) {
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: "ns1"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			// An except outside its CIDR: the API server accepts it, Tabby
			// cannot enforce it.
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/16", Except: []string{"10.1.0.0/24"}}}}}},
			PolicyTypes: []networkingv1.PolicyType{"Ingress"},
		},
	}
	_, err := NetworkPolicy(np)
	if err == nil {
		t.Fatal("an ipBlock with an except outside its CIDR translated")
	}
	// IPv6 ipBlocks translate (the policy layer enforces them).
	v6 := np.DeepCopy()
	v6.Spec.Ingress[0].From[0].IPBlock = &networkingv1.IPBlock{CIDR: "fd00::/64", Except: []string{"fd00::/80"}}
	if _, err := NetworkPolicy(v6); err != nil {
		t.Errorf("an IPv6 ipBlock: %v", err)
	}
	got, err := FailClosed(np, err)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.Ingress) != 0 || got.Spec.PodSelector.MatchLabels["app"] != "db" || got.Metadata.Annotations[api.AnnotationTranslationError] == "" {
		t.Errorf("fail-closed policy = %+v", got)
	}
}

func TestPolicyName(t *testing.T) {
	long := strings.Repeat("a", 253)
	if n := PolicyName(long); len(n) != 253 || !strings.HasPrefix(n, "k8s.") {
		t.Errorf("PolicyName(253 chars) = %q (%d)", n, len(n))
	}
	if PolicyName(long) == PolicyName(long[:252]+"b") {
		t.Error("two long names collide")
	}
}

func TestPodRecord(t *testing.T) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns1", UID: "u1", Labels: map[string]string{"app": "web"},
			Annotations: map[string]string{"cni.projectcalico.org/ipv4pools": `["a"]`, "other": "x"}},
		Spec: corev1.PodSpec{NodeName: "n1", ServiceAccountName: "sa",
			Containers: []corev1.Container{{Ports: []corev1.ContainerPort{
				{Name: "http", ContainerPort: 8080}, {ContainerPort: 9}, {Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}}}}},
	}
	want := &api.KubePod{Namespace: "ns1", Name: "p", UID: "u1", Node: "n1", ServiceAccount: "sa",
		Labels:      map[string]string{"app": "web"},
		Annotations: map[string]string{"cni.projectcalico.org/ipv4pools": `["a"]`},
		Ports:       []api.EndpointPort{{Name: "http", Protocol: "TCP", Port: 8080}, {Name: "dns", Protocol: "UDP", Port: 53}}}
	if d := cmp.Diff(want, PodRecord(p)); d != "" {
		t.Errorf("(-want +got)\n%s", d)
	}
	p.Spec.HostNetwork = true
	if r := PodRecord(p); r != nil {
		t.Errorf("host-network pod has a record: %+v", r)
	}
}

func TestEndpointWants(t *testing.T) {
	wep := &api.WorkloadEndpoint{Metadata: api.ObjectMeta{Name: "n1-k8s-p-eth0", Namespace: "ns1", Labels: map[string]string{"app": "old"}}}
	pod := &api.KubePod{Namespace: "ns1", Name: "p", ServiceAccount: "sa", Labels: map[string]string{"app": "web"},
		Ports: []api.EndpointPort{{Name: "http", Protocol: "TCP", Port: 80}}}
	ns := &api.KubeNamespace{Name: "ns1", Labels: map[string]string{"team": "x"}}
	got, changed := EndpointWants(wep, pod, ns)
	if !changed {
		t.Fatal("no change")
	}
	if d := cmp.Diff(map[string]string{"app": "web", api.LabelServiceAccount: "sa"}, got.Metadata.Labels); d != "" {
		t.Error(d)
	}
	if got.Spec.NamespaceLabels["team"] != "x" || len(got.Spec.Ports) != 1 || wep.Metadata.Labels["app"] != "old" {
		t.Errorf("got %+v, input %+v", got, wep)
	}
	if api.Origin(got) != api.OriginKubernetes || len(wep.Metadata.Annotations) != 0 {
		t.Errorf("origin %q (annotations %v; input's %v), want kubernetes on the output only", api.Origin(got), got.Metadata.Annotations, wep.Metadata.Annotations)
	}
	if _, changed := EndpointWants(got, pod, ns); changed {
		t.Error("a second pass changes something")
	}
	// An endpoint whose labels already match but that lacks the mark (an
	// older agent's) is marked.
	unmarked := *got
	unmarked.Metadata.Annotations = map[string]string{"other": "kept"}
	again, changed := EndpointWants(&unmarked, pod, ns)
	if !changed || api.Origin(again) != api.OriginKubernetes || again.Metadata.Annotations["other"] != "kept" {
		t.Errorf("unmarked endpoint: changed %v, annotations %v", changed, again.Metadata.Annotations)
	}
}
