package api

import (
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// FlowRecord is one flow an agent saw over one aggregation interval: a
// connection (or the denied attempts at one) between two endpoints, with
// the verdict and the policy rule that decided it. Agents serve them as
// JSON lines on GET /flows (docs/flows.md); tabbyctl flows merges every
// node's.
type FlowRecord struct {
	Node  string    `json:"node"`
	Start time.Time `json:"start"` // RFC 3339
	End   time.Time `json:"end"`
	// Proto is "tcp", "udp", "icmp", "icmpv6", "sctp" or the protocol
	// number.
	Proto   string         `json:"proto"`
	SrcAddr netip.Addr     `json:"srcAddr"`
	SrcPort uint16         `json:"srcPort,omitempty"`
	DstAddr netip.Addr     `json:"dstAddr"`
	DstPort uint16         `json:"dstPort,omitempty"`
	Src     FlowEndpoint   `json:"src"`
	Dst     FlowEndpoint   `json:"dst"`
	Action  string         `json:"action"` // FlowAllow or FlowDeny
	Policy  FlowPolicyRule `json:"policy,omitzero"`
	// Packets and Bytes count both directions of an allowed flow (the
	// kernel's conntrack accounting) and the packets dropped of a denied
	// one (those the agent was told of).
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
	// Reporter says on which side the record was made: FlowReporterSrc
	// (egress policy of the source's node) or FlowReporterDst (ingress
	// policy of the destination's node).
	Reporter string `json:"reporter"`
}

// Flow actions, endpoint kinds and reporters.
const (
	FlowAllow = "allow"
	FlowDeny  = "deny"

	FlowEndpointPod      = "pod"
	FlowEndpointHost     = "host"
	FlowEndpointExternal = "external"

	FlowReporterSrc = "src"
	FlowReporterDst = "dst"
)

// FlowEndpoint is one end of a flow as the reporting agent's cluster view
// knows it: a pod (namespace, name, labels), a node (name) or an address
// outside the cluster.
type FlowEndpoint struct {
	Kind      string            `json:"kind"`
	Namespace string            `json:"namespace,omitempty"`
	Name      string            `json:"name,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

// FlowPolicyRule is the rule that decided a flow, as policy.Origin names
// it: a policy's rule (Index its place in the direction's rule list) or,
// with Index -1 and no Name, the default action at the end of the list.
// It is the zero value when no policy selected the endpoint (allowed by
// default).
type FlowPolicyRule struct {
	Tier      string `json:"tier,omitempty"`
	Kind      string `json:"kind,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	Direction string `json:"direction,omitempty"`
	Index     int    `json:"index"`
	Action    string `json:"action,omitempty"`
}

// IsZero reports whether no policy decided.
func (p FlowPolicyRule) IsZero() bool { return p == FlowPolicyRule{} }

// PolicyName is "ns/name" for a namespaced policy, "name" for a global
// one, "(default)" for a default action and "" for none.
func (p FlowPolicyRule) PolicyName() string {
	switch {
	case p.IsZero():
		return ""
	case p.Name == "":
		return "(default)"
	case p.Namespace != "":
		return p.Namespace + "/" + p.Name
	}
	return p.Name
}

// Key identifies the flow across reporters and intervals: protocol and
// both address:port pairs.
func (f FlowRecord) Key() string {
	return fmt.Sprintf("%s %s -> %s", f.Proto, netip.AddrPortFrom(f.SrcAddr, f.SrcPort), netip.AddrPortFrom(f.DstAddr, f.DstPort))
}

// FlowFilter selects flow records; the zero value selects every one.
// Agents apply it server side (GET /flows?pod=…) and tabbyctl flows
// builds it from its flags.
type FlowFilter struct {
	// Namespace keeps flows with a pod of the namespace at either end.
	Namespace string
	// Pod ("ns/name", or "name" within Namespace) keeps flows with that
	// pod at either end.
	Pod string
	// Action is "", FlowAllow or FlowDeny.
	Action string
	// Policy ("name" of a global policy, "ns/name" of a namespaced one,
	// "(default)" for default actions) keeps flows that policy decided.
	Policy string
	// Since keeps flows whose interval ended at or after it.
	Since time.Time
}

// MaxFlowFilterLen bounds a filter's encoded query: a longer one is
// refused rather than parsed.
const MaxFlowFilterLen = 2048

// ParseFlowFilter reads a filter from a query (pod, namespace, action,
// policy, since as RFC 3339), reporting every problem by parameter name
// (FieldErrors). Unknown parameters are refused so that a typo does not
// widen the result.
func ParseFlowFilter(q map[string][]string) (FlowFilter, error) {
	var f FlowFilter
	v := &validator{}
	size := 0
	for k, vs := range q {
		for _, x := range vs {
			size += len(k) + len(x) + 2
		}
	}
	if size > MaxFlowFilterLen {
		v.add("query", "%d bytes is longer than %d", size, MaxFlowFilterLen)
		return f, v.err()
	}
	for _, k := range sortedKeys(q) {
		switch k {
		case "pod", "namespace", "action", "policy", "since":
			if len(q[k]) > 1 {
				v.add(k, "given %d times", len(q[k]))
			}
		default:
			v.add(k, "unknown filter (pod, namespace, action, policy, since)")
		}
	}
	one := func(name string) string {
		if vs := q[name]; len(vs) > 0 {
			return vs[0]
		}
		return ""
	}
	f.Namespace, f.Pod, f.Action, f.Policy = one("namespace"), one("pod"), one("action"), one("policy")
	if s := one("since"); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			v.add("since", "%q is not an RFC 3339 time (2006-01-02T15:04:05Z)", s)
		}
		f.Since = t
	}
	f.validate(v)
	if err := v.err(); err != nil {
		return FlowFilter{}, err
	}
	return f, nil
}

