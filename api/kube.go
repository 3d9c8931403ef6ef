package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// What tabby-kube-controllers records about Kubernetes objects for the
// agents, which hold no Kubernetes API rights. These records are not
// resources (tabbyctl does not manage them); they live under kube/ in the
// datastore (see datastore.KubePodKey) as the JSON of these types.

// KubePod is the record of one Kubernetes pod: what CNI ADD needs to build
// the pod's WorkloadEndpoint and choose its address.
type KubePod struct {
	Namespace      string            `json:"namespace"`
	Name           string            `json:"name"`
	UID            string            `json:"uid"`
	Node           string            `json:"node,omitempty"`
	ServiceAccount string            `json:"serviceAccount,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	// Annotations holds only the address-selection annotations
	// (AddressAnnotationKeys), not every annotation of the pod.
	Annotations map[string]string `json:"annotations,omitempty"`
	// Ports are the pod's named container ports.
	Ports []EndpointPort `json:"ports,omitempty"`
}

// KubeNamespace is the record of one Kubernetes namespace.
type KubeNamespace struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
	// Annotations holds only the address-selection annotations.
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Annotations and labels Tabby puts on the objects it writes.
const (
	// AnnotationOrigin says who wrote an object: OriginKubernetes for what
	// tabby-kube-controllers translates; absent for tabbyctl's.
	AnnotationOrigin = "tabby.dev/origin"
	OriginKubernetes = "kubernetes"
	// OriginAgent marks what tabby-agent writes on its own: its Node when
	// it registers it, a workload's endpoint at CNI ADD outside Kubernetes.
	OriginAgent = "agent"
	// OriginTabbyctl is the origin of an object with no mark: a person
	// wrote it (tabbyctl apply), or a Tabby older than the marks did.
	OriginTabbyctl = "tabbyctl"
	// AnnotationKubeNode, on a Tabby Node, names the Kubernetes Node it
	// belongs to: tabby-kube-controllers deletes only Tabby Nodes so marked
	// when their Kubernetes Node goes away.
	AnnotationKubeNode = "tabby.dev/kubernetes-node"
	// AnnotationTranslationError, on a NetworkPolicy translated from
	// Kubernetes, says why it was written to deny everything it selects.
	AnnotationTranslationError = "tabby.dev/translation-error"
	// AnnotationNoIPAM, on a WorkloadEndpoint, says that its address was
	// given without IPAM (a pod's ipAddrsNoIpam annotation): IPAM's check
	// does not expect an allocation for it.
	AnnotationNoIPAM = "tabby.dev/no-ipam"
	// LabelServiceAccount on a pod's WorkloadEndpoint carries the pod's
	// service account name, so that selectors can match it.
	LabelServiceAccount = "tabby.dev/serviceaccount"
)

// Address-selection annotations on pods and namespaces. Each is accepted
// under Tabby's prefix and under Calico's (cni.projectcalico.org/), so that
// manifests written for Calico keep working; Tabby's wins when both are set.
const (
	AnnotationPrefixTabby  = "tabby.dev/"
	AnnotationPrefixCalico = "cni.projectcalico.org/"

	AnnotationIPv4Pools     = "ipv4pools"     // JSON list of pool names or CIDRs
	AnnotationIPv6Pools     = "ipv6pools"     // JSON list of pool names or CIDRs
	AnnotationIPAddrs       = "ipAddrs"       // JSON list of addresses, assigned through IPAM
	AnnotationIPAddrsNoIPAM = "ipAddrsNoIpam" // JSON list of addresses, bypassing IPAM
)

var addressAnnotations = []string{AnnotationIPv4Pools, AnnotationIPv6Pools, AnnotationIPAddrs, AnnotationIPAddrsNoIPAM}

// IsAddressAnnotation reports whether key is one of the address-selection
// annotations under either prefix.
func IsAddressAnnotation(key string) bool {
	for _, p := range []string{AnnotationPrefixTabby, AnnotationPrefixCalico} {
		if s, ok := strings.CutPrefix(key, p); ok && slices.Contains(addressAnnotations, s) {
			return true
		}
	}
	return false
}

// AddressAnnotations returns the address-selection annotations of a, nil
// when there are none.
func AddressAnnotations(a map[string]string) map[string]string {
	var out map[string]string
	for k, v := range a {
		if IsAddressAnnotation(k) {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// AddressRequest is what a pod's (and its namespace's) annotations ask of
// address assignment. The zero value asks nothing.
type AddressRequest struct {
	// IPv4Pools and IPv6Pools name pools (by name or CIDR) to assign from.
	IPv4Pools, IPv6Pools []string
	// Addrs are specific addresses; NoIPAM says they bypass IPAM.
	Addrs  []netip.Addr
	NoIPAM bool
}

// ErrAddressAnnotation is wrapped by every error of ParseAddressRequest.
var ErrAddressAnnotation = errors.New("invalid address annotation")

func annotation(a map[string]string, name string) (key, val string, ok bool) {
	for _, p := range []string{AnnotationPrefixTabby, AnnotationPrefixCalico} {
		if v, found := a[p+name]; found {
			return p + name, v, true
		}
	}
	return "", "", false
}

// ParseAddressRequest reads the address-selection annotations of a pod and
// of its namespace: pool annotations on the pod win over the namespace's;
// addresses come from the pod only. ipAddrs and ipAddrsNoIpam together are
// an error, as is anything that does not parse.
func ParseAddressRequest(pod, namespace map[string]string) (AddressRequest, error) {
	var r AddressRequest
	var errs []error
	list := func(a map[string]string, name string) ([]string, bool) {
		key, val, ok := annotation(a, name)
		if !ok {
			return nil, false
		}
		l, err := parseStringList(val)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w %s=%q: %v", ErrAddressAnnotation, key, val, err))
			return nil, true
		}
		return l, true
	}
	for _, p := range []struct {
		name string
		dst  *[]string
	}{{AnnotationIPv4Pools, &r.IPv4Pools}, {AnnotationIPv6Pools, &r.IPv6Pools}} {
		if l, ok := list(pod, p.name); ok {
			*p.dst = l
		} else if l, ok := list(namespace, p.name); ok {
			*p.dst = l
		}
	}
	addrs, withIPAM := list(pod, AnnotationIPAddrs)
	noIPAM, withoutIPAM := list(pod, AnnotationIPAddrsNoIPAM)
	if withIPAM && withoutIPAM {
		errs = append(errs, fmt.Errorf("%w: %s and %s are both set: choose one", ErrAddressAnnotation, AnnotationIPAddrs, AnnotationIPAddrsNoIPAM))
	}
	if withoutIPAM {
		addrs, r.NoIPAM = noIPAM, true
	}
	for _, s := range addrs {
		a, err := netip.ParseAddr(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: address %q: %v", ErrAddressAnnotation, s, err))
			continue
		}
		r.Addrs = append(r.Addrs, a.Unmap())
	}
	if err := errors.Join(errs...); err != nil {
		return AddressRequest{}, err
	}
	return r, nil
}

// parseStringList reads a JSON list of strings, as Calico's annotations
// hold them (`["pool-a", "pool-b"]`).
func parseStringList(s string) ([]string, error) {
	var l []string
	if err := json.Unmarshal([]byte(s), &l); err != nil {
		return nil, fmt.Errorf("want a JSON list of strings: %w", err)
	}
	return l, nil
}

// Equal reports whether two pod records hold the same values.
func (p *KubePod) Equal(q *KubePod) bool {
	return p.Namespace == q.Namespace && p.Name == q.Name && p.UID == q.UID && p.Node == q.Node &&
		p.ServiceAccount == q.ServiceAccount && maps.Equal(p.Labels, q.Labels) &&
		maps.Equal(p.Annotations, q.Annotations) && slices.Equal(p.Ports, q.Ports)
}

// EndpointLabels are the labels of a Kubernetes pod's WorkloadEndpoint:
// the pod's labels plus its service account (LabelServiceAccount). The
// agent (at ADD) and tabby-kube-controllers (on changes) both use it, so
// that they agree.
func EndpointLabels(p *KubePod) map[string]string {
	if len(p.Labels) == 0 && p.ServiceAccount == "" {
		return nil
	}
	out := maps.Clone(p.Labels)
	if out == nil {
		out = map[string]string{}
	}
	if p.ServiceAccount != "" {
		out[LabelServiceAccount] = p.ServiceAccount
	}
	return out
}

// Origin says where obj came from: OriginKubernetes for what
// tabby-kube-controllers translated or adopted (Nodes of Kubernetes Nodes,
// the endpoints of pods whose labels they manage), OriginAgent for what the agent wrote on its
// own, else OriginTabbyctl. tabbyctl shows it in an ORIGIN column.
func Origin(obj Object) string {
	m := obj.GetMeta()
	// A Node its agent registered belongs to Kubernetes once the
	// controllers mark it: it goes when the Kubernetes Node goes.
	if _, ok := obj.(*Node); ok && m.Annotations[AnnotationKubeNode] != "" {
		return OriginKubernetes
	}
	if o := m.Annotations[AnnotationOrigin]; o != "" {
		return o
	}
	return OriginTabbyctl
}

// KubeMarker is the value at datastore.KubeMarkerKey: which replica of
// tabby-kube-controllers last became leader, and when.
type KubeMarker struct {
	Identity string    `json:"identity"`
	Since    time.Time `json:"since"`
}
