package kube

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tabbynet/tabby/api"
)

// The pure half of the package: Kubernetes objects in, Tabby records out.
// Nothing here talks to an API server or to etcd.

// PolicyPrefix starts the name of every Tabby NetworkPolicy translated from
// a Kubernetes one, so that both can share a namespace without clashing.
const PolicyPrefix = "k8s."

// PolicyName is the Tabby name of Kubernetes NetworkPolicy name. A name too
// long for the prefix is cut and ends in a hash of the whole.
func PolicyName(name string) string {
	n := PolicyPrefix + name
	if len(n) <= 253 {
		return n
	}
	sum := sha256.Sum256([]byte(name))
	return n[:253-17] + "-" + hex.EncodeToString(sum[:8])
}

// PodRecord is what the agents need of pod p, nil for a pod that gets no
// network from Tabby (host network).
func PodRecord(p *corev1.Pod) *api.KubePod {
	if p.Spec.HostNetwork {
		return nil
	}
	r := &api.KubePod{
		Namespace:      p.Namespace,
		Name:           p.Name,
		UID:            string(p.UID),
		Node:           p.Spec.NodeName,
		ServiceAccount: p.Spec.ServiceAccountName,
		Labels:         maps.Clone(p.Labels),
		Annotations:    api.AddressAnnotations(p.Annotations),
	}
	if len(r.Labels) == 0 {
		r.Labels = nil
	}
	for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
		for _, cp := range c.Ports {
			if cp.Name == "" {
				continue
			}
			proto := string(cp.Protocol)
			if proto == "" {
				proto = string(corev1.ProtocolTCP)
			}
			r.Ports = append(r.Ports, api.EndpointPort{Name: cp.Name, Protocol: proto, Port: uint16(cp.ContainerPort)})
		}
	}
	return r
}

// NamespaceRecord is what the agents need of namespace ns.
func NamespaceRecord(ns *corev1.Namespace) *api.KubeNamespace {
	r := &api.KubeNamespace{
		Name:        ns.Name,
		Labels:      maps.Clone(ns.Labels),
		Annotations: api.AddressAnnotations(ns.Annotations),
	}
	if len(r.Labels) == 0 {
		r.Labels = nil
	}
	return r
}

// EndpointWants returns wep changed to what the pod's and its namespace's
// records say (labels, service account, named ports, namespace labels,
// and the origin mark: the controllers manage it now), and whether
// anything changed. wep is not modified. ns may be nil (not
// synced yet): the namespace labels are then left as they are.
func EndpointWants(wep *api.WorkloadEndpoint, pod *api.KubePod, ns *api.KubeNamespace) (*api.WorkloadEndpoint, bool) {
	labels := api.EndpointLabels(pod)
	ports := pod.Ports
	nsLabels := wep.Spec.NamespaceLabels
	if ns != nil {
		nsLabels = ns.Labels
	}
	if maps.Equal(labels, wep.Metadata.Labels) && slices.Equal(ports, wep.Spec.Ports) &&
		maps.Equal(nsLabels, wep.Spec.NamespaceLabels) && api.Origin(wep) == api.OriginKubernetes {
		return wep, false
	}
	out := *wep
	out.Metadata.Annotations = maps.Clone(wep.Metadata.Annotations)
	if out.Metadata.Annotations == nil {
		out.Metadata.Annotations = map[string]string{}
	}
	out.Metadata.Annotations[api.AnnotationOrigin] = api.OriginKubernetes
	out.Metadata.Labels = labels
	out.Spec.Ports = slices.Clone(ports)
	out.Spec.NamespaceLabels = maps.Clone(nsLabels)
	return &out, true
}

// NetworkPolicy translates a Kubernetes NetworkPolicy field by field into
// a Tabby NetworkPolicy named PolicyName(np.Name), marked as coming from
// Kubernetes. nil and empty rule lists keep their meaning; policyTypes is
// what the API server stored (it defaults it).
func NetworkPolicy(np *networkingv1.NetworkPolicy) (*api.NetworkPolicy, error) {
	out := &api.NetworkPolicy{
		Metadata: api.ObjectMeta{
			Name:        PolicyName(np.Name),
			Namespace:   np.Namespace,
			Labels:      maps.Clone(np.Labels),
			Annotations: map[string]string{api.AnnotationOrigin: api.OriginKubernetes},
		},
	}
	if len(out.Metadata.Labels) == 0 {
		out.Metadata.Labels = nil
	}
	sel, err := selector(&np.Spec.PodSelector)
	if err != nil {
		return nil, fmt.Errorf("spec.podSelector: %w", err)
	}
	out.Spec.PodSelector = *sel
	for _, t := range np.Spec.PolicyTypes {
		out.Spec.PolicyTypes = append(out.Spec.PolicyTypes, api.PolicyType(t))
	}
	if np.Spec.Ingress != nil {
		out.Spec.Ingress = make([]api.NetworkPolicyIngressRule, 0, len(np.Spec.Ingress))
	}
	for i, r := range np.Spec.Ingress {
		ports, err := policyPorts(r.Ports)
		if err != nil {
			return nil, fmt.Errorf("spec.ingress[%d].ports: %w", i, err)
		}
		peers, err := policyPeers(r.From)
		if err != nil {
			return nil, fmt.Errorf("spec.ingress[%d].from: %w", i, err)
		}
		out.Spec.Ingress = append(out.Spec.Ingress, api.NetworkPolicyIngressRule{Ports: ports, From: peers})
	}
	if np.Spec.Egress != nil {
		out.Spec.Egress = make([]api.NetworkPolicyEgressRule, 0, len(np.Spec.Egress))
	}
	for i, r := range np.Spec.Egress {
		ports, err := policyPorts(r.Ports)
		if err != nil {
			return nil, fmt.Errorf("spec.egress[%d].ports: %w", i, err)
		}
		peers, err := policyPeers(r.To)
		if err != nil {
			return nil, fmt.Errorf("spec.egress[%d].to: %w", i, err)
		}
		out.Spec.Egress = append(out.Spec.Egress, api.NetworkPolicyEgressRule{Ports: ports, To: peers})
	}
	out.SetDefaults()
	if err := out.Validate(); err != nil {
		return nil, err
	}
	return out, nil
}

