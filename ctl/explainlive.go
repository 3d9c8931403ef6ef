package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/tabbynet/tabby/policy"
)

// This file is `explain packet --live`: after the what-if, the source
// pod's agent sends one probe (POST /policy/probe) and the kernel's
// counters of each side's deciding rule (GET /policy/counters on every
// node the what-if asked, before and after) say whether the kernel agrees.

// LiveCheck is --live's result for one explanation.
type LiveCheck struct {
	Probe policy.ProbeAnswer `json:"probe"`
	Sides []LiveSide         `json:"sides"`
	// OutcomeAgrees: the probe's outcome fits the verdict (an answer when
	// allowed, none when denied); false with OutcomeNote for a UDP probe
	// without an answer to an allowed destination (a server may not answer).
	OutcomeAgrees bool   `json:"outcomeAgrees"`
	OutcomeNote   string `json:"outcomeNote,omitempty"`
	// Agrees: the outcome fits and every deciding rule with a counter
	// counted the probe.
	Agrees bool `json:"agrees"`
}

// LiveSide is the deciding rule's counter on one node.
type LiveSide struct {
	Node   string         `json:"node"`
	Side   string         `json:"side"`
	Origin *policy.Origin `json:"origin,omitempty"`
	Before uint64         `json:"before"`
	After  uint64         `json:"after"`
	Moved  bool           `json:"moved"`
	// Note says why the counter could not be checked (no counters on this
	// backend, no policy rule decided).
	Note string `json:"note,omitempty"`
}

// liveProbe runs --live for x, whose hops the what-if filled.
func liveProbe(ctx context.Context, o PacketOptions, x *PacketExplanation) error {
	ag, ok := o.Agents.(AgentPoster)
	switch {
	case !ok:
		return errors.New("--live: these agents cannot be asked for a probe")
	case x.From.Kind != "pod":
		return fmt.Errorf("--live: the probe leaves from a pod's network namespace; the source is %s", x.From)
	case x.To.Kind == "external":
		return fmt.Errorf("--live: %s is outside the cluster's pools and nodes: no probe is sent there", x.To.Addr)
	case x.Proto != "tcp" && x.Proto != "udp":
		return fmt.Errorf("--live: probes are TCP or UDP, not %s", x.Proto)
	}
	sides := make([]LiveSide, len(x.Hops))
	before := make([]policy.RuleCounters, len(x.Hops))
	for i, h := range x.Hops {
		sides[i] = LiveSide{Node: h.Node, Side: h.Side}
		if s, ok := policy.Decider(h.Traces); ok && s.Origin != nil {
			sides[i].Origin = s.Origin
		}
		var err error
		if before[i], err = getCounters(ctx, o.Agents, h.Node); err != nil {
			return err
		}
	}
	body, _ := json.Marshal(policy.ProbeRequest{Namespace: x.From.Namespace, Pod: x.From.Name, Dst: x.To.Addr.String(), Proto: x.Proto, Port: int(x.Port)})
	code, ans, err := ag.Post(ctx, x.From.Node, "/policy/probe", body)
	if err != nil {
		return fmt.Errorf("--live: asking the agent of %s for a probe: %w", x.From.Node, err)
	}
	if code != http.StatusOK {
		return fmt.Errorf("--live: the agent of %s: %s: %.300s", x.From.Node, http.StatusText(code), strings.TrimSpace(string(ans)))
	}
	lc := &LiveCheck{}
	if err := json.Unmarshal(ans, &lc.Probe); err != nil {
		return fmt.Errorf("--live: the agent of %s: unreadable answer: %w", x.From.Node, err)
	}
	for i := range sides {
		after, err := getCounters(ctx, o.Agents, sides[i].Node)
		if err != nil {
			return err
		}
		compareCounters(&sides[i], before[i], after)
	}
	lc.Sides = sides
	lc.judge(x.Allowed)
	x.Live = lc
	return nil
}

// compareCounters fills s from the counters before and after the probe.
func compareCounters(s *LiveSide, before, after policy.RuleCounters) {
	switch {
	case !after.Available:
		s.Note = "no counters: " + after.Reason
		return
	case s.Origin == nil:
		s.Note = "no policy rule decided here: no counter to check"
		return
	}
	b, _ := before.Count(s.Origin)
	a, ok := after.Count(s.Origin)
	if !ok {
		s.Note = "the kernel has no counter for this rule (the rules changed?)"
		return
	}
	s.Before, s.After = b.Packets, a.Packets
	s.Moved = a.Packets > b.Packets
}

// judge says whether the kernel agrees with the verdict allowed.
func (lc *LiveCheck) judge(allowed bool) {
	p := lc.Probe
	lc.OutcomeAgrees = p.Passed == allowed
	if allowed && !p.Passed && p.Proto == "udp" && p.Outcome == "timeout" {
		lc.OutcomeNote = "no UDP answer: the server may not answer; the counters decide"
		lc.OutcomeAgrees = true
	}
	lc.Agrees = lc.OutcomeAgrees
	for _, s := range lc.Sides {
		if s.Note == "" && !s.Moved {
			lc.Agrees = false
		}
	}
}

func getCounters(ctx context.Context, ag Agents, node string) (policy.RuleCounters, error) {
	code, body, err := ag.Get(ctx, node, "/policy/counters")
	if err != nil {
		return policy.RuleCounters{}, fmt.Errorf("--live: reading the counters of %s: %w", node, err)
	}
	if code != http.StatusOK {
		return policy.RuleCounters{}, fmt.Errorf("--live: the agent of %s: %s: %.300s", node, http.StatusText(code), strings.TrimSpace(string(body)))
	}
	var rc policy.RuleCounters
	if err := json.Unmarshal(body, &rc); err != nil {
		return policy.RuleCounters{}, fmt.Errorf("--live: the agent of %s: unreadable counters: %w", node, err)
	}
	if rc.Node != node {
		return policy.RuleCounters{}, fmt.Errorf("--live: asked the agent of %s, %s answered: check --agent", node, rc.Node)
	}
	return rc, nil
}

// writeLive prints --live's result.
func (lc *LiveCheck) write(b *strings.Builder) {
	p := lc.Probe
	fmt.Fprintf(b, "\nLive probe from %s (netns %s): %s %s -> %s: %s after %s", p.Node, p.NetNS, p.Proto, p.Src, p.Dst, p.Outcome, p.Took.Round(1e6))
	if p.Detail != "" {
		fmt.Fprintf(b, " (%s)", p.Detail)
	}
	b.WriteString("\n")
	if lc.OutcomeNote != "" {
		fmt.Fprintf(b, "  note     %s\n", lc.OutcomeNote)
	}
	for _, s := range lc.Sides {
		switch {
		case s.Note != "":
			fmt.Fprintf(b, "  %s, %s: %s\n", s.Node, s.Side, s.Note)
		default:
			fmt.Fprintf(b, "  %s, %s: %s counted %d packet(s) (%d -> %d)\n", s.Node, s.Side, OriginText(s.Origin), s.After-s.Before, s.Before, s.After)
		}
	}
	switch {
	case lc.Agrees:
		b.WriteString("Kernel: AGREES with the what-if\n")
	case !lc.OutcomeAgrees:
		fmt.Fprintf(b, "Kernel: DISAGREES: the probe %s (passed=%v) against the what-if's verdict\n", p.Outcome, p.Passed)
	default:
		b.WriteString("Kernel: DISAGREES: a deciding rule's counter did not move\n")
	}
}
