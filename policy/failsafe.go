package policy

import (
	"fmt"
	"strings"

	"github.com/tabbynet/tabby/api"
)

// FailsafeConflicts lists, one sentence each, the failsafe ports a global
// policy would block on the host endpoints it selects if failsafes did not
// exist: a Deny rule that matches the port, or a policy that selects a
// host endpoint without allowing the port to everyone (its end denies
// whatever no later policy allows). Failsafe rules run before any policy,
// so the ports stay open; tabbyctl says so when such a policy is applied.
// A policy that selects no host endpoint conflicts with nothing.
func FailsafeConflicts(g *api.GlobalNetworkPolicy, heps []*api.HostEndpoint, in, out []Failsafe) []string {
	if g == nil || g.Spec.NamespaceSelector != nil || g.Spec.DoNotTrack {
		return nil
	}
	var selected []string
	for _, h := range heps {
		if h != nil && (g.Spec.Selector == nil || g.Spec.Selector.Matches(h.Metadata.Labels)) {
			selected = append(selected, h.Metadata.Name)
		}
	}
	if len(selected) == 0 {
		return nil
	}
	eps := strings.Join(selected, ", ")
	ing, eg := g.AppliesTo()
	var msgs []string
	check := func(dir string, rules []api.Rule, fs []Failsafe, defaultDeny bool) {
		for _, f := range fs {
			what := failsafeBlock(rules, f, defaultDeny)
			if what == "" {
				continue
			}
			msgs = append(msgs, fmt.Sprintf("GlobalNetworkPolicy %s %s failsafe %s port %s/%d on host endpoint(s) %s; the failsafe rules still let it through",
				g.Metadata.Name, what, dir, f.Proto, f.Port, eps))
		}
	}
	if ing {
		// preDNAT policy has no default deny: only its Deny rules block.
		check("inbound", g.Spec.Ingress, in, !g.Spec.PreDNAT)
	}
	if eg && !g.Spec.PreDNAT {
		check("outbound", g.Spec.Egress, out, true)
	}
	return msgs
}

// failsafeBlock walks the rules in order for a packet to the failsafe's
// port from anywhere: "denies" when a Deny rule may match it before a rule
// that allows it from everyone, "does not allow" when none allows it and
// the policy's end would deny it.
func failsafeBlock(rules []api.Rule, f Failsafe, defaultDeny bool) string {
	for _, r := range rules {
		if !ruleMayMatchPort(r, f) {
			continue
		}
		if r.Action == api.ActionDeny {
			return "denies"
		}
		if r.Action == api.ActionAllow && unconditional(r) {
			return ""
		}
	}
	if defaultDeny {
		return "does not allow"
	}
	return ""
}

// ruleMayMatchPort reports whether a rule can match some packet to the
// failsafe's protocol and destination port.
func ruleMayMatchPort(r api.Rule, f Failsafe) bool {
	if r.Protocol != nil && strings.ToLower(*r.Protocol) != f.Proto {
		return false
	}
	if len(r.Destination.Ports) == 0 {
		return true
	}
	for _, p := range r.Destination.Ports {
		if !p.IsString {
			if int(p.IntVal) == int(f.Port) {
				return true
			}
			continue
		}
		if lo, hi, ok := parseRange(p.StrVal); ok {
			if int(f.Port) >= lo && int(f.Port) <= hi {
				return true
			}
			continue
		}
		return true // a named port may be this one
	}
	return false
}

// unconditional reports whether a rule matches every packet to its ports:
// no source or destination restriction but ports.
func unconditional(r api.Rule) bool {
	e := func(x api.EntityRule) bool {
		return x.Selector == nil && x.NamespaceSelector == nil && len(x.Nets) == 0 && len(x.NotNets) == 0
	}
	return e(r.Source) && len(r.Source.Ports) == 0 && e(r.Destination)
}
