package agent

import (
	"github.com/tabbynet/tabby/dataplane"
)

// maxStagedSeries bounds tabby_staged_policy_packets_total: staged
// policies beyond it are summed under policy "_other".
const maxStagedSeries = 1000

// stagedSums adds the counters of staged rules up by policy and action,
// at most maxStagedSeries policies by name. ruleCollector exports them as
// tabby_staged_policy_packets_total{policy,action}, from the same dump and
// the same monotonic totals as tabby_policy_rule_packets_total.
func stagedSums(counters []dataplane.RuleCounter) map[[2]string]uint64 {
	out := map[[2]string]uint64{}
	names := map[string]bool{}
	for _, c := range counters {
		if c.Origin == nil || !c.Origin.Staged {
			continue
		}
		name := c.Origin.Policy()
		if !names[name] && len(names) >= maxStagedSeries {
			name = "_other"
		}
		names[name] = true
		out[[2]string{name, c.Origin.Action}] += c.Packets
	}
	return out
}
