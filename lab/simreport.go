package lab

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// SimResult is what the harness measured at one size (docs/scale.md says
// how each figure is taken).
type SimResult struct {
	Nodes     int  `json:"simulatedNodes"`
	Endpoints int  `json:"endpoints"`
	Policies  int  `json:"policies"`
	EtcdProxy bool `json:"etcdProxy"`
	// Events are the churn's pod events that completed (every one
	// observed by the client agents' views), in ChurnSeconds.
	Events       int     `json:"churnEvents"`
	ChurnSeconds float64 `json:"churnSeconds"`
	// ChurnFailures are churn operations (a DEL and an ADD) that failed.
	ChurnFailures int `json:"churnFailures,omitempty"`
	// Real client agents (medians).
	AgentUsPerEvent float64 `json:"agentCPUMicrosPerEvent"`
	// AgentUsPerEventNoise is the rest's own variation over the churn
	// window, per event (perEvent): AgentUsPerEvent ± it.
	AgentUsPerEventNoise float64 `json:"agentCPUMicrosPerEventNoise"`
	// FloorUsPerEvent is the bare watcher's (simfloor.go) per-event CPU
	// over the same windows, ± FloorUsPerEventNoise: the reference
	// AgentUsPerEvent is reported against (FloorRatio), when
	// FloorMeasured. FloorIdlePct is its rate at rest.
	FloorMeasured        bool    `json:"floorMeasured"`
	FloorUsPerEvent      float64 `json:"floorCPUMicrosPerEvent,omitempty"`
	FloorUsPerEventNoise float64 `json:"floorCPUMicrosPerEventNoise,omitempty"`
	FloorIdlePct         float64 `json:"floorIdleCPUPercent,omitempty"`
	// AgentViewEventsPerEvent are the watch events a client agent's view
	// took during the churn per pod event (progress reports and other
	// keys' events included: 1 when the churn's are all it saw), and
	// AgentWakesPerEvent its threads' voluntary context switches per pod
	// event beyond the rests' rate (each a sleep and a later wake-up):
	// what tells a costlier event from more wake-ups per event. Medians
	// of the clients.
	AgentViewEventsPerEvent float64 `json:"agentViewEventsPerEvent,omitempty"`
	AgentWakesPerEvent      float64 `json:"agentVoluntarySwitchesPerEvent,omitempty"`
	// AgentGCCycles are each client agent's garbage collections in the
	// first rest, the churn and the second rest (with the wait before
	// it): a collection of an 80 MiB heap costs tens of ms, and the
	// runtime forces one every 2 min, so one in a short churn window
	// raises the per-event figure by as much as the churn's own cost.
	AgentGCCycles map[string][]int `json:"agentGCCycles,omitempty"`
	AgentIdlePct  float64          `json:"agentIdleCPUPercent"`
	AgentRSSMiB   float64          `json:"agentRSSMiB"`
	// Route reflectors (medians); per client = per BGP session.
	RRIdlePct             float64 `json:"rrIdleCPUPercent"`
	RRIdleUsPerClientPerS float64 `json:"rrIdleCPUMicrosPerClientPerSecond"`
	RRRSSMiB              float64 `json:"rrRSSMiB"`
	RRKiBPerClient        float64 `json:"rrKiBPerClient"`
	// Zones of a run in zones (SimOptions.Zones), 0 without; Reflectors
	// has each reflector's figures.
	Zones int `json:"zones,omitempty"`
	// ReflectorPeering of a run in zones (SimOptions.ReflectorPeering,
	// "" for the default NonClient).
	ReflectorPeering string             `json:"reflectorPeering,omitempty"`
	Reflectors       []ReflectorFigures `json:"reflectors,omitempty"`
	// Latencies.
	RouteP50Ms float64 `json:"blockToRouteP50Ms"`
	RouteP99Ms float64 `json:"blockToRouteP99Ms"`
	// AdvertP50Ms and AdvertP99Ms are the part of the block → route
	// samples from the block's advertisement on (without the IPAM claim).
	AdvertP50Ms float64 `json:"advertToRouteP50Ms"`
	AdvertP99Ms float64 `json:"advertToRouteP99Ms"`
	// Stages break the block → route samples down (docs/scale.md).
	Stages      *RouteStages `json:"blockToRouteStages,omitempty"`
	PolicyP50Ms float64      `json:"policyToKernelP50Ms"`
	PolicyP99Ms float64      `json:"policyToKernelP99Ms"`
	// PolicyLoneP50Ms and PolicyLoneP99Ms time the same changes each made
	// more than the relay's window after the one before (with a relay
	// only): a change alone, which the relay sends at once, where the
	// back-to-back ones above wait for its window.
	PolicyLoneP50Ms float64 `json:"policyLoneToKernelP50Ms,omitempty"`
	PolicyLoneP99Ms float64 `json:"policyLoneToKernelP99Ms,omitempty"`
	ReadyS          float64 `json:"restartToReadySeconds"`
	// etcd (first member) and the proxy.
	EtcdIdlePct      float64 `json:"etcdIdleCPUPercent"`
	EtcdChurnPct     float64 `json:"etcdChurnCPUPercent"`
	EtcdRSSMiB       float64 `json:"etcdRSSMiB"`
	EtcdWatchers     int     `json:"etcdWatchers"`
	EtcdWatchStreams int     `json:"etcdWatchStreams"`
	ProxyChurnPct    float64 `json:"proxyChurnCPUPercent,omitempty"`
	// The watch relay's CPU during the churn (SimOptions.Relay), serving
	// the real agents only.
	Relay         bool    `json:"relay,omitempty"`
	RelayChurnPct float64 `json:"relayChurnCPUPercent,omitempty"`
	// RelayWindowMs is the relay's batching window.
	RelayWindowMs float64 `json:"relayWindowMs,omitempty"`
	// SessionDrops counts, by the harness's phase (simPhases), the
	// simulated sessions with a reflector that ended after being
	// established; SessionOpensFailed those that ended while opening
	// (session-drops.log has each one's cause).
	SessionDrops       map[string]int `json:"sessionDrops"`
	SessionOpensFailed map[string]int `json:"sessionOpensFailed"`
	// Load is the host's 1-minute load average after the churn window:
	// on a shared host, how much else competed for the cores.
	Load float64 `json:"loadAverage1m"`
}

