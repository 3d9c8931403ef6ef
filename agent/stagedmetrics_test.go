package agent

import (
	"testing"

	"github.com/google/go-cmp/cmp"

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
