package dataplane_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/policy"
)

// withHostPolicies adds to in three GlobalNetworkPolicies for host
// endpoints labelled role=node (a default deny, an allow of 8080 and 9090
// out, a preDNAT deny of a NodePort) and the default failsafes, and, with
// heps, the node's "*" host endpoint and one for eth0 with that label.
func withHostPolicies(in policy.Input, heps bool) policy.Input {
	labels := map[string]string{"role": "node"}
	if heps {
		in.HostEndpoints = []*api.HostEndpoint{
			{Metadata: api.ObjectMeta{Name: in.Node + "-auto-hep", Labels: labels}, Spec: api.HostEndpointSpec{Node: in.Node, InterfaceName: "*", Profiles: []string{api.DefaultAllowProfile}}},
			{Metadata: api.ObjectMeta{Name: in.Node + "-eth0", Labels: labels}, Spec: api.HostEndpointSpec{Node: in.Node, InterfaceName: "eth0"}},
		}
	}
	sel := &api.LabelSelector{MatchLabels: labels}
	tcp := "TCP"
	order := func(o float64) *float64 { return &o }
	port := func(p int32) api.EntityRule { return api.EntityRule{Ports: []api.IntOrString{api.FromInt(p)}} }
	in.GlobalPolicies = append(slices.Clone(in.GlobalPolicies),
		&api.GlobalNetworkPolicy{Metadata: api.ObjectMeta{Name: "hosts-deny"}, Spec: api.GlobalNetworkPolicySpec{Order: order(1000), Selector: sel,
			Types: []api.PolicyType{api.PolicyTypeIngress, api.PolicyTypeEgress}}},
		&api.GlobalNetworkPolicy{Metadata: api.ObjectMeta{Name: "hosts-allow"}, Spec: api.GlobalNetworkPolicySpec{Order: order(10), Selector: sel,
			Ingress: []api.Rule{{Action: api.ActionAllow, Protocol: &tcp, Destination: port(8080)}},
			Egress:  []api.Rule{{Action: api.ActionAllow, Protocol: &tcp, Destination: port(9090)}}}},
		&api.GlobalNetworkPolicy{Metadata: api.ObjectMeta{Name: "hosts-nodeport"}, Spec: api.GlobalNetworkPolicySpec{Order: order(10), Selector: sel,
			PreDNAT: true, ApplyOnForward: true, Ingress: []api.Rule{{Action: api.ActionDeny, Protocol: &tcp, Destination: port(30080)}}}},
	)
	in.FailsafeInbound = policy.FailsafesFrom(api.DefaultFailsafeInbound)
	in.FailsafeOutbound = policy.FailsafesFrom(api.DefaultFailsafeOutbound)
	return in
}

// BenchmarkPrivilegedHostEndpointPass measures the agent's policy pass
// (compile with a long-lived Compiler, then apply) on the node of
// BenchmarkPrivilegedPolicyApply (1,000 local endpoints, 100 policies)
// plus three host policies, without host endpoints (hep=off: the policies
// select nothing) and with two (hep=on), in one run, for each backend:
//
//	policy-change  one NetworkPolicy's port changes
//	noop           nothing changed
func BenchmarkPrivilegedHostEndpointPass(b *testing.B) {
	testkit.RequirePrivileged(b, "ip")
	for _, backend := range []string{"nftables", "iptables-" + dataplane.BackendNFT, "iptables-" + dataplane.BackendLegacy} {
		for _, hep := range []string{"off", "on"} {
			b.Run(fmt.Sprintf("%s/hep=%s", backend, hep), func(b *testing.B) {
				ctx := context.Background()
				ns := testkit.NewNetNS(b, "tbhep-bench")
				var f dataplane.Firewall
				var err error
				if mode, ok := strings.CutPrefix(backend, "iptables-"); ok {
					f, err = dataplane.NewIPTablesFirewall(dataplane.FirewallConfig{NetNS: ns.Path, Backend: mode})
				} else {
					f, err = dataplane.NewNFTFirewall(dataplane.NFTConfig{NetNS: ns.Path})
				}
				if err != nil {
					b.Skip(err)
				}
				in := withHostPolicies(scaleInput(1000), hep == "on")
				in.NetworkPolicies = slices.Clone(in.NetworkPolicies)
				comp := policy.NewCompiler()
				rs := comp.Compile(in)
				if _, err := f.Apply(ctx, toFirewallState(rs)); err != nil {
					b.Fatal(err)
				}
				pass := func(b *testing.B, mutate func(i int)) {
					i := 0
					for b.Loop() {
						mutate(i)
						i++
						if _, err := f.Apply(ctx, toFirewallState(comp.Compile(in))); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(len(rs.Chains)), "chains")
					b.ReportMetric(float64(totalRules(rs)), "rules")
				}
				pol := in.NetworkPolicies[0]
				b.Run("policy-change", func(b *testing.B) {
					pass(b, func(i int) { in.NetworkPolicies[0] = withPort(pol, int32(7000+i%2)) })
				})
				b.Run("noop", func(b *testing.B) { pass(b, func(int) {}) })
				if err := f.Remove(ctx); err != nil {
					b.Error(err)
				}
			})
		}
	}
}
