package dataplane

import (
	"testing"

	"github.com/tabbynet/tabby/policy"
)

func TestFlowLogRulesLogs(t *testing.T) {
	rule := func(action string, v policy.VerdictKind) policy.Rule {
		return policy.Rule{Verdict: policy.Verdict{Kind: v}, Origin: &policy.Origin{Tier: "kube-admin", Name: "p", Direction: "ingress", Action: action}}
	}
	all, deny := FlowLogRules{Deny: true, Allow: true}, FlowLogRules{Deny: true}
	for _, c := range []struct {
		name string
		fl   FlowLogRules
		r    policy.Rule
		want bool
	}{
		{"allow logs with all", all, rule("Allow", policy.VerdictSetMark), true},
		{"allow silent with deny only", deny, rule("Allow", policy.VerdictAccept), false},
		{"deny logs", deny, rule("Deny", policy.VerdictDrop), true},
		// A Pass hands the packet to the next tier with a mark, like an
		// allow: it decides nothing and must not be logged as an allow.
		{"pass never logs", all, rule("Pass", policy.VerdictSetMark), false},
		{"no origin", all, policy.Rule{Verdict: policy.Verdict{Kind: policy.VerdictDrop}}, false},
	} {
		if got := c.fl.Logs(c.r); got != c.want {
			t.Errorf("%s: Logs = %v, want %v", c.name, got, c.want)
		}
	}
}
