package kube

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/tabbynet/tabby/api"
)

// ReasonAdvertRefused is the Warning event on a Service with an external
// or LoadBalancer address outside the cluster's serviceExternalIPs or
// serviceLoadBalancerIPs: no node advertises it (docs/bgp.md, "Services").
const ReasonAdvertRefused = "ServiceAddressNotAdvertised"

// refusedState remembers, per "<ns>/<name>", the refusal last reported,
// so that an unchanged one is not reported on every sync (the sweep
// resyncs every Service).
type refusedState struct {
	mu   sync.Mutex
	last map[string]string
}

// RefusedServiceAddrs lists why addresses of the record rec are refused
// by the cluster's BGPConfiguration cfg (nil: none): an external IP
// outside serviceExternalIPs, a LoadBalancer IP outside
// serviceLoadBalancerIPs, when ranges of that kind are configured (none
// configured means the kind is not advertised, not a mistake). The reasons
// read as the agents' (bgp.ServiceDecisions). A node's own
// BGPConfiguration narrowing the ranges is that node's choice and not
// reported here. It is pure; the result is sorted, once each.
func RefusedServiceAddrs(rec *api.Service, cfg *api.BGPConfiguration) []string {
	if rec == nil || cfg == nil {
		return nil
	}
	var out []string
	check := func(field string, addrs []string, cidrs []api.ServiceCIDR) {
		ranges := api.ServicePrefixes(cidrs)
		if len(ranges) == 0 {
			return
		}
		for _, a := range api.ServiceAddrs(addrs) {
			if !slices.ContainsFunc(ranges, func(r netip.Prefix) bool { return r.Contains(a) }) {
				out = append(out, fmt.Sprintf("%s is outside %s %v", a, field, ranges))
			}
		}
	}
	check("serviceExternalIPs", rec.Spec.ExternalIPs, cfg.Spec.ServiceExternalIPs)
	check("serviceLoadBalancerIPs", rec.Spec.LoadBalancerIPs, cfg.Spec.ServiceLoadBalancerIPs)
	slices.Sort(out)
	return slices.Compact(out)
}

// reportRefused puts a Warning event on s when the addresses its record
// rec would advertise are refused, once per distinct refusal; nil s
// (the Service is gone) forgets it.
func (c *controller) reportRefused(ns, name string, s *corev1.Service, rec *api.Service) {
	k := ns + "/" + name
	msg := ""
	if s != nil {
		if rs := RefusedServiceAddrs(rec, c.view.BGPConfiguration()); len(rs) > 0 {
			msg = "not advertised over BGP: " + strings.Join(rs, "; ")
		}
	}
	c.refused.mu.Lock()
	prev := c.refused.last[k]
	if msg == "" {
		delete(c.refused.last, k)
	} else {
		c.refused.last[k] = msg
	}
	c.refused.mu.Unlock()
	if msg == "" || msg == prev {
		return
	}
	c.log.Warn("Service address not advertised", "namespace", ns, "name", name, "reason", msg)
	c.lb.events.Event(s, corev1.EventTypeWarning, ReasonAdvertRefused, msg)
}
