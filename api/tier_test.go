package api

import (
	"errors"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestTierValidate(t *testing.T) {
	tests := []struct {
		name string
		tier Tier
		want []string // field paths
	}{
		{"user tier", Tier{Metadata: ObjectMeta{Name: "security"}, Spec: TierSpec{Order: ptr(100.0), DefaultAction: ActionPass}}, nil},
		{"no order", Tier{Metadata: ObjectMeta{Name: "last"}}, nil},
		{"bad action", Tier{Metadata: ObjectMeta{Name: "x"}, Spec: TierSpec{DefaultAction: "Allow"}}, []string{"spec.defaultAction"}},
		{"NaN order", Tier{Metadata: ObjectMeta{Name: "x"}, Spec: TierSpec{Order: ptr(math.NaN())}}, []string{"spec.order"}},
		{"infinite order", Tier{Metadata: ObjectMeta{Name: "x"}, Spec: TierSpec{Order: ptr(math.Inf(1))}}, []string{"spec.order"}},
		{"dotted name", Tier{Metadata: ObjectMeta{Name: "a.b"}}, []string{"metadata.name"}},
		{"namespaced", Tier{Metadata: ObjectMeta{Name: "a", Namespace: "ns"}}, []string{"metadata.namespace"}},
		{"built-in as is", *BuiltinTiers()[1], nil},
		{"built-in unset", Tier{Metadata: ObjectMeta{Name: TierKubeAdmin}}, nil},
		{"built-in reordered", Tier{Metadata: ObjectMeta{Name: TierDefault}, Spec: TierSpec{Order: ptr(5.0)}}, []string{"spec.order"}},
		{"built-in other action", Tier{Metadata: ObjectMeta{Name: TierKubeBaseline}, Spec: TierSpec{DefaultAction: ActionDeny}}, []string{"spec.defaultAction"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, fieldsOf(tt.tier.Validate())); diff != "" {
				t.Errorf("fields (-want +got):\n%s\n%v", diff, tt.tier.Validate())
			}
		})
	}
}

func fieldsOf(err error) []string {
	var fes FieldErrors
	if !errors.As(err, &fes) {
		return nil
	}
	var out []string
	for _, fe := range fes {
		out = append(out, fe.Field)
	}
	return out
}

func TestTierDefaults(t *testing.T) {
	u := &Tier{Metadata: ObjectMeta{Name: "u"}}
	u.SetDefaults()
	if u.Spec.DefaultAction != ActionDeny || u.Spec.Order != nil {
		t.Errorf("user tier defaults: %+v", u.Spec)
	}
	b := &Tier{Metadata: ObjectMeta{Name: TierKubeBaseline}}
	b.SetDefaults()
	if b.Spec.DefaultAction != ActionPass || *b.Spec.Order != TierKubeBaselineOrder {
		t.Errorf("kube-baseline defaults: %+v", b.Spec)
	}
}

func TestEffectiveTiersOrder(t *testing.T) {
	stored := []*Tier{
		{Metadata: ObjectMeta{Name: "zz-last"}},
		{Metadata: ObjectMeta{Name: "b"}, Spec: TierSpec{Order: ptr(50.0)}},
		{Metadata: ObjectMeta{Name: "a"}, Spec: TierSpec{Order: ptr(50.0)}},
		{Metadata: ObjectMeta{Name: "bad"}, Spec: TierSpec{DefaultAction: "Allow"}},
		{Metadata: ObjectMeta{Name: TierDefault}},
	}
	var got []string
	tiers := EffectiveTiers(stored)
	for _, t := range tiers {
		got = append(got, t.Metadata.Name)
	}
	want := []string{"a", "b", TierKubeAdmin, TierDefault, TierKubeBaseline, "zz-last"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
	var problems []string
	pols := []*GlobalNetworkPolicy{
		{Metadata: ObjectMeta{Name: "ok"}, Spec: GlobalNetworkPolicySpec{Ingress: []Rule{{Action: ActionPass}}}},
		{Metadata: ObjectMeta{Name: "lost"}, Spec: GlobalNetworkPolicySpec{Tier: "nope"}},
		{Metadata: ObjectMeta{Name: "pass-last"}, Spec: GlobalNetworkPolicySpec{Tier: "zz-last", Egress: []Rule{{Action: ActionAllow}, {Action: ActionPass}}}},
	}
	for _, p := range CheckTiers(tiers, pols) {
		problems = append(problems, p.String())
	}
	wantP := []string{
		"warning: Tier b: spec.order: 50 is also tier a's order: ties are evaluated by name",
		`GlobalNetworkPolicy lost: spec.tier: tier "nope" does not exist: the policy is ignored until it does`,
		"GlobalNetworkPolicy pass-last: spec.egress[1].action: Pass in tier zz-last, the last tier: there is no next tier to pass to",
	}
	if diff := cmp.Diff(wantP, problems); diff != "" {
		t.Errorf("CheckTiers (-want +got):\n%s", diff)
	}
}

func TestStagedPolicy(t *testing.T) {
	objs, err := Decode([]byte(`apiVersion: tabby.dev/v1
kind: StagedGlobalNetworkPolicy
metadata: {name: try}
spec:
  tier: kube-admin
  ingress: [{action: Pass}, {action: Log}]
`))
	if err != nil {
		t.Fatal(err)
	}
	s := objs[0].(*StagedGlobalNetworkPolicy)
	s.SetDefaults()
	if diff := cmp.Diff([]string{"spec.ingress[1].action"}, fieldsOf(s.Validate())); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if g := s.AsGlobal(); g.TierName() != TierKubeAdmin || g.Spec.Types[0] != PolicyTypeIngress {
		t.Errorf("AsGlobal: %+v", g)
	}
}
