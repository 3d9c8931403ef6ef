package policy

import (
	"net/netip"
	"time"
)

// The wire types of `tabbyctl explain packet --live` (docs/explain.md):
// the agent's POST /policy/probe and GET /policy/counters.

// ProbeRequest is the body of POST /policy/probe.
type ProbeRequest struct {
	// Namespace and Pod name a pod on the agent's node: the probe leaves
	// from its network namespace, from its address of Dst's family.
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	// Dst must be in one of the cluster's IP pools or a node's address.
	Dst   string `json:"dst"`
	Proto string `json:"proto"` // "tcp" or "udp"
	Port  int    `json:"port"`
	// TimeoutMS is the probe's timeout (0 = 2 s; 100 to 5000).
	TimeoutMS int `json:"timeoutMs,omitempty"`
}

// ProbeAnswer is POST /policy/probe's answer.
type ProbeAnswer struct {
	Node  string         `json:"node"`
	Src   netip.Addr     `json:"src"`
	Dst   netip.AddrPort `json:"dst"`
	Proto string         `json:"proto"`
	// Outcome is "connected", "refused", "answered", "timeout" or
	// "unreachable"; Passed means an answer came from the destination.
	Outcome string        `json:"outcome"`
	Passed  bool          `json:"passed"`
	NetNS   string        `json:"netns"`
	Took    time.Duration `json:"took"`
	Detail  string        `json:"detail,omitempty"`
}

// OriginCount is one policy rule's kernel counters, summed over every
// compiled rule that carries its Origin.
type OriginCount struct {
	Origin  Origin `json:"origin"`
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// RuleCounters is GET /policy/counters' answer. Available is false on a
// firewall without per-rule counters (the iptables backend, for now).
type RuleCounters struct {
	Node      string        `json:"node"`
	Available bool          `json:"available"`
	Reason    string        `json:"reason,omitempty"`
	Counters  []OriginCount `json:"counters,omitempty"`
}

// Count is the counters of origin o, false when no rule carries it.
func (rc RuleCounters) Count(o *Origin) (OriginCount, bool) {
	k := o.String()
	for _, c := range rc.Counters {
		if c.Origin.String() == k {
			return c, true
		}
	}
	return OriginCount{}, false
}
