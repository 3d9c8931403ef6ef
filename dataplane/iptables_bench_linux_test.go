package dataplane_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/policy"
)

// scaleInput is a cluster of n endpoints, all on node "n1", in 10
// namespaces with 20 app labels, under 100 NetworkPolicies (10 per
// namespace: an app's ingress from another app on a port, every third also
// from a namespace) and one GlobalNetworkPolicy.
func scaleInput(n int) policy.Input {
	in := policy.Input{Node: "n1", Pools: []*api.IPPool{{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", NATOutgoing: true}}}}
	for i := range n {
		ns := fmt.Sprintf("ns%d", i%10)
		in.Endpoints = append(in.Endpoints, &api.WorkloadEndpoint{
			Metadata: api.ObjectMeta{Name: fmt.Sprintf("w%d", i), Namespace: ns, Labels: map[string]string{"app": fmt.Sprintf("app%d", i%20)}},
			Spec: api.WorkloadEndpointSpec{Node: "n1", InterfaceName: dataplane.HostIfName(fmt.Sprint(i)),
				IPNetworks: []string{fmt.Sprintf("10.244.%d.%d/32", i/250, i%250+1)},
				Ports:      []api.EndpointPort{{Name: "http", Protocol: "TCP", Port: 8080}}},
		})
	}
	for i := range 100 {
		ns := fmt.Sprintf("ns%d", i%10)
		peer := api.NetworkPolicyPeer{PodSelector: &api.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app%d", (i+1)%20)}}}
		if i%3 == 0 {
			peer.NamespaceSelector = &api.LabelSelector{MatchLabels: map[string]string{policy.NamespaceNameLabel: fmt.Sprintf("ns%d", (i+1)%10)}}
		}
		port := api.IntOrString{IntVal: int32(8000 + i)}
		if i%10 == 9 {
			port = api.IntOrString{IsString: true, StrVal: "http"}
		}
		in.NetworkPolicies = append(in.NetworkPolicies, &api.NetworkPolicy{
			Metadata: api.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("p%d", i)},
			Spec: api.NetworkPolicySpec{
				PodSelector: api.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app%d", i%20)}},
				Ingress:     []api.NetworkPolicyIngressRule{{From: []api.NetworkPolicyPeer{peer}, Ports: []api.NetworkPolicyPort{{Port: &port}}}},
			},
		})
	}
	order := 10.0
	in.GlobalPolicies = []*api.GlobalNetworkPolicy{{Metadata: api.ObjectMeta{Name: "deny-legacy"}, Spec: api.GlobalNetworkPolicySpec{
		Order: &order, Ingress: []api.Rule{{Action: api.ActionDeny, Source: api.EntityRule{Nets: []string{"192.0.2.0/24"}}}},
	}}}
	for _, p := range in.NetworkPolicies {
		p.SetDefaults()
	}
	for _, g := range in.GlobalPolicies {
		g.SetDefaults()
	}
	return in
}

func toFirewallState(rs *policy.Ruleset) dataplane.FirewallState { return *rs }

func totalRules(rs *policy.Ruleset) int {
	n := 0
	for _, c := range rs.Chains {
		n += len(c.Rules)
	}
	return n
}

// BenchmarkPrivilegedPolicyApply measures a full compile+apply pass on a
// node with 1,000 local endpoints and 100 policies, in a namespace of its
// own, for each backend (native nftables, iptables-nft, iptables-legacy):
//
//	policy-change  one policy's port changes (its chain is rewritten)
//	label-change   one pod's labels change (sets and its chains)
//	pod-add-del    a pod comes or goes (its chains, dispatch, sets)
//	noop           nothing changed (compile, diff, write nothing)
//	rule-counters  one read of the per-rule counters (a metrics scrape)
//
// Every operation includes compiling with a long-lived policy.Compiler, as
// the agent does; changed objects are new objects, as the cluster view
// delivers them. Between kernel reads (FirewallConfig.Resync) Apply diffs
// against its record of what it wrote.
func BenchmarkPrivilegedPolicyApply(b *testing.B) {
	testkit.RequirePrivileged(b, "ip")
	for _, backend := range []string{"nftables", "iptables-" + dataplane.BackendNFT, "iptables-" + dataplane.BackendLegacy} {
		b.Run(backend, func(b *testing.B) {
			ctx := context.Background()
			ns := testkit.NewNetNS(b, "tbdp-w16bench")
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
			in := scaleInput(1000)
			in.Endpoints = slices.Clone(in.Endpoints)
			in.NetworkPolicies = slices.Clone(in.NetworkPolicies)
			comp := policy.NewCompiler()
			rs := comp.Compile(in)
			start := time.Now()
			st, err := f.Apply(ctx, toFirewallState(rs))
			if err != nil {
				b.Fatal(err)
			}
			b.Logf("%s: initial apply of %d chains, %d rules, %d sets (%d members): %v; %.1f rules per endpoint",
				backend, len(rs.Chains), totalRules(rs), len(rs.Sets), st.MembersAdded, time.Since(start), rs.RulesPerEndpoint())
			if st.ChainsWritten < len(rs.Chains) {
				b.Fatalf("initial apply wrote %d chains of %d", st.ChainsWritten, len(rs.Chains))
			}
			pass := func(b *testing.B, mutate func(i int)) {
				i := 0
				var st dataplane.ApplyStats
				for b.Loop() {
					mutate(i)
					i++
					if st, err = f.Apply(ctx, toFirewallState(comp.Compile(in))); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(st.ChainsWritten), "chains-written")
				b.ReportMetric(float64(st.MembersAdded+st.MembersRemoved), "members-changed")
				b.ReportMetric(rs.RulesPerEndpoint(), "rules/endpoint")
				b.ReportMetric(float64(totalRules(rs)), "rules")
			}
			pol, ep := in.NetworkPolicies[0], in.Endpoints[0]
			b.Run("policy-change", func(b *testing.B) {
				pass(b, func(i int) { in.NetworkPolicies[0] = withPort(pol, int32(7000+i%2)) })
			})
			b.Run("label-change", func(b *testing.B) {
				// app0 and app10 are each selected by five policies in ns0.
				pass(b, func(i int) { in.Endpoints[0] = withLabel(ep, fmt.Sprintf("app%d", 10*(1-i%2))) })
			})
			all := in.Endpoints
			b.Run("pod-add-del", func(b *testing.B) {
				pass(b, func(i int) {
					if i%2 == 0 {
						in.Endpoints = all[:len(all)-1]
					} else {
						in.Endpoints = all
					}
				})
			})
			in.Endpoints = all
			b.Run("noop", func(b *testing.B) { pass(b, func(int) {}) })
			// One read of every rule's counter (a metrics scrape).
			b.Run("rule-counters", func(b *testing.B) {
				rc := f.(interface {
					RuleCounters(context.Context) ([]dataplane.RuleCounter, error)
				})
				var cs []dataplane.RuleCounter
				for b.Loop() {
					if cs, err = rc.RuleCounters(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(cs)), "origins")
			})
			if err := f.Remove(ctx); err != nil {
				b.Error(err)
			}
		})
	}
}
