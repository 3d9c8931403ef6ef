package ctl

import (
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/policy"
)

// fakeLiveAgents answers /policy/counters from before/after tables (after
// once a probe was posted) and /policy/probe with probe.
type fakeLiveAgents struct {
	before, after map[string]policy.RuleCounters
	probe         policy.ProbeAnswer
	probeCode     int
	posted        []policy.ProbeRequest
}

func (f *fakeLiveAgents) Get(_ context.Context, node, path string) (int, []byte, error) {
	rc := policy.RuleCounters{Node: node}
	if r, ok := f.before[node]; ok {
		rc = r
	}
	if r, ok := f.after[node]; ok && len(f.posted) > 0 {
		rc = r
	}
	b, _ := json.Marshal(rc)
	return http.StatusOK, b, nil
}

func (f *fakeLiveAgents) Post(_ context.Context, node, path string, body []byte) (int, []byte, error) {
	var req policy.ProbeRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return http.StatusBadRequest, []byte(err.Error()), nil
	}
	f.posted = append(f.posted, req)
	if f.probeCode != 0 {
		return f.probeCode, []byte("too many probes"), nil
	}
	b, _ := json.Marshal(f.probe)
	return http.StatusOK, b, nil
}

// TestLiveProbeJudges: --live agrees only when the probe's outcome fits
// the verdict and every deciding rule's counter moved; a node without
// counters is said so, not failed; it refuses what it must not probe.
func TestLiveProbeJudges(t *testing.T) {
	egress := &policy.Origin{Kind: policy.OriginNamespaced, Namespace: "a", Name: "out", Direction: policy.DirEgress, Index: 0, Action: "Allow"}
	ingress := &policy.Origin{Kind: policy.OriginNamespaced, Namespace: "a", Name: "in", Direction: policy.DirIngress, Index: -1, Action: "Deny"}
	hop := func(node string, o *policy.Origin, acc bool) PacketHop {
		return PacketHop{Node: node, Side: "x", Accepted: acc, Traces: []policy.Trace{{Accepted: acc, Steps: []policy.Step{{Kind: "match", Origin: o, Terminal: true}}}}}
	}
	counts := func(node string, e, i uint64) policy.RuleCounters {
		return policy.RuleCounters{Node: node, Available: true, Counters: []policy.OriginCount{{Origin: *egress, Packets: e}, {Origin: *ingress, Packets: i}}}
	}
	x := func(allowed bool) PacketExplanation {
		return PacketExplanation{From: PacketEnd{Kind: "pod", Namespace: "a", Name: "cli", Node: "n1", Addr: netip.MustParseAddr("10.244.1.2")},
			To: PacketEnd{Kind: "pod", Namespace: "a", Name: "web", Node: "n2", Addr: netip.MustParseAddr("10.244.2.1")}, Proto: "tcp", Port: 80,
			Allowed: allowed, Hops: []PacketHop{hop("n1", egress, true), hop("n2", ingress, allowed)}}
	}
	for _, c := range []struct {
		name           string
		allowed        bool
		outcome        string
		passed         bool
		after          map[string]policy.RuleCounters
		agrees, fitted bool
		note           string
	}{
		{"denied, dropped, both counted", false, "timeout", false, map[string]policy.RuleCounters{"n1": counts("n1", 6, 0), "n2": counts("n2", 0, 3)}, true, true, ""},
		{"denied but connected", false, "connected", true, map[string]policy.RuleCounters{"n1": counts("n1", 6, 0), "n2": counts("n2", 0, 3)}, false, false, ""},
		{"ingress rule did not count", false, "timeout", false, map[string]policy.RuleCounters{"n1": counts("n1", 6, 0), "n2": counts("n2", 0, 1)}, false, true, ""},
		{"no counters on n2", false, "timeout", false, map[string]policy.RuleCounters{"n1": counts("n1", 6, 0), "n2": {Node: "n2", Reason: "iptables"}}, true, true, "no counters: iptables"},
	} {
		f := &fakeLiveAgents{before: map[string]policy.RuleCounters{"n1": counts("n1", 5, 0), "n2": counts("n2", 0, 1)}, after: c.after,
			probe: policy.ProbeAnswer{Node: "n1", Proto: "tcp", Outcome: c.outcome, Passed: c.passed}}
		px := x(c.allowed)
		if err := liveProbe(context.Background(), PacketOptions{Agents: f}, &px); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if px.Live.Agrees != c.agrees || px.Live.OutcomeAgrees != c.fitted || px.Live.Sides[1].Note != c.note {
			t.Errorf("%s: agrees=%v outcome=%v sides %+v, want %v %v %q", c.name, px.Live.Agrees, px.Live.OutcomeAgrees, px.Live.Sides, c.agrees, c.fitted, c.note)
		}
		want := []policy.ProbeRequest{{Namespace: "a", Pod: "cli", Dst: "10.244.2.1", Proto: "tcp", Port: 80}}
		if diff := cmp.Diff(want, f.posted); diff != "" {
			t.Errorf("%s: probe asked (-want +got):\n%s", c.name, diff)
		}
		var b strings.Builder
		px.Live.write(&b)
		if w := map[bool]string{true: "Kernel: AGREES", false: "Kernel: DISAGREES"}[c.agrees]; !strings.Contains(b.String(), w) {
			t.Errorf("%s: output lacks %q:\n%s", c.name, w, b.String())
		}
	}
	for _, c := range []struct {
		name string
		edit func(*PacketExplanation)
		code int
		want string
	}{
		{"from a node", func(x *PacketExplanation) { x.From.Kind = "host" }, 0, "leaves from a pod"},
		{"to outside", func(x *PacketExplanation) { x.To.Kind = "external" }, 0, "outside the cluster"},
		{"icmp", func(x *PacketExplanation) { x.Proto = "icmp" }, 0, "TCP or UDP"},
		{"rate limited", func(*PacketExplanation) {}, http.StatusTooManyRequests, "Too Many Requests: too many probes"},
	} {
		f := &fakeLiveAgents{probeCode: c.code}
		px := x(true)
		c.edit(&px)
		err := liveProbe(context.Background(), PacketOptions{Agents: f}, &px)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
		if c.code == 0 && len(f.posted) > 0 {
			t.Errorf("%s: a probe was asked for", c.name)
		}
	}
}
