package kube

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/tabbynet/tabby/api"
)

// The pure half of the ClusterNetworkPolicy support (network-policy-api
// v1beta1, docs/policy.md "Cluster network policy"): an object in, one
// GlobalNetworkPolicy out, or an error naming the field that Tabby refuses.

// CNPPrefix starts the name of the GlobalNetworkPolicy translated from a
// ClusterNetworkPolicy (contract B).
const CNPPrefix = "cnp."

// The built-in tiers the translations go to (contract B).
const (
	TierKubeAdmin    = api.TierKubeAdmin
	TierKubeBaseline = api.TierKubeBaseline
)

// maxCNPRules bounds the rules one object expands to (rules × peers ×
// protocols): the CRD allows 25 of each, so a legal object stays well
// under it, and an absurd one is refused rather than compiled.
const maxCNPRules = 4096

// CNPName is the GlobalNetworkPolicy name of ClusterNetworkPolicy name; a
// name too long for the prefix is cut and ends in a hash of the whole.
func CNPName(name string) string { return prefixedName(CNPPrefix, name) }

func prefixedName(prefix, name string) string {
	n := prefix + name
	if len(n) <= 253 {
		return n
	}
	sum := sha256.Sum256([]byte(name))
	return n[:253-17] + "-" + hex.EncodeToString(sum[:8])
}

// NodeAddrs maps Kubernetes node names to their labels and addresses, for
// the nodes peers of egress rules (which Tabby matches by address).
type NodeAddrs []NodeInfo

// NodeInfo is what a nodes peer needs of one Kubernetes Node.
type NodeInfo struct {
	Name   string
	Labels map[string]string
	Addrs  []netip.Addr
}

// NodeInfoOf is the node's labels and its InternalIP and ExternalIP
// addresses (the ones pods reach it at).
func NodeInfoOf(n *corev1.Node) NodeInfo {
	ni := NodeInfo{Name: n.Name, Labels: n.Labels}
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil && !slices.Contains(ni.Addrs, ip.Unmap()) {
			ni.Addrs = append(ni.Addrs, ip.Unmap())
		}
	}
	return ni
}

// UsesNodes reports whether the object has a nodes peer, so that it must
// be translated again when nodes change.
func UsesNodes(cnp *npav1.ClusterNetworkPolicy) bool {
	for _, r := range cnp.Spec.Egress {
		for _, p := range r.To {
			if p.Nodes != nil {
				return true
			}
		}
	}
	return false
}