// ReflectorFigures are one reflector's figures at one size: its BGP
// sessions (established, after the second rest: its clients and the
// other reflectors of its zone), RSS after the churn, idle CPU (the mean
// of the two rests).
type ReflectorFigures struct {
	Node     string  `json:"node"`
	Zone     string  `json:"zone,omitempty"`
	Sessions int     `json:"sessions"`
	RSSMiB   float64 `json:"rssMiB"`
	IdlePct  float64 `json:"idleCPUPercent"`
}

// ReflectorsTable renders each reflector's figures, one row per
// reflector and size.
func ReflectorsTable(rs []SimResult) string {
	var b strings.Builder
	b.WriteString("| sim nodes | reflector | zone | BGP sessions | RSS MiB | idle CPU % |\n|---|---|---|---|---|---|\n")
	for _, r := range rs {
		for _, f := range r.Reflectors {
			zone := f.Zone
			if zone == "" {
				zone = "—"
			}
			fmt.Fprintf(&b, "| %d | %s | %s | %d | %.0f | %.2f |\n", r.Nodes, f.Node, zone, f.Sessions, f.RSSMiB, f.IdlePct)
		}
	}
	return b.String()
}

// RouteStages are where a new block's route spends its time, p50 and
// max over the samples (and over the nodes or reflectors of a kind): the
// IPAM claim; from the advertisement, a reflector's UPDATE reaching a
// simulated client (the observer); a reflector's and a client's kernel.
type RouteStages struct {
	ClaimP50Ms        float64 `json:"claimP50Ms"`
	ClaimMaxMs        float64 `json:"claimMaxMs"`
	ReflectedP50Ms    float64 `json:"reflectedP50Ms"`
	ReflectedMaxMs    float64 `json:"reflectedMaxMs"`
	RRKernelP50Ms     float64 `json:"rrKernelP50Ms"`
	RRKernelMaxMs     float64 `json:"rrKernelMaxMs"`
	ClientKernelP50Ms float64 `json:"clientKernelP50Ms"`
	ClientKernelMaxMs float64 `json:"clientKernelMaxMs"`
	// QuietS is how long the reflectors went on sending the fill's
	// UPDATEs to the simulated nodes before the samples began.
	QuietS float64 `json:"reflectorsQuietAfterSeconds"`
	// MissingAtSamples is how many blocks the simulated nodes' sessions
	// still lacked when the samples began: 0 unless the wait timed out.
	MissingAtSamples int `json:"blocksMissingAtSamples"`
}

