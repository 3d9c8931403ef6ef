package ctl

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/tabbynet/tabby/api"
)

// How tabbyctl tells what becomes of Service addresses: `get services`
// from the Service records and every agent's published decisions
// (api.AgentStatus.Services), `node status` one node's decisions, and
// `explain pod` the Services whose ready endpoints include the pod.

// serviceAds indexes the agents' decisions by prefix.
type serviceAds struct {
	// from lists, per prefix, the nodes that advertise it, sorted.
	from map[netip.Prefix][]string
	// refused lists, per Service and prefix, why nodes refuse it (each
	// reason once, with the nodes that gave it).
	refused map[string]map[netip.Prefix]map[string][]string
	// why lists, per Service and prefix, why nodes do not advertise it
	// when they do not refuse it either (a Local Service without an
	// endpoint there, a kind not configured).
	why map[string]map[netip.Prefix][]string
	// nodes that publish status at all.
	nodes int
}

func indexServiceAds(statuses map[string]api.AgentStatus) serviceAds {
	ix := serviceAds{from: map[netip.Prefix][]string{}, refused: map[string]map[netip.Prefix]map[string][]string{},
		why: map[string]map[netip.Prefix][]string{}}
	for node, st := range statuses {
		ix.nodes++
		for _, d := range st.Services {
			p, err := netip.ParsePrefix(d.Prefix)
			if err != nil {
				continue
			}
			switch {
			case d.Advertised:
				ix.from[p] = append(ix.from[p], node)
			case d.Refused:
				if ix.refused[d.Service] == nil {
					ix.refused[d.Service] = map[netip.Prefix]map[string][]string{}
				}
				if ix.refused[d.Service][p] == nil {
					ix.refused[d.Service][p] = map[string][]string{}
				}
				ix.refused[d.Service][p][d.Reason] = append(ix.refused[d.Service][p][d.Reason], node)
			case d.Reason != "":
				if ix.why[d.Service] == nil {
					ix.why[d.Service] = map[netip.Prefix][]string{}
				}
				if !slices.Contains(ix.why[d.Service][p], d.Reason) {
					ix.why[d.Service][p] = append(ix.why[d.Service][p], d.Reason)
				}
			}
		}
	}
	for p := range ix.from {
		slices.Sort(ix.from[p])
	}
	return ix
}

// nodesText says which nodes advertise p.
func (ix serviceAds) nodesText(p netip.Prefix) string {
	ns := ix.from[p]
	if len(ns) == 0 {
		return "no node"
	}
	if len(ns) == ix.nodes && ix.nodes > 1 {
		return fmt.Sprintf("all %d nodes", len(ns))
	}
	return strings.Join(ns, ",")
}

// coveringRange is the advertised serviceClusterIPs range holding a, if
// any node advertises one.
func (ix serviceAds) coveringRange(a netip.Addr) (netip.Prefix, bool) {
	var best netip.Prefix
	for p := range ix.from {
		if p.Contains(a) && p.Bits() < a.BitLen() && (!best.IsValid() || p.Bits() > best.Bits()) {
			best = p
		}
	}
	return best, best.IsValid()
}

// addrFate is what becomes of one address of a Service.
type addrFate struct {
	addr       netip.Addr
	kind       string // clusterIP, externalIP, loadBalancerIP
	advertised bool
	text       string // "from n1,n2", "REFUSED: …", "not advertised: …"
}

func (f addrFate) String() string { return fmt.Sprintf("%s (%s): %s", f.addr, f.kind, f.text) }