// Validate reports every malformed field (FieldErrors).
func (f FlowFilter) Validate() error {
	v := &validator{}
	f.validate(v)
	return v.err()
}

func (f FlowFilter) validate(v *validator) {
	if f.Action != "" && f.Action != FlowAllow && f.Action != FlowDeny {
		v.add("action", "%q is not %s or %s", f.Action, FlowAllow, FlowDeny)
	}
	if f.Namespace != "" {
		if msg := checkDNSLabel(f.Namespace); msg != "" {
			v.add("namespace", "%s", msg)
		}
	}
	if f.Pod != "" && !validNsName(f.Pod) {
		v.add("pod", "%q is not \"namespace/name\" or \"name\" (DNS-1123 names)", f.Pod)
	}
	if f.Policy != "" && f.Policy != "(default)" && !validNsName(f.Policy) {
		v.add("policy", "%q is not \"name\", \"namespace/name\" or \"(default)\"", f.Policy)
	}
}

// validNsName: "name" or "namespace/name".
func validNsName(s string) bool {
	ns, name, ok := strings.Cut(s, "/")
	if !ok {
		name = s
	}
	return (!ok || checkDNSLabel(ns) == "") && checkDNSSubdomain(name) == ""
}

// Query encodes the filter as ParseFlowFilter reads it.
func (f FlowFilter) Query() map[string][]string {
	q := map[string][]string{}
	for k, v := range map[string]string{"namespace": f.Namespace, "pod": f.Pod, "action": f.Action, "policy": f.Policy} {
		if v != "" {
			q[k] = []string{v}
		}
	}
	if !f.Since.IsZero() {
		q["since"] = []string{f.Since.UTC().Format(time.RFC3339Nano)}
	}
	return q
}

// Matches reports whether the filter keeps r.
func (f FlowFilter) Matches(r FlowRecord) bool {
	if f.Action != "" && r.Action != f.Action {
		return false
	}
	if !f.Since.IsZero() && r.End.Before(f.Since) {
		return false
	}
	if f.Policy != "" && r.Policy.PolicyName() != f.Policy {
		return false
	}
	if f.Namespace != "" && !r.Src.inNamespace(f.Namespace) && !r.Dst.inNamespace(f.Namespace) {
		return false
	}
	if f.Pod != "" {
		ns, name, ok := strings.Cut(f.Pod, "/")
		if !ok {
			ns, name = f.Namespace, f.Pod
		}
		if !r.Src.isPod(ns, name) && !r.Dst.isPod(ns, name) {
			return false
		}
	}
	return true
}

func (e FlowEndpoint) inNamespace(ns string) bool {
	return e.Kind == FlowEndpointPod && e.Namespace == ns
}

// isPod: the pod name, in namespace ns unless ns is empty.
func (e FlowEndpoint) isPod(ns, name string) bool {
	return e.Kind == FlowEndpointPod && e.Name == name && (ns == "" || e.Namespace == ns)
}
