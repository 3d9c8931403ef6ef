package policy

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
)

// TestOrigins: every rule compiled from a policy rule names it, the drop at
// the end of a direction's list is the default deny, and Tabby's own rules
// have none.
func TestOrigins(t *testing.T) {
	web := testPod{name: "a", ns: "prod", node: "n1", ips: []string{"10.244.1.1"}, labels: map[string]string{"app": "web"}}
	in := Input{
		Node:      "n1",
		Endpoints: []*api.WorkloadEndpoint{web.endpoint()},
		NetworkPolicies: []*api.NetworkPolicy{np("prod", "web", api.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: []api.NetworkPolicyIngressRule{{Ports: []api.NetworkPolicyPort{tcpPort(80)}}, {Ports: []api.NetworkPolicyPort{tcpPort(443)}}}})},
		GlobalPolicies: []*api.GlobalNetworkPolicy{gnp("g", 1, api.GlobalNetworkPolicySpec{Selector: sel("app", "web"),
			Ingress: []api.Rule{
				{Action: api.ActionDeny, Protocol: ptr("TCP"), Destination: api.EntityRule{Ports: []api.IntOrString{api.FromInt(22)}}},
				{Action: api.ActionAllow, Protocol: ptr("TCP"), Destination: api.EntityRule{Ports: []api.IntOrString{api.FromInt(8080)}}},
			}})},
		Pools: pools[:1],
	}
	for _, comp := range []struct {
		name string
		rs   func() *Ruleset
	}{
		{"Compile", func() *Ruleset { return Compile(in) }},
		{"Compiler twice", func() *Ruleset { c := NewCompiler(); c.Compile(in); return c.Compile(in) }},
	} {
		var got []string
		for _, ch := range comp.rs().Chains {
			for _, r := range ch.Rules {
				if r.Origin != nil {
					got = append(got, r.Origin.String()+" "+r.Verdict.String())
				}
			}
		}
		want := []string{
			"default/NetworkPolicy/prod/web/ingress/0/Allow mark set mark & 0xfffeffff | 0x10000",
			"default/NetworkPolicy/prod/web/ingress/1/Allow mark set mark & 0xfffeffff | 0x10000",
			"default/GlobalNetworkPolicy//g/ingress/0/Deny drop",
			"default/GlobalNetworkPolicy//g/ingress/1/Allow mark set mark & 0xfffeffff | 0x10000",
			"default////ingress/-1/Deny drop",
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: origins (-want +got):\n%s", comp.name, diff)
		}
	}
}

func TestOriginStringParse(t *testing.T) {
	for _, o := range []*Origin{
		{Kind: OriginGlobal, Name: "g", Direction: DirEgress, Index: 3, Action: "Deny"},
		{Tier: "default", Kind: OriginNamespaced, Namespace: "ns", Name: "p", Direction: DirIngress, Index: 0, Action: "Allow"},
		{Direction: DirIngress, Index: -1, Action: "Deny"},
		{Kind: OriginStagedGlobal, Name: "s", Direction: DirIngress, Index: 1, Action: "Allow", Staged: true},
	} {
		got, ok := ParseOrigin(o.String())
		if !ok || !got.Equal(o) {
			t.Errorf("ParseOrigin(%q) = %+v, %v", o.String(), got, ok)
		}
		if len(o.ID()) != 12 {
			t.Errorf("ID(%v) = %q", o, o.ID())
		}
	}
	for _, bad := range []string{"", "a/b", "a/b/c/d/e/x/g", "a/b/c/d/e/1/g/h"} {
		if _, ok := ParseOrigin(bad); ok {
			t.Errorf("ParseOrigin(%q) ok", bad)
		}
	}
	if (*Origin)(nil).String() != "" || !(*Origin)(nil).Equal(nil) {
		t.Error("nil origin")
	}
}
