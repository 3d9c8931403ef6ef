package kube

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/tabbynet/tabby/ipam"
)

// LoadBalancer IPAM: what a Service asks for. See docs/ipam.md.
const (
	// LoadBalancerClass is Tabby's spec.loadBalancerClass. Services of
	// type LoadBalancer with this class or with none get their addresses
	// from Tabby's LoadBalancer pools; others are left to their class's
	// controller.
	LoadBalancerClass = "tabby.dev/lb"

	// Service annotations, under Tabby's prefix (tabby.dev/) or Calico's
	// (projectcalico.org/); Tabby's wins when both are set. Each holds a
	// JSON list (`["198.19.0.10"]`); a comma-separated list is accepted
	// too.
	AnnotationLoadBalancerIPs = "loadBalancerIPs" // specific addresses, at most one per family
	AnnotationLBIPv4Pools     = "ipv4pools"       // LoadBalancer pools (names or CIDRs) for the IPv4 address
	AnnotationLBIPv6Pools     = "ipv6pools"       // likewise for IPv6

	lbPrefixTabby  = "tabby.dev/"
	lbPrefixCalico = "projectcalico.org/"
)

// errLBRequest marks a Service whose request cannot be read: it is
// reported as an event, not retried until the Service changes.
var errLBRequest = errors.New("invalid LoadBalancer request")

// wantsTabbyLB reports whether Tabby assigns the Service's LoadBalancer
// addresses.
func wantsTabbyLB(s *corev1.Service) bool {
	if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return false
	}
	return s.Spec.LoadBalancerClass == nil || *s.Spec.LoadBalancerClass == LoadBalancerClass
}

// lbAnnotation returns the annotation under Tabby's prefix, else Calico's.
func lbAnnotation(a map[string]string, name string) (key, val string, ok bool) {
	for _, p := range []string{lbPrefixTabby, lbPrefixCalico} {
		if v, found := a[p+name]; found {
			return p + name, v, true
		}
	}
	return "", "", false
}

// parseList reads a JSON list of strings or a comma-separated list.
func parseList(v string) ([]string, error) {
	v = strings.TrimSpace(v)
	if strings.HasPrefix(v, "[") {
		var out []string
		if err := json.Unmarshal([]byte(v), &out); err != nil {
			return nil, err
		}
		return out, nil
	}
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out, nil
}

// lbRequest turns a Service into the LoadBalancer IPAM request: families
// from spec.ipFamilies, specific addresses from spec.loadBalancerIP and
// the loadBalancerIPs annotation, pools from the pool annotations, and
// the addresses its status shows as preferred (re-recorded after a
// restart). Problems wrap errLBRequest and name the field.
func lbRequest(s *corev1.Service) (ipam.LBRequest, error) {
	req := ipam.LBRequest{
		Service: ipam.LBService{Namespace: s.Namespace, Name: s.Name},
		UID:     string(s.UID),
		Pools:   map[int][]string{},
	}
	for _, f := range s.Spec.IPFamilies {
		switch f {
		case corev1.IPv4Protocol:
			req.Families = append(req.Families, 4)
		case corev1.IPv6Protocol:
			req.Families = append(req.Families, 6)
		}
	}
	if len(req.Families) == 0 {
		req.Families = []int{4}
	}
	var errs []error
	addAddr := func(field, v string) {
		a, err := netip.ParseAddr(strings.TrimSpace(v))
		if err != nil || a.Zone() != "" {
			errs = append(errs, fmt.Errorf("%s: %q is not an IP address: %w", field, v, errLBRequest))
			return
		}
		a = a.Unmap()
		if !slices.Contains(req.Addrs, a) {
			req.Addrs = append(req.Addrs, a)
		}
	}
	if ip := s.Spec.LoadBalancerIP; ip != "" {
		addAddr("spec.loadBalancerIP", ip)
	}
	if key, v, ok := lbAnnotation(s.Annotations, AnnotationLoadBalancerIPs); ok {
		list, err := parseList(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("annotation %s: %q is not a list of addresses: %w", key, v, errLBRequest))
		}
		for _, ip := range list {
			addAddr("annotation "+key, ip)
		}
	}
	for f, name := range map[int]string{4: AnnotationLBIPv4Pools, 6: AnnotationLBIPv6Pools} {
		key, v, ok := lbAnnotation(s.Annotations, name)
		if !ok {
			continue
		}
		list, err := parseList(v)
		if err != nil || len(list) == 0 {
			errs = append(errs, fmt.Errorf("annotation %s: %q is not a list of pool names or CIDRs: %w", key, v, errLBRequest))
			continue
		}
		req.Pools[f] = list
	}
	for _, in := range s.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(in.IP); err == nil {
			req.Prefer = append(req.Prefer, a.Unmap())
		}
	}
	return req, errors.Join(errs...)
}

// preferDualStack reports whether the Service takes one family when the
// other has no LoadBalancer pool.
func preferDualStack(s *corev1.Service) bool {
	return s.Spec.IPFamilyPolicy != nil && *s.Spec.IPFamilyPolicy == corev1.IPFamilyPolicyPreferDualStack
}

// ingressFor is the status.loadBalancer.ingress for the addresses.
func ingressFor(allocs []ipam.LBAllocation) []corev1.LoadBalancerIngress {
	out := make([]corev1.LoadBalancerIngress, 0, len(allocs))
	for _, a := range allocs {
		out = append(out, corev1.LoadBalancerIngress{IP: a.Addr.String()})
	}
	return out
}

// sameIngress reports whether the Service's status already shows exactly
// the addresses, in order.
func sameIngress(cur, want []corev1.LoadBalancerIngress) bool {
	return slices.EqualFunc(cur, want, func(x, y corev1.LoadBalancerIngress) bool {
		return x.IP == y.IP && x.Hostname == "" && len(x.Ports) == 0
	})
}