// ClusterNetworkPolicy translates cnp into the GlobalNetworkPolicy
// CNPName(cnp.Name) in tier kube-admin (tier Admin) or kube-baseline
// (Baseline), ordered by spec.priority, marked as coming from Kubernetes.
// Each (rule, peer, protocol) becomes one Tabby rule with the rule's
// action, in the object's order. An error names the first field Tabby does
// not support or cannot read: the object is then refused whole.
func ClusterNetworkPolicy(cnp *npav1.ClusterNetworkPolicy, nodes NodeAddrs) (*api.GlobalNetworkPolicy, error) {
	s := &cnp.Spec
	out := &api.GlobalNetworkPolicy{
		TypeMeta: api.TypeMeta{APIVersion: api.APIVersion, Kind: api.KindGlobalNetworkPolicy},
		Metadata: api.ObjectMeta{
			Name: CNPName(cnp.Name),
			Annotations: map[string]string{
				api.AnnotationOrigin: api.OriginKubernetes,
				AnnotationCNPSource:  cnp.Name,
			},
		},
	}
	switch s.Tier {
	case npav1.AdminTier:
		out.Spec.Tier = TierKubeAdmin
	case npav1.BaselineTier:
		out.Spec.Tier = TierKubeBaseline
	default:
		return nil, fmt.Errorf("spec.tier: %q is not one of Admin, Baseline", s.Tier)
	}
	if s.Priority < 0 || s.Priority > 1000 {
		return nil, fmt.Errorf("spec.priority: %d is not between 0 and 1000", s.Priority)
	}
	order := float64(s.Priority)
	out.Spec.Order = &order
	if err := cnpSubject(&s.Subject, &out.Spec); err != nil {
		return nil, err
	}
	for i, r := range s.Ingress {
		path := fmt.Sprintf("spec.ingress[%d]", i)
		var peers []api.EntityRule
		for j, p := range r.From {
			e, err := ingressPeer(p)
			if err != nil {
				return nil, fmt.Errorf("%s.from[%d]%w", path, j, err)
			}
			peers = append(peers, e)
		}
		rules, err := cnpRules(path, r.Action, peers, r.Protocols, true)
		if err != nil {
			return nil, err
		}
		out.Spec.Ingress = append(out.Spec.Ingress, rules...)
	}
	for i, r := range s.Egress {
		path := fmt.Sprintf("spec.egress[%d]", i)
		var peers []api.EntityRule
		for j, p := range r.To {
			e, err := egressPeer(p, nodes)
			if err != nil {
				return nil, fmt.Errorf("%s.to[%d]%w", path, j, err)
			}
			peers = append(peers, e...)
		}
		rules, err := cnpRules(path, r.Action, peers, r.Protocols, false)
		if err != nil {
			return nil, err
		}
		out.Spec.Egress = append(out.Spec.Egress, rules...)
	}
	if n := len(out.Spec.Ingress) + len(out.Spec.Egress); n > maxCNPRules {
		return nil, fmt.Errorf("spec: expands to %d rules (rules × peers × protocols), more than %d", n, maxCNPRules)
	}
	// A direction is governed only if the object has rules for it: an
	// object with ingress rules alone leaves its subjects' egress alone.
	if len(s.Ingress) > 0 || len(s.Egress) == 0 {
		out.Spec.Types = append(out.Spec.Types, api.PolicyTypeIngress)
	}
	if len(s.Egress) > 0 {
		out.Spec.Types = append(out.Spec.Types, api.PolicyTypeEgress)
	}
	if err := out.Validate(); err != nil {
		return nil, fmt.Errorf("translated policy does not validate: %w", err)
	}
	return out, nil
}

// AnnotationCNPSource, on a GlobalNetworkPolicy, names the
// ClusterNetworkPolicy it was translated from.
const AnnotationCNPSource = "tabby.dev/cluster-network-policy"

// cnpSubject sets the policy's endpoint selection. Exactly one of
// namespaces and pods must be set (the CRD says so; checked again here).
func cnpSubject(sub *npav1.ClusterNetworkPolicySubject, spec *api.GlobalNetworkPolicySpec) error {
	switch {
	case sub.Namespaces != nil && sub.Pods != nil:
		return fmt.Errorf("spec.subject: only one of namespaces and pods may be set")
	case sub.Namespaces != nil:
		ns, err := cnpSelector(sub.Namespaces)
		if err != nil {
			return fmt.Errorf("spec.subject.namespaces: %w", err)
		}
		spec.NamespaceSelector = ns
	case sub.Pods != nil:
		ns, pods, err := namespacedPod(sub.Pods)
		if err != nil {
			return fmt.Errorf("spec.subject.pods.%w", err)
		}
		spec.NamespaceSelector, spec.Selector = ns, pods
	default:
		return fmt.Errorf("spec.subject: one of namespaces and pods must be set")
	}
	return nil
}

// namespacedPod converts a pods selection; an error starts with the field
// name so that callers prefix the path.
func namespacedPod(p *npav1.NamespacedPod) (ns, pods *api.LabelSelector, err error) {
	if ns, err = cnpSelector(&p.NamespaceSelector); err != nil {
		return nil, nil, fmt.Errorf("namespaceSelector: %w", err)
	}
	if pods, err = cnpSelector(&p.PodSelector); err != nil {
		return nil, nil, fmt.Errorf("podSelector: %w", err)
	}
	return ns, pods, nil
}

