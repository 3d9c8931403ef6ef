package agent

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/policy"
)

func TestStagedSums(t *testing.T) {
	got := stagedSums([]dataplane.RuleCounter{
		{Origin: &policy.Origin{Name: "try", Action: "Deny", Staged: true, Index: 0}, Packets: 3},
		{Origin: &policy.Origin{Name: "try", Action: "Deny", Staged: true, Index: 2}, Packets: 4},
		{Origin: &policy.Origin{Name: "try", Action: "Allow", Staged: true, Index: 1}, Packets: 1},
		{Origin: &policy.Origin{Name: "enforced", Action: "Deny"}, Packets: 9},
		{Packets: 5},
	})
	want := map[[2]string]uint64{{"try", "Deny"}: 7, {"try", "Allow"}: 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// fakeCounters is a ruleCounterReader returning the next reading each call.
type fakeCounters struct{ reads [][]dataplane.RuleCounter }

func (f *fakeCounters) RuleCounters(context.Context) ([]dataplane.RuleCounter, error) {
	r := f.reads[0]
	f.reads = f.reads[1:]
	return r, nil
}

// An Apply that rewrites a staged rule restarts its kernel counter: the
// staged metric, like the rule metric, keeps counting from where it was.
func TestStagedMetricSurvivesCounterReset(t *testing.T) {
	o := &policy.Origin{Name: "try", Action: "Deny", Staged: true, Direction: "ingress"}
	fc := &fakeCounters{reads: [][]dataplane.RuleCounter{{{Origin: o, Packets: 5}}, {{Origin: o, Packets: 2}}}}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newRuleCollector(fc))
	staged := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "tabby_staged_policy_packets_total" {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		t.Fatal("no tabby_staged_policy_packets_total")
		return 0
	}
	if got := staged(); got != 5 {
		t.Errorf("first scrape: %v, want 5", got)
	}
	if got := staged(); got != 7 {
		t.Errorf("after the counter restarted at 2: %v, want 7", got)
	}
}