func selector(s *metav1.LabelSelector) (*api.LabelSelector, error) {
	if s == nil {
		return nil, nil
	}
	out := &api.LabelSelector{MatchLabels: maps.Clone(s.MatchLabels)}
	if len(out.MatchLabels) == 0 {
		out.MatchLabels = nil
	}
	for _, e := range s.MatchExpressions {
		switch e.Operator {
		case metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn, metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist:
		default:
			return nil, fmt.Errorf("unknown operator %q", e.Operator)
		}
		out.MatchExpressions = append(out.MatchExpressions, api.LabelSelectorRequirement{
			Key: e.Key, Operator: string(e.Operator), Values: slices.Clone(e.Values),
		})
	}
	return out, nil
}

func policyPeers(in []networkingv1.NetworkPolicyPeer) ([]api.NetworkPolicyPeer, error) {
	var out []api.NetworkPolicyPeer
	for i, p := range in {
		var q api.NetworkPolicyPeer
		var err error
		if q.PodSelector, err = selector(p.PodSelector); err != nil {
			return nil, fmt.Errorf("[%d].podSelector: %w", i, err)
		}
		if q.NamespaceSelector, err = selector(p.NamespaceSelector); err != nil {
			return nil, fmt.Errorf("[%d].namespaceSelector: %w", i, err)
		}
		if p.IPBlock != nil {
			q.IPBlock = &api.IPBlock{CIDR: p.IPBlock.CIDR, Except: slices.Clone(p.IPBlock.Except)}
		}
		out = append(out, q)
	}
	return out, nil
}

func policyPorts(in []networkingv1.NetworkPolicyPort) ([]api.NetworkPolicyPort, error) {
	var out []api.NetworkPolicyPort
	for i, p := range in {
		var q api.NetworkPolicyPort
		if p.Protocol != nil {
			s := strings.ToUpper(string(*p.Protocol))
			q.Protocol = &s
		}
		if p.Port != nil {
			var v api.IntOrString
			switch p.Port.Type {
			case intstr.Int:
				v = api.FromInt(p.Port.IntVal)
			case intstr.String:
				v = api.FromString(p.Port.StrVal)
			default:
				return nil, fmt.Errorf("[%d].port: unknown type %d", i, p.Port.Type)
			}
			q.Port = &v
		}
		if p.EndPort != nil {
			e := *p.EndPort
			q.EndPort = &e
		}
		out = append(out, q)
	}
	return out, nil
}

// FailClosed is the policy written for a Kubernetes NetworkPolicy that does
// not translate (for example an ipBlock whose except lies outside it): its pods
// are isolated in the policy's directions with no rule, so that a policy
// Tabby cannot read denies rather than allows. The reason is an annotation.
func FailClosed(np *networkingv1.NetworkPolicy, reason error) (*api.NetworkPolicy, error) {
	sel, err := selector(&np.Spec.PodSelector)
	if err != nil {
		return nil, err
	}
	out := &api.NetworkPolicy{
		Metadata: api.ObjectMeta{
			Name:      PolicyName(np.Name),
			Namespace: np.Namespace,
			Annotations: map[string]string{
				api.AnnotationOrigin:           api.OriginKubernetes,
				api.AnnotationTranslationError: reason.Error(),
			},
		},
		Spec: api.NetworkPolicySpec{PodSelector: *sel},
	}
	for _, t := range np.Spec.PolicyTypes {
		out.Spec.PolicyTypes = append(out.Spec.PolicyTypes, api.PolicyType(t))
	}
	if len(out.Spec.PolicyTypes) == 0 {
		out.Spec.PolicyTypes = []api.PolicyType{api.PolicyTypeIngress}
	}
	out.SetDefaults()
	return out, out.Validate()
}
