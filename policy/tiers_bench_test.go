package policy

import (
	"fmt"
	"testing"

	"github.com/tabbynet/tabby/api"
)

// tieredBenchInput is benchInput's 1,000 endpoints (local of them on the
// node) under 1,000 GlobalNetworkPolicies (an app's ingress from another
// app on a port), spread over tiers user tiers (defaultAction Pass, so that
// a packet meets every tier), or all in tier default when tiers is 1.
func tieredBenchInput(tiers, local int) Input {
	in := benchInput(1000, local)
	in.NetworkPolicies = nil
	var stored []*api.Tier
	for t := range tiers {
		if tiers > 1 {
			stored = append(stored, &api.Tier{Metadata: api.ObjectMeta{Name: fmt.Sprintf("t%d", t)},
				Spec: api.TierSpec{Order: ptr(float64(t)), DefaultAction: api.ActionPass}})
		}
	}
	in.Tiers = api.EffectiveTiers(stored)
	in.GlobalPolicies = nil
	for i := range 1000 {
		tier := ""
		if tiers > 1 {
			tier = fmt.Sprintf("t%d", i%tiers)
		}
		in.GlobalPolicies = append(in.GlobalPolicies, gnp(fmt.Sprintf("g%d", i), float64(i), api.GlobalNetworkPolicySpec{
			Tier: tier, Selector: sel("app", fmt.Sprintf("app%d", i%20)),
			Ingress: []api.Rule{{Action: api.ActionAllow, Protocol: ptr("TCP"),
				Source:      api.EntityRule{Selector: sel("app", fmt.Sprintf("app%d", (i+1)%20))},
				Destination: api.EntityRule{Ports: []api.IntOrString{api.FromInt(int32(8000 + i%500))}}}},
		}))
	}
	return in
}

// BenchmarkTiers compares a full policy pass (Compile) and a pass of a
// long-lived Compiler after one policy changed, with 1,000 policies in 10
// tiers and in one, 1,000 endpoints of which 100 local.
func BenchmarkTiers(b *testing.B) {
	for _, tiers := range []int{1, 10} {
		in := tieredBenchInput(tiers, 100)
		b.Run(fmt.Sprintf("full/tiers=%d", tiers), func(b *testing.B) {
			var rs *Ruleset
			for b.Loop() {
				rs = Compile(in)
			}
			rules := 0
			for _, c := range rs.Chains {
				rules += len(c.Rules)
			}
			b.ReportMetric(float64(rules), "rules")
		})
		b.Run(fmt.Sprintf("change/tiers=%d", tiers), func(b *testing.B) {
			cc := NewCompiler()
			cc.Compile(in)
			orig := in.GlobalPolicies[7]
			changed := *orig
			changed.Spec.Order = ptr(7.5)
			i := 0
			for b.Loop() {
				if i%2 == 0 {
					in.GlobalPolicies[7] = &changed
				} else {
					in.GlobalPolicies[7] = orig
				}
				i++
				cc.Compile(in)
			}
			in.GlobalPolicies[7] = orig
		})
	}
}