// StagesTable renders where block → route goes, one row per size.
func StagesTable(rs []SimResult) string {
	var b strings.Builder
	b.WriteString("| sim nodes | reflectors quiet after s | IPAM claim p50/max ms | advert → reflector's UPDATE at a client p50/max ms | advert → reflectors' kernels p50/max ms | advert → clients' kernels p50/max ms |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	for _, r := range rs {
		if s := r.Stages; s != nil {
			fmt.Fprintf(&b, "| %d | %.1f | %.0f / %.0f | %.0f / %.0f | %.0f / %.0f | %.0f / %.0f |\n", r.Nodes, s.QuietS, s.ClaimP50Ms, s.ClaimMaxMs,
				s.ReflectedP50Ms, s.ReflectedMaxMs, s.RRKernelP50Ms, s.RRKernelMaxMs, s.ClientKernelP50Ms, s.ClientKernelMaxMs)
		}
	}
	return b.String()
}

// FloorRatio is the agents' per-event CPU over the floor's, 0 without a
// floor.
func (r SimResult) FloorRatio() float64 {
	if r.FloorUsPerEvent <= 0 {
		return 0
	}
	return r.AgentUsPerEvent / r.FloorUsPerEvent
}

// floorCell renders the floor's figure and the agents' ratio to it.
func (r SimResult) floorCell() string {
	if !r.FloorMeasured {
		return "—"
	}
	ratio := "—"
	if q := r.FloorRatio(); q > 0 {
		ratio = fmt.Sprintf("%.2f", q)
	}
	return fmt.Sprintf("%.0f ± %.0f (%s)", r.FloorUsPerEvent, r.FloorUsPerEventNoise, ratio)
}

func (r SimResult) summary() string {
	return fmt.Sprintf("agent %.0f ± %.0f µs/event (%d events in %.0f s; bare watcher %s), idle %.2f%%, %.0f MiB; RR %.0f MiB; route p99 %.0f ms; policy p99 %.0f ms; ready %.1f s; etcd %d watchers",
		r.AgentUsPerEvent, r.AgentUsPerEventNoise, r.Events, r.ChurnSeconds, r.floorCell(), r.AgentIdlePct, r.AgentRSSMiB, r.RRRSSMiB, r.RouteP99Ms, r.PolicyP99Ms, r.ReadyS, r.EtcdWatchers)
}

// SimTable renders results as a Markdown table, one row per size.
func SimTable(rs []SimResult) string {
	var b strings.Builder
	b.WriteString("| sim nodes | endpoints | churn events (s) | agent µs/event ± noise | bare watcher µs/event ± noise (agent / it) | agent idle CPU % | agent RSS MiB | RR idle CPU % | RR µs/s per client | RR RSS MiB | RR KiB/client | block→route p50/p99 ms | advert→route p50/p99 ms | policy→kernel p50/p99 ms (with a relay: back to back, then changes alone) | restart→Ready s | etcd CPU % idle/churn | etcd watchers (streams) | proxy (relay) CPU % | load 1m |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		proxy := "—"
		if r.EtcdProxy {
			proxy = fmt.Sprintf("%.1f", r.ProxyChurnPct)
		}
		policy := fmt.Sprintf("%.0f / %.0f", r.PolicyP50Ms, r.PolicyP99Ms)
		if r.Relay {
			proxy += fmt.Sprintf(" (relay %.1f, window %.0f ms)", r.RelayChurnPct, r.RelayWindowMs)
			policy += fmt.Sprintf(" (alone %.0f / %.0f)", r.PolicyLoneP50Ms, r.PolicyLoneP99Ms)
		}
		fmt.Fprintf(&b, "| %d | %d | %d (%.0f) | %.0f ± %.0f | %s | %.2f | %.0f | %.2f | %.1f | %.0f | %.0f | %.0f / %.0f | %.0f / %.0f | %s | %.1f | %.1f / %.1f | %d (%d) | %s | %.1f |\n",
			r.Nodes, r.Endpoints, r.Events, r.ChurnSeconds, r.AgentUsPerEvent, r.AgentUsPerEventNoise, r.floorCell(), r.AgentIdlePct, r.AgentRSSMiB, r.RRIdlePct, r.RRIdleUsPerClientPerS, r.RRRSSMiB, r.RRKiBPerClient,
			r.RouteP50Ms, r.RouteP99Ms, r.AdvertP50Ms, r.AdvertP99Ms, policy, r.ReadyS, r.EtcdIdlePct, r.EtcdChurnPct, r.EtcdWatchers, r.EtcdWatchStreams, proxy, r.Load)
	}
	return b.String()
}

// WriteSimResults writes results.md, results.json and scale.png into dir
// ("" = nothing).
func WriteSimResults(dir string, rs []SimResult) error {
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	j, err := json.MarshalIndent(rs, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(j, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(SimTable(rs)+"\n"+ReflectorsTable(rs)+"\n"+StagesTable(rs)+"\n"+DropsTable(rs)), 0o644); err != nil {
		return err
	}
	return PlotSim(filepath.Join(dir, "scale.png"), rs)
}
