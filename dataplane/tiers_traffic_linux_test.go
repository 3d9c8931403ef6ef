package dataplane_test

import (
	"context"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/policy"
)

func TestPrivilegedTiersNFTables(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	node, _, client, server, cspec, sspec := twoPods(t, "w17")
	tiersTraffic(t, newNFT(t, node, 0), client, server, cspec, sspec)
}

func TestPrivilegedTiersIPTables(t *testing.T) {
	testkit.RequirePrivileged(t, "ip", "iptables", "ipset")
	for _, b := range []string{dataplane.BackendLegacy, dataplane.BackendNFT} {
		t.Run(b, func(t *testing.T) {
			node, _, client, server, cspec, sspec := twoPods(t, "w18")
			f, err := dataplane.NewIPTablesFirewall(dataplane.FirewallConfig{NetNS: node.Path, Backend: b, Resync: -1})
			if err != nil {
				t.Skipf("iptables backend %s: %v", b, err)
			}
			tiersTraffic(t, f, client, server, cspec, sspec)
		})
	}
}

// tiersTraffic checks tier semantics with real TCP connections between two
// pods of one node, each step applied by a long-lived Compiler and checked
// against a fresh compile: an admin Deny overrides a namespace Allow, Pass
// hands over to the next tier, a baseline Deny yields to a namespace Allow
// but applies without one, a staged Deny counts without dropping.
func tiersTraffic(t *testing.T, f dataplane.Firewall, client, server testkit.NetNS, cspec, sspec dataplane.WorkloadSpec) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	srv := sspec.Addrs[0].Addr().String() + ":8080"
	serve(t, server, srv)
	ns := "tiers"
	ep := func(name, app string, s dataplane.WorkloadSpec) *api.WorkloadEndpoint {
		return &api.WorkloadEndpoint{
			Metadata: api.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": app}},
			Spec:     api.WorkloadEndpointSpec{Node: "n1", InterfaceName: s.HostIfName, IPNetworks: []string{s.Addrs[0].String()}},
		}
	}
	port := api.FromInt(8080)
	allow := &api.NetworkPolicy{Metadata: api.ObjectMeta{Namespace: ns, Name: "allow-client"}, Spec: api.NetworkPolicySpec{
		PodSelector: api.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
		Ingress: []api.NetworkPolicyIngressRule{{From: []api.NetworkPolicyPeer{{PodSelector: &api.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
			Ports: []api.NetworkPolicyPort{{Port: &port}}}},
	}}
	allow.SetDefaults()
	gnp := func(tier, name string, order float64, action string) *api.GlobalNetworkPolicy {
		return &api.GlobalNetworkPolicy{Metadata: api.ObjectMeta{Name: name}, Spec: api.GlobalNetworkPolicySpec{
			Tier: tier, Order: &order, Selector: &api.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			Ingress: []api.Rule{{Action: action, Source: api.EntityRule{Selector: &api.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}}},
		}}
	}
	in := policy.Input{Node: "n1", Tiers: api.EffectiveTiers(nil),
		Endpoints: []*api.WorkloadEndpoint{ep("client", "client", cspec), ep("server", "server", sspec)},
		Pools:     []*api.IPPool{{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16"}}}}
	comp := policy.NewCompiler()
	staged := &api.StagedGlobalNetworkPolicy{Metadata: api.ObjectMeta{Name: "try-deny"}, Spec: gnp("", "x", 1, api.ActionDeny).Spec}
	for i, step := range []struct {
		name   string
		nps    []*api.NetworkPolicy
		gnps   []*api.GlobalNetworkPolicy
		staged []*api.StagedGlobalNetworkPolicy
		want   bool
		// decides names the policy (and action) whose rule's counter the
		// connection must move.
		decides, action string
	}{
		{"namespace Allow", []*api.NetworkPolicy{allow}, nil, nil, true, "allow-client", api.ActionAllow},
		{"admin Deny overrides it", []*api.NetworkPolicy{allow}, []*api.GlobalNetworkPolicy{gnp(api.TierKubeAdmin, "admin-deny", 1, api.ActionDeny)}, nil, false, "admin-deny", api.ActionDeny},
		{"admin Pass hands over, skipping a later admin Deny", []*api.NetworkPolicy{allow},
			[]*api.GlobalNetworkPolicy{gnp(api.TierKubeAdmin, "admin-pass", 1, api.ActionPass), gnp(api.TierKubeAdmin, "admin-deny", 2, api.ActionDeny)}, nil, true, "allow-client", api.ActionAllow},
		{"baseline Deny yields to the namespace Allow", []*api.NetworkPolicy{allow}, []*api.GlobalNetworkPolicy{gnp(api.TierKubeBaseline, "base-deny", 1, api.ActionDeny)}, nil, true, "allow-client", api.ActionAllow},
		{"baseline Deny without a namespace policy", nil, []*api.GlobalNetworkPolicy{gnp(api.TierKubeBaseline, "base-deny", 1, api.ActionDeny)}, nil, false, "base-deny", api.ActionDeny},
		{"staged Deny counts, drops nothing", nil, nil, []*api.StagedGlobalNetworkPolicy{staged}, true, "try-deny", api.ActionDeny},
	} {
		in.NetworkPolicies, in.GlobalPolicies, in.StagedPolicies = step.nps, step.gnps, step.staged
		applyChecked(ctx, t, f, comp, in, step.name)
		before := decidingCount(ctx, t, f, step.decides, step.action)
		if got := dials(t, client, srv); got != step.want {
			t.Errorf("step %d (%s): connected %v, want %v", i, step.name, got, step.want)
		}
		if after := decidingCount(ctx, t, f, step.decides, step.action); after <= before {
			t.Errorf("step %d (%s): the counter of %s's %s rule did not move (%d, then %d)", i, step.name, step.decides, step.action, before, after)
		}
	}
	if err := f.Remove(ctx); err != nil {
		t.Fatal(err)
	}
}

// decidingCount is the packet count of the rules of policy name with
// action on a firewall with rule counters (both backends have them).
func decidingCount(ctx context.Context, t *testing.T, f dataplane.Firewall, name, action string) uint64 {
	t.Helper()
	rc, ok := f.(interface {
		RuleCounters(context.Context) ([]dataplane.RuleCounter, error)
	})
	if !ok {
		t.Fatalf("%T reads no rule counters", f)
	}
	counters, err := rc.RuleCounters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, c := range counters {
		if c.Origin.Name == name && c.Origin.Action == action {
			n += c.Packets
		}
	}
	return n
}

// applyChecked applies what comp compiles from in, then checks that a
// fresh compile would change nothing in the kernel.
func applyChecked(ctx context.Context, t *testing.T, f dataplane.Firewall, comp *policy.Compiler, in policy.Input, step string) {
	t.Helper()
	if _, err := f.Apply(ctx, *comp.Compile(in)); err != nil {
		t.Fatalf("%s: apply: %v", step, err)
	}
	if df, ok := f.(interface {
		Diff(context.Context, dataplane.FirewallState) ([]string, error)
	}); ok {
		if d, err := df.Diff(ctx, *policy.Compile(in)); err != nil || len(d) > 0 {
			t.Fatalf("%s: kernel differs from a fresh compile: %v %v", step, d, err)
		}
	} else if st, err := f.Apply(ctx, *policy.Compile(in)); err != nil || st.Changed() {
		t.Fatalf("%s: a fresh compile changes the kernel: %+v %v", step, st, err)
	}
}
