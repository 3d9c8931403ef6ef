package policy

import (
	"slices"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/api"
)

// tiered is a GlobalNetworkPolicy of tier with ingress rules, selecting
// the pods app=<app>.
func tiered(tier, name string, order float64, app string, rules ...api.Rule) *api.GlobalNetworkPolicy {
	g := gnp(name, order, api.GlobalNetworkPolicySpec{Tier: tier, Selector: sel("app", app), Ingress: rules})
	return g
}

func ruleFrom(action, app string) api.Rule {
	return api.Rule{Action: action, Source: api.EntityRule{Selector: sel("app", app)}}
}

var allowClientToWeb = ingressFrom("prod", "allow-client", sel("app", "web"),
	[]api.NetworkPolicyPeer{{PodSelector: sel("app", "client")}}, tcpPort(80))

func TestTierSemantics(t *testing.T) {
	deny := api.Rule{Action: api.ActionDeny}
	tests := []struct {
		name  string
		c     cluster
		cases []reachCase
	}{
		{"admin Deny overrides a namespace Allow", cluster{
			nps:  []*api.NetworkPolicy{allowClientToWeb},
			gnps: []*api.GlobalNetworkPolicy{tiered(api.TierKubeAdmin, "admin-deny", 1, "web", ruleFrom(api.ActionDeny, "client"))},
		}, []reachCase{{"pclient", "pweb", "tcp", 80, false}, {"pdb", "pweb", "tcp", 80, false}}},
		{"namespace Allow without admin policy", cluster{
			nps: []*api.NetworkPolicy{allowClientToWeb},
		}, []reachCase{{"pclient", "pweb", "tcp", 80, true}, {"pdb", "pweb", "tcp", 80, false}}},
		{"baseline Deny yields to a namespace Allow", cluster{
			nps: []*api.NetworkPolicy{allowClientToWeb},
			gnps: []*api.GlobalNetworkPolicy{
				gnp("baseline-deny", 1, api.GlobalNetworkPolicySpec{Tier: api.TierKubeBaseline, Ingress: []api.Rule{deny}}),
			},
		}, []reachCase{{"pclient", "pweb", "tcp", 80, true}, {"pclient", "pdb", "tcp", 80, false}, {"pclient", "dweb", "tcp", 80, false}}},
		{"Pass hands over to the next tier", cluster{
			gnps: []*api.GlobalNetworkPolicy{
				tiered(api.TierKubeAdmin, "a-pass", 1, "web", ruleFrom(api.ActionPass, "client")),
				tiered(api.TierKubeAdmin, "b-deny", 2, "web", deny),
			},
		}, []reachCase{{"pclient", "pweb", "tcp", 80, true}, {"dclient", "pweb", "tcp", 80, true}, {"pdb", "pweb", "tcp", 80, false}}},
		{"Pass skips the rest of tier default, its NetworkPolicies and default deny", cluster{
			nps:  []*api.NetworkPolicy{denyAllIngress("prod")},
			gnps: []*api.GlobalNetworkPolicy{tiered(api.TierDefault, "pass", 1, "web", ruleFrom(api.ActionPass, "client"))},
		}, []reachCase{{"pclient", "pweb", "tcp", 80, true}, {"pdb", "pweb", "tcp", 80, false}, {"pclient", "pdb", "tcp", 80, false}}},
		{"a Deny tier ends with its default action", cluster{
			tiers: []*api.Tier{{Metadata: api.ObjectMeta{Name: "security"}, Spec: api.TierSpec{Order: ptr(100.0)}}},
			gnps: []*api.GlobalNetworkPolicy{tiered("security", "only-81", 1, "web",
				api.Rule{Action: api.ActionAllow, Protocol: ptr("TCP"), Destination: api.EntityRule{Ports: []api.IntOrString{api.FromInt(81)}}})},
		}, []reachCase{{"pclient", "pweb", "tcp", 81, true}, {"pclient", "pweb", "tcp", 80, false}, {"pclient", "pdb", "tcp", 80, true}}},
		{"a Pass tier hands over at its end", cluster{
			tiers: []*api.Tier{{Metadata: api.ObjectMeta{Name: "security"}, Spec: api.TierSpec{Order: ptr(100.0), DefaultAction: api.ActionPass}}},
			nps:   []*api.NetworkPolicy{denyAllIngress("prod")},
			gnps: []*api.GlobalNetworkPolicy{tiered("security", "only-81", 1, "web",
				api.Rule{Action: api.ActionAllow, Protocol: ptr("TCP"), Destination: api.EntityRule{Ports: []api.IntOrString{api.FromInt(81)}}})},
		}, []reachCase{{"pclient", "pweb", "tcp", 81, true}, {"pclient", "pweb", "tcp", 80, false}}},
		{"a policy of a missing tier is ignored whole", cluster{
			gnps: []*api.GlobalNetworkPolicy{tiered("nope", "lost", 1, "web", deny)},
		}, []reachCase{{"pclient", "pweb", "tcp", 80, true}}},
		{"a staged Deny counts without dropping", cluster{
			staged: []*api.StagedGlobalNetworkPolicy{{Metadata: api.ObjectMeta{Name: "try"},
				Spec: api.GlobalNetworkPolicySpec{Tier: api.TierKubeAdmin, Selector: sel("app", "web"), Ingress: []api.Rule{deny}}}},
		}, []reachCase{{"pclient", "pweb", "tcp", 80, true}, {"dclient", "pweb", "tcp", 80, true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, rc := range tt.cases {
				if got := tt.c.reach(t, rc.src, rc.dst, rc.proto, rc.port); got != rc.want {
					t.Errorf("%s -> %s %s/%d: reach = %v, want %v", rc.src, rc.dst, rc.proto, rc.port, got, rc.want)
				}
			}
		})
	}
}

// Admin and baseline policies that select nothing on a node leave its
// endpoint chains exactly as they were: the truth tables of Kubernetes
// NetworkPolicy hold with them present.
func TestTiersNotSelectingLeaveChainsAlone(t *testing.T) {
	base := cluster{nps: []*api.NetworkPolicy{allowClientToWeb, denyAllEgress("dev")}}
	withAdmin := base
	withAdmin.gnps = []*api.GlobalNetworkPolicy{
		gnp("admin-other", 1, api.GlobalNetworkPolicySpec{Tier: api.TierKubeAdmin, NamespaceSelector: sel("team", "nobody"), Ingress: []api.Rule{{Action: api.ActionDeny}}}),
		gnp("baseline-other", 1, api.GlobalNetworkPolicySpec{Tier: api.TierKubeBaseline, Selector: sel("app", "none"), Egress: []api.Rule{{Action: api.ActionDeny}}}),
	}
	for _, node := range []string{"n1", "n2"} {
		a, b := Compile(base.input(node)), Compile(withAdmin.input(node))
		for _, ch := range a.Chains {
			if !strings.HasPrefix(ch.Name, "tabby-tw-") && !strings.HasPrefix(ch.Name, "tabby-fw-") {
				continue
			}
			i := slices.IndexFunc(b.Chains, func(o Chain) bool { return o.Name == ch.Name })
			if i < 0 || !ch.Equal(b.Chains[i]) {
				t.Errorf("%s: chain %s changed with admin policies that select nothing", node, ch.Name)
			}
		}
	}
}

func TestStagedRulesOnlyCount(t *testing.T) {
	c := cluster{staged: []*api.StagedGlobalNetworkPolicy{{Metadata: api.ObjectMeta{Name: "try"},
		Spec: api.GlobalNetworkPolicySpec{Selector: sel("app", "web"), Ingress: []api.Rule{ruleFrom(api.ActionDeny, "client"), {Action: api.ActionAllow}}}}}}
	rs := Compile(c.input("n1"))
	var staged []string
	for _, ch := range rs.Chains {
		for _, r := range ch.Rules {
			if r.Origin == nil || !r.Origin.Staged {
				continue
			}
			if r.Verdict.Kind != VerdictReturn {
				t.Errorf("staged rule %s in %s does not just return", r, ch.Name)
			}
			staged = append(staged, r.Origin.String())
		}
	}
	want := []string{"default/StagedGlobalNetworkPolicy//try/ingress/0/Deny/staged", "default/StagedGlobalNetworkPolicy//try/ingress/1/Allow/staged"}
	for _, w := range want {
		if !slices.Contains(staged, w) {
			t.Errorf("no staged rule with origin %s; have %v", w, staged)
		}
	}
}

// The Compiler recompiles only what a tiered change touches, and gives the
// same result as Compile.
func TestCompilerTiersIncremental(t *testing.T) {
	c := cluster{nps: []*api.NetworkPolicy{allowClientToWeb},
		gnps: []*api.GlobalNetworkPolicy{tiered(api.TierKubeAdmin, "a-pass", 1, "web", ruleFrom(api.ActionPass, "client"))}}
	cc := NewCompiler()
	in1 := c.input("n1")
	first := cc.Compile(in1)
	c2 := c
	c2.staged = []*api.StagedGlobalNetworkPolicy{{Metadata: api.ObjectMeta{Name: "try"}, Spec: api.GlobalNetworkPolicySpec{Selector: sel("app", "db"), Ingress: []api.Rule{{Action: api.ActionDeny}}}}}
	in := c2.input("n1")
	in.Endpoints = in1.Endpoints
	second := cc.Compile(in)
	if !second.Equal(Compile(in)) {
		t.Fatal("Compiler and Compile differ")
	}
	// pweb's chains did not change (the staged policy selects db pods):
	// they are the very same rules.
	for _, name := range []string{"tabby-tw-calipweb", "tabby-ti0-calipweb"} {
		a := slices.IndexFunc(first.Chains, func(o Chain) bool { return o.Name == name })
		b := slices.IndexFunc(second.Chains, func(o Chain) bool { return o.Name == name })
		if a < 0 || b < 0 || !SameSlice(first.Chains[a].Rules, second.Chains[b].Rules) {
			t.Errorf("chain %s not shared between passes (%d, %d)", name, a, b)
		}
	}
}
