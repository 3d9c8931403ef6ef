package agent

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/flowlog"
	"github.com/tabbynet/tabby/policy"
)

// ruleCounterReader is a firewall that reads its per-rule counters
// (dataplane.NFTFirewall and dataplane.LinuxFirewall, the iptables one).
type ruleCounterReader interface {
	RuleCounters(ctx context.Context) ([]dataplane.RuleCounter, error)
}

// MaxRuleSeries bounds the label sets of tabby_policy_rule_packets_total
// and _bytes_total: one per policy rule (and default action) the node
// enforces, up to this many; the rules beyond are summed into one series
// with policy="_other" (docs/flows.md).
const MaxRuleSeries = 4096

// ruleCollector exports the firewall's per-rule counters, read in one
// dump per scrape. A rule rewritten by an Apply starts its kernel counter
// from zero; the collector keeps each series monotonic by adding the count
// it had seen before such a drop.
type ruleCollector struct {
	rc                     ruleCounterReader
	packets, bytes, staged *prometheus.Desc

	mu     sync.Mutex
	series map[string]*ruleSeries
}

type ruleSeries struct {
	origin              *policy.Origin
	labels              []string
	basePkts, baseBytes uint64
	lastPkts, lastBytes uint64
	seen                bool
}

var ruleLabels = []string{"tier", "kind", "namespace", "policy", "direction", "rule", "action"}

func newRuleCollector(rc ruleCounterReader) *ruleCollector {
	return &ruleCollector{rc: rc, series: map[string]*ruleSeries{},
		packets: prometheus.NewDesc("tabby_policy_rule_packets_total", "Packets matched by each policy rule (and default action) this node enforces, by the rule's origin; at most MaxRuleSeries series, the rest under policy=\"_other\".", ruleLabels, nil),
		bytes:   prometheus.NewDesc("tabby_policy_rule_bytes_total", "Bytes matched by each policy rule (and default action) this node enforces; see tabby_policy_rule_packets_total.", ruleLabels, nil),
		staged: prometheus.NewDesc("tabby_staged_policy_packets_total",
			"Packets opening a connection that a rule of a staged policy matched (and would have decided with action), counted, never enforced.",
			[]string{"policy", "action"}, nil),
	}
}

func (c *ruleCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.packets
	ch <- c.bytes
	ch <- c.staged
}

func (c *ruleCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counters, err := c.rc.RuleCounters(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.packets, err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.series {
		s.seen = false
	}
	type sum struct{ p, b uint64 }
	other := sum{}
	var staged []dataplane.RuleCounter // monotonic totals of staged rules
	for _, rc := range counters {
		k := rc.Origin.String()
		s := c.series[k]
		if s == nil {
			if len(c.series) >= MaxRuleSeries {
				other.p, other.b = other.p+rc.Packets, other.b+rc.Bytes
				staged = append(staged, rc)
				continue
			}
			o := rc.Origin
			s = &ruleSeries{origin: o, labels: []string{o.Tier, o.Kind, o.Namespace, o.Name, o.Direction, strconv.Itoa(o.Index), o.Action}}
			c.series[k] = s
		}
		if rc.Packets < s.lastPkts || rc.Bytes < s.lastBytes {
			s.basePkts, s.baseBytes = s.basePkts+s.lastPkts, s.baseBytes+s.lastBytes
		}
		s.lastPkts, s.lastBytes, s.seen = rc.Packets, rc.Bytes, true
	}
	for k, s := range c.series {
		if !s.seen { // the rule is gone: so is its series
			delete(c.series, k)
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(s.basePkts+s.lastPkts), s.labels...)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(s.baseBytes+s.lastBytes), s.labels...)
		staged = append(staged, dataplane.RuleCounter{Origin: s.origin, Packets: s.basePkts + s.lastPkts})
	}
	for k, v := range stagedSums(staged) {
		ch <- prometheus.MustNewConstMetric(c.staged, prometheus.CounterValue, float64(v), k[0], k[1])
	}
	if other != (sum{}) {
		l := []string{"", "", "", "_other", "", "", ""}
		ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(other.p), l...)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(other.b), l...)
	}
}

func (m *metrics) watchRuleCounters(rc ruleCounterReader) {
	m.reg.MustRegister(newRuleCollector(rc))
}

// watchFlows exports the flow log aggregator's counters.
func (m *metrics) watchFlows(agg *flowlog.Aggregator) {
	counter := func(name, help string, v func(flowlog.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v(agg.Stats())) })
	}
	gauge := func(name, help string, v func(flowlog.Stats) int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return float64(v(agg.Stats())) })
	}
	m.reg.MustRegister(
		counter("tabby_flowlog_packets_total", "Packets Tabby's rules logged to NFLOG that the agent read.", func(s flowlog.Stats) uint64 { return s.Packets }),
		counter("tabby_flowlog_conntrack_events_total", "Conntrack events the agent read for flow logs.", func(s flowlog.Stats) uint64 { return s.Events }),
		counter("tabby_flowlog_flows_dropped_total", "New flows not logged because the flow table was full (--flow-log-max-flows).", func(s flowlog.Stats) uint64 { return s.FlowsDropped }),
		counter("tabby_flowlog_records_evicted_total", "Flow records evicted from the full buffer (--flow-log-max-records).", func(s flowlog.Stats) uint64 { return s.RecordsEvicted }),
		counter("tabby_flowlog_unattributed_total", "Logged packets whose prefix names no rule the node enforces.", func(s flowlog.Stats) uint64 { return s.Unattributed }),
		counter("tabby_flowlog_source_lost_total", "Overflows of the kernel sockets (NFLOG messages lost there) and source restarts.", func(s flowlog.Stats) uint64 { return s.SourceLost }),
		gauge("tabby_flowlog_flows", "Flows tracked now.", func(s flowlog.Stats) int { return s.Flows }),
		gauge("tabby_flowlog_records", "Flow records held for GET /flows.", func(s flowlog.Stats) int { return s.Records }),
	)
}
