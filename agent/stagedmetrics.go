package agent

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tabbynet/tabby/dataplane"
)

// maxStagedSeries bounds tabby_staged_policy_packets_total: staged
// policies beyond it are summed under policy "(other)".
const maxStagedSeries = 1000

// stagedCollector exports what staged policies would have decided, from
// the dataplane's counters of their rules (Origin.Staged), read at scrape
// time: tabby_staged_policy_packets_total{policy,action}.
type stagedCollector struct {
	src  ruleCounterReader
	desc *prometheus.Desc
}

func newStagedCollector(src ruleCounterReader) *stagedCollector {
	return &stagedCollector{src: src, desc: prometheus.NewDesc("tabby_staged_policy_packets_total",
		"Packets opening a connection that a rule of a staged policy matched (and would have decided with action), counted, never enforced.",
		[]string{"policy", "action"}, nil)}
}

// Describe implements prometheus.Collector.
func (s *stagedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- s.desc }

// Collect implements prometheus.Collector.
func (s *stagedCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counters, err := s.src.RuleCounters(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(s.desc, err)
		return
	}
	for k, v := range stagedSums(counters) {
		ch <- prometheus.MustNewConstMetric(s.desc, prometheus.CounterValue, float64(v), k[0], k[1])
	}
}

// stagedSums adds the counters of staged rules up by policy and action,
// at most maxStagedSeries policies by name.
func stagedSums(counters []dataplane.RuleCounter) map[[2]string]uint64 {
	out := map[[2]string]uint64{}
	names := map[string]bool{}
	for _, c := range counters {
		if c.Origin == nil || !c.Origin.Staged {
			continue
		}
		name := c.Origin.Policy()
		if !names[name] && len(names) >= maxStagedSeries {
			name = "(other)"
		}
		names[name] = true
		out[[2]string{name, c.Origin.Action}] += c.Packets
	}
	return out
}
