package policy

import (
	"fmt"
	"slices"
	"testing"

	"github.com/tabbynet/tabby/api"
)

// benchInput is a node with local of n endpoints in 10 namespaces and 20
// apps, under 100 NetworkPolicies (an app's ingress from another app on a
// port; every third also by namespace; every tenth a named port) and one
// GlobalNetworkPolicy. The remaining endpoints live on other nodes.
func benchInput(n, local int) Input {
	in := Input{Node: "n1", Pools: []*api.IPPool{{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", NATOutgoing: true}}}}
	for i := range n {
		node := "n1"
		if i >= local {
			node = "n2"
		}
		in.Endpoints = append(in.Endpoints, &api.WorkloadEndpoint{
			Metadata: api.ObjectMeta{Name: fmt.Sprintf("w%d", i), Namespace: fmt.Sprintf("ns%d", i%10), Labels: map[string]string{"app": fmt.Sprintf("app%d", i%20)}},
			Spec: api.WorkloadEndpointSpec{Node: node, InterfaceName: fmt.Sprintf("cali%011x", i*2654435761%(1<<40)),
				IPNetworks: []string{fmt.Sprintf("10.244.%d.%d/32", i/250, i%250+1)},
				Ports:      []api.EndpointPort{{Name: "http", Protocol: "TCP", Port: 8080}}},
		})
	}
	for i := range 100 {
		peer := api.NetworkPolicyPeer{PodSelector: sel("app", fmt.Sprintf("app%d", (i+1)%20))}
		if i%3 == 0 {
			peer.NamespaceSelector = sel(NamespaceNameLabel, fmt.Sprintf("ns%d", (i+1)%10))
		}
		port := api.FromInt(int32(8000 + i))
		if i%10 == 9 {
			port = api.FromString("http")
		}
		in.NetworkPolicies = append(in.NetworkPolicies, ingressFrom(fmt.Sprintf("ns%d", i%10), fmt.Sprintf("p%d", i),
			sel("app", fmt.Sprintf("app%d", i%20)), []api.NetworkPolicyPeer{peer}, api.NetworkPolicyPort{Protocol: ptr("TCP"), Port: &port}))
	}
	in.GlobalPolicies = []*api.GlobalNetworkPolicy{gnp("deny-legacy", 10, api.GlobalNetworkPolicySpec{
		Ingress: []api.Rule{{Action: api.ActionDeny, Source: api.EntityRule{Nets: []string{"192.0.2.0/24"}}}},
	})}
	return in
}

// BenchmarkCompile compiles 1,000 endpoints and 100 policies, with all
// endpoints on the node and with 100 of them.
func BenchmarkCompile(b *testing.B) {
	for _, local := range []int{1000, 100} {
		b.Run(fmt.Sprintf("local=%d", local), func(b *testing.B) {
			in := benchInput(1000, local)
			var rs *Ruleset
			for b.Loop() {
				rs = Compile(in)
			}
			rules := 0
			for _, c := range rs.Chains {
				rules += len(c.Rules)
			}
			b.ReportMetric(float64(rules), "rules")
			b.ReportMetric(rs.RulesPerEndpoint(), "rules/endpoint")
		})
	}
}

// BenchmarkCompilerChange compiles, with a long-lived Compiler, 1,000
// local endpoints and 100 policies after one change: a policy's port, a
// pod's labels, a pod added and removed, nothing. Changed objects are new
// objects, as the cluster view delivers them.
func BenchmarkCompilerChange(b *testing.B) {
	in := benchInput(1000, 1000)
	in.Endpoints = slices.Clone(in.Endpoints)
	cc := NewCompiler()
	cc.Compile(in)
	orig, origEP := in.NetworkPolicies[0], in.Endpoints[0]
	all := in.Endpoints
	ops := []struct {
		name   string
		mutate func(i int)
	}{
		{"policy-change", func(i int) {
			if i%2 == 0 {
				cp := *orig
				port := api.FromInt(7000)
				cp.Spec.Ingress = []api.NetworkPolicyIngressRule{{From: orig.Spec.Ingress[0].From, Ports: []api.NetworkPolicyPort{{Protocol: ptr("TCP"), Port: &port}}}}
				in.NetworkPolicies[0] = &cp
			} else {
				in.NetworkPolicies[0] = orig
			}
		}},
		{"label-change", func(i int) {
			cp := *origEP
			cp.Metadata.Labels = map[string]string{"app": fmt.Sprintf("app%d", 10*(1-i%2))}
			in.Endpoints[0] = &cp
		}},
		{"pod-add-del", func(i int) {
			if i%2 == 0 {
				in.Endpoints = all[:len(all)-1]
			} else {
				in.Endpoints = all
			}
		}},
		{"noop", func(int) {}},
	}
	for _, op := range ops {
		b.Run(op.name, func(b *testing.B) {
			i := 0
			for b.Loop() {
				op.mutate(i)
				i++
				cc.Compile(in)
			}
		})
	}
}

// BenchmarkCompileHostEndpoints compiles the node of BenchmarkCompile
// (1,000 local endpoints) plus three host policies (default deny, an
// allow, a preDNAT deny) and the default failsafes, without host endpoints
// (hep=off: the policies select nothing) and with a "*" and an eth0 one
// (hep=on); from scratch and, with a long-lived Compiler, when nothing
// changed.
func BenchmarkCompileHostEndpoints(b *testing.B) {
	for _, hep := range []string{"off", "on"} {
		in := benchInput(1000, 1000)
		{
			labels := map[string]string{"role": "node"}
			if hep == "on" {
				in.HostEndpoints = []*api.HostEndpoint{
					{Metadata: api.ObjectMeta{Name: "n1-auto-hep", Labels: labels}, Spec: api.HostEndpointSpec{Node: "n1", InterfaceName: "*", Profiles: []string{api.DefaultAllowProfile}}},
					{Metadata: api.ObjectMeta{Name: "n1-eth0", Labels: labels}, Spec: api.HostEndpointSpec{Node: "n1", InterfaceName: "eth0"}},
				}
			}
			in.GlobalPolicies = append(slices.Clone(in.GlobalPolicies),
				gnp("hosts-deny", 1000, api.GlobalNetworkPolicySpec{Selector: sel("role", "node"), Types: []api.PolicyType{api.PolicyTypeIngress, api.PolicyTypeEgress}}),
				gnp("hosts-allow", 10, api.GlobalNetworkPolicySpec{Selector: sel("role", "node"),
					Ingress: []api.Rule{{Action: api.ActionAllow, Protocol: ptr("TCP"), Destination: api.EntityRule{Ports: []api.IntOrString{api.FromInt(8080)}}}}}),
				gnp("hosts-nodeport", 10, api.GlobalNetworkPolicySpec{Selector: sel("role", "node"), PreDNAT: true, ApplyOnForward: true,
					Ingress: []api.Rule{{Action: api.ActionDeny, Protocol: ptr("TCP"), Destination: api.EntityRule{Ports: []api.IntOrString{api.FromInt(30080)}}}}}))
			in.FailsafeInbound, in.FailsafeOutbound = FailsafesFrom(api.DefaultFailsafeInbound), FailsafesFrom(api.DefaultFailsafeOutbound)
		}
		b.Run("hep="+hep+"/scratch", func(b *testing.B) {
			for b.Loop() {
				Compile(in)
			}
		})
		b.Run("hep="+hep+"/noop", func(b *testing.B) {
			cc := NewCompiler()
			cc.Compile(in)
			for b.Loop() {
				cc.Compile(in)
			}
		})
	}
}