// fates tells what becomes of each address of s, from the agents'
// decisions.
func (ix serviceAds) fates(s *api.Service) []addrFate {
	name := s.Metadata.Namespace + "/" + s.Metadata.Name
	var out []addrFate
	for _, a := range api.ServiceAddrs(s.Spec.ClusterIPs) {
		f := addrFate{addr: a, kind: "clusterIP", text: "not advertised: no serviceClusterIPs range holds it"}
		if r, ok := ix.coveringRange(a); ok {
			f.advertised, f.text = true, fmt.Sprintf("in %s from %s", r, ix.nodesText(r))
		} else {
			var why []string
			for r, reasons := range ix.refused[""] { // refused ranges
				if r.Contains(a) {
					for reason := range reasons {
						why = append(why, reason)
					}
				}
			}
			if len(why) > 0 {
				slices.Sort(why)
				f.text = "REFUSED: " + strings.Join(slices.Compact(why), "; ")
			}
		}
		out = append(out, f)
	}
	for _, l := range []struct {
		kind  string
		addrs []string
	}{{"externalIP", s.Spec.ExternalIPs}, {"loadBalancerIP", s.Spec.LoadBalancerIPs}} {
		for _, a := range api.ServiceAddrs(l.addrs) {
			p := netip.PrefixFrom(a, a.BitLen())
			f := addrFate{addr: a, kind: l.kind}
			reasons := ix.refused[name][p]
			switch {
			case len(reasons) > 0:
				var rs []string
				for r, nodes := range reasons {
					slices.Sort(nodes)
					rs = append(rs, fmt.Sprintf("%s (on %s)", r, strings.Join(nodes, ",")))
				}
				slices.Sort(rs)
				f.text = "REFUSED: " + strings.Join(rs, "; ")
			case len(ix.from[p]) > 0:
				f.advertised, f.text = true, "from "+ix.nodesText(p)
			case len(ix.why[name][p]) > 0:
				why := slices.Clone(ix.why[name][p])
				slices.Sort(why)
				f.text = "not advertised: " + strings.Join(why, "; ")
			case s.Local() && len(s.Spec.EndpointNodes) == 0:
				f.text = "not advertised: externalTrafficPolicy Local and no ready endpoint"
			default:
				f.text = "not advertised by any node publishing status"
			}
			out = append(out, f)
		}
	}
	return out
}

// serviceRow is the table row of a Service record.
func serviceRow(s *api.Service, ix serviceAds) (cells, wide []string) {
	policy := s.Spec.ExternalTrafficPolicy
	if policy == "" {
		policy = api.TrafficPolicyCluster
	}
	var adv, not []string
	for _, f := range ix.fates(s) {
		if f.advertised {
			adv = append(adv, f.addr.String()+" "+f.text)
		} else {
			not = append(not, f.addr.String()+": "+f.text)
		}
	}
	return []string{s.Metadata.Namespace, s.Metadata.Name, orNone(s.Spec.Type), policy,
			orNone(strings.Join(adv, "; ")), orNone(strings.Join(not, "; "))},
		[]string{orNone(strings.Join(s.Spec.ClusterIPs, ",")), orNone(strings.Join(s.Spec.EndpointNodes, ","))}
}

// serviceStatusLines are one node's Service decisions for node status.
func serviceStatusLines(st api.AgentStatus) []string {
	var out []string
	for _, d := range st.Services {
		what := d.Kind
		if d.Service != "" {
			what += " of " + d.Service
		}
		state := "advertised"
		switch {
		case d.Refused:
			state = "REFUSED: " + d.Reason
		case !d.Advertised:
			state = "not advertised: " + d.Reason
		}
		out = append(out, fmt.Sprintf("%-20s %s, %s", d.Prefix, what, state))
	}
	return out
}

// servicesOf are the Service records whose ready endpoints include one of
// addrs, by namespace and name.
func servicesOf(svcs []*api.Service, addrs []netip.Addr) []*api.Service {
	var out []*api.Service
	for _, s := range svcs {
		eps := api.ServiceAddrs(s.Spec.EndpointAddresses)
		if slices.ContainsFunc(addrs, func(a netip.Addr) bool { return slices.Contains(eps, a.Unmap()) }) {
			out = append(out, s)
		}
	}
	return out
}