func ingressPeer(p npav1.ClusterNetworkPolicyIngressPeer) (api.EntityRule, error) {
	return selectorPeer(p.Namespaces, p.Pods, 0)
}

// selectorPeer is a namespaces or pods peer; others counts the peer's
// other fields set, since a peer must set exactly one. Peer errors start
// with the field (".pods…") or ": ", to follow the peer's path.
func selectorPeer(nss *metav1.LabelSelector, pods *npav1.NamespacedPod, others int) (api.EntityRule, error) {
	set := others
	if nss != nil {
		set++
	}
	if pods != nil {
		set++
	}
	if set != 1 {
		return api.EntityRule{}, fmt.Errorf(": exactly one peer field must be set, found %d", set)
	}
	switch {
	case nss != nil:
		sel, err := cnpSelector(nss)
		if err != nil {
			return api.EntityRule{}, fmt.Errorf(".namespaces: %w", err)
		}
		return api.EntityRule{NamespaceSelector: sel}, nil
	case pods != nil:
		ns, sel, err := namespacedPod(pods)
		if err != nil {
			return api.EntityRule{}, fmt.Errorf(".pods.%w", err)
		}
		return api.EntityRule{NamespaceSelector: ns, Selector: sel}, nil
	}
	return api.EntityRule{}, nil
}

// egressPeer is one egress peer as entity rules: none for a nodes peer
// that selects no node (it matches nothing).
func egressPeer(p npav1.ClusterNetworkPolicyEgressPeer, nodes NodeAddrs) ([]api.EntityRule, error) {
	if len(p.DomainNames) > 0 {
		return nil, fmt.Errorf(".domainNames: not supported by Tabby")
	}
	others := 0
	if p.Nodes != nil {
		others++
	}
	if len(p.Networks) > 0 {
		others++
	}
	if p.Namespaces != nil || p.Pods != nil || others != 1 {
		e, err := selectorPeer(p.Namespaces, p.Pods, others)
		if err != nil {
			return nil, err
		}
		return []api.EntityRule{e}, nil
	}
	if p.Nodes != nil {
		return nodesPeer(p.Nodes, nodes)
	}
	var e api.EntityRule
	for i, n := range p.Networks {
		pfx, err := netip.ParsePrefix(string(n))
		if err != nil {
			return nil, fmt.Errorf(".networks[%d]: %q is not a CIDR", i, n)
		}
		if pfx != pfx.Masked() {
			return nil, fmt.Errorf(".networks[%d]: %q has host bits set (use %s)", i, n, pfx.Masked())
		}
		e.Nets = append(e.Nets, pfx.String())
	}
	return []api.EntityRule{e}, nil
}

// nodesPeer matches the addresses of the nodes the selector picks now.
func nodesPeer(sel *metav1.LabelSelector, nodes NodeAddrs) ([]api.EntityRule, error) {
	s, err := cnpSelector(sel)
	if err != nil {
		return nil, fmt.Errorf(".nodes: %w", err)
	}
	var nets []string
	for _, n := range nodes {
		if !s.Matches(n.Labels) {
			continue
		}
		for _, a := range n.Addrs {
			nets = append(nets, netip.PrefixFrom(a, a.BitLen()).String())
		}
	}
	if len(nets) == 0 {
		return nil, nil
	}
	slices.Sort(nets)
	return []api.EntityRule{{Nets: slices.Compact(nets)}}, nil
}

// cnpSelector converts a selector after checking it as the API server's
// label selector code does (operators, values, label keys and values), so
// that a bad one is refused with its field path.
func cnpSelector(s *metav1.LabelSelector) (*api.LabelSelector, error) {
	if _, err := metav1.LabelSelectorAsSelector(s); err != nil {
		return nil, err
	}
	return selector(s)
}
