package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// This file evaluates a compiled Ruleset for one packet, over the
// backend-neutral model, the way the kernel walks what the renderers make
// of it: `tabbyctl explain packet` asks a node's agent for a verdict from
// the Ruleset it last applied, and the package's own tests ask it "does
// this packet pass?" instead of comparing rule text. A match, verdict or
// set it does not know is an error, never a guess, so that what-if and the
// kernel cannot silently disagree.

// Packet is one packet at a hook. A new connection has Established false.
type Packet struct {
	Src, Dst netip.Addr
	// Proto is "tcp", "udp", "sctp", "icmp" or "icmpv6".
	Proto string
	// ICMPType is an "icmpv6" packet's type.
	ICMPType         uint8
	SrcPort, DstPort uint16
	// In and Out are the input and output interfaces ("" for none).
	In, Out     string
	Established bool
}

// Hook is where a packet meets Tabby's rules: a base chain of a table
// whose policy is ACCEPT and whose only rules are Tabby's jumps.
type Hook struct {
	Table string
	From  string
}

// The hooks of the filter table.
var (
	HookForward = Hook{Table: TableFilter, From: "FORWARD"}
	HookInput   = Hook{Table: TableFilter, From: "INPUT"}
	HookOutput  = Hook{Table: TableFilter, From: "OUTPUT"}
)

// HookPreDNAT is where host endpoints' preDNAT policy meets every packet
// arriving at a node, before FORWARD or INPUT.
var HookPreDNAT = Hook{Table: TableMangle, From: "PREROUTING"}

// Paths through a node, as the hooks a packet meets in order.
var (
	// PathForward: a packet routed through the node (to or from a pod).
	PathForward = []Hook{HookPreDNAT, HookForward}
	// PathInput: a packet to the node itself.
	PathInput = []Hook{HookPreDNAT, HookInput}
	// PathOutput: a packet from the node itself.
	PathOutput = []Hook{HookOutput}
)

// Paths names the paths for Packet.Query and ParsePacketQuery.
var Paths = map[string][]Hook{"forward": PathForward, "input": PathInput, "output": PathOutput}

// EvalPath evaluates pkt at each hook of path in order, until one drops
// it, and returns the traces of the hooks it met; accepted is the last
// one's verdict.
func EvalPath(rs *Ruleset, path []Hook, pkt Packet) (traces []Trace, accepted bool, err error) {
	for _, h := range path {
		tr, err := Eval(rs, h, pkt)
		traces = append(traces, tr)
		if err != nil || !tr.Accepted {
			return traces, false, err
		}
	}
	return traces, true, nil
}

// Step kinds of a Trace.
const (
	// StepEnter: the walk entered Chain (a jump, goto or dispatch).
	StepEnter = "enter"
	// StepMatch: rule Rule of Chain matched; Verdict is what it did.
	StepMatch = "match"
	// StepReturn: the walk left Chain by its end or a return rule.
	StepReturn = "return"
	// StepNoTarget: a dispatch chain had no chain for the interface, and
	// dropped the packet.
	StepNoTarget = "no-target"
)

// Step is one thing the walk did.
type Step struct {
	Kind  string `json:"kind"`
	Chain string `json:"chain"`
	// Rule is the rule's index in Chain (StepMatch), -1 otherwise.
	Rule int `json:"rule"`
	// Text is the rule in an nft-like notation (StepMatch).
	Text string `json:"text,omitempty"`
	// Verdict is what a matching rule did ("accept", "jump X", "mark set
	// …"), or "drop" for StepNoTarget.
	Verdict string `json:"verdict,omitempty"`
	// Terminal marks the step that ended the walk with Accepted.
	Terminal bool `json:"terminal,omitempty"`
	// Origin is the matched rule's (StepMatch): the policy rule it was
	// compiled from, nil for Tabby's own rules.
	Origin *Origin `json:"origin,omitempty"`
}

// Decider is the step whose policy rule decided the walks of a node's
// hooks: the last matched rule with a (not staged) Origin — a policy's
// allow that set the accept mark, a Deny, or the default deny at the end
// of a direction's policies — or, when no policy rule matched, the step
// that ended the walk. ok is false when nothing decided (the hooks'
// policy accepted).
func Decider(trs []Trace) (s Step, ok bool) {
	var term *Step
	for i := len(trs) - 1; i >= 0; i-- {
		steps := trs[i].Steps
		for j := len(steps) - 1; j >= 0; j-- {
			st := &steps[j]
			if st.Origin != nil && !st.Origin.Staged {
				return *st, true
			}
			if st.Terminal && term == nil {
				term = st
			}
		}
	}
	if term != nil {
		return *term, true
	}
	return Step{}, false
}

// Trace is the result of Eval: the verdict and every chain entered and
// rule matched, in order. A hook whose chains all return accepts (its
// base chain's policy), with no terminal step.
type Trace struct {
	Hook     Hook   `json:"hook"`
	Accepted bool   `json:"accepted"`
	Steps    []Step `json:"steps"`
}

// Verdict is "ACCEPT" or "DROP".
func (t Trace) Verdict() string {
	if t.Accepted {
		return "ACCEPT"
	}
	return "DROP"
}

// maxEvalSteps and maxEvalDepth bound a walk: the compiler never makes a
// loop, but a Ruleset given to Eval need not come from it. The kernel
// refuses rulesets that jump deeper than 16 chains (nftables) or loop.
const (
	maxEvalSteps = 100000
	maxEvalDepth = 64
)

// ErrEval wraps every reason Eval cannot evaluate a packet.
var ErrEval = errors.New("cannot evaluate")

type evaluator struct {
	rs    *Ruleset
	table string
	pkt   Packet
	mark  uint32
	depth int
	trace *Trace
}

// Eval walks pkt through hook of rs as the kernel would, from the hook's
// jumps in order, and returns the verdict with the walk. It fails (an
// error wrapping ErrEval) on anything it cannot evaluate faithfully: a
// match or verdict kind it does not know, a jump to a missing chain or a
// reference to a missing set, a set of the wrong type or family, a packet
// mixing families, a walk that does not end. It does not modify rs and is
// safe for concurrent use on the same rs.
func Eval(rs *Ruleset, hook Hook, pkt Packet) (Trace, error) {
	tr := Trace{Hook: hook, Accepted: true, Steps: []Step{}}
	if rs == nil {
		return tr, fmt.Errorf("%w: no ruleset", ErrEval)
	}
	if !pkt.Src.IsValid() || !pkt.Dst.IsValid() || pkt.Src.Is4() != pkt.Dst.Is4() {
		return tr, fmt.Errorf("%w: packet %s -> %s: addresses of one family needed", ErrEval, pkt.Src, pkt.Dst)
	}
	e := &evaluator{rs: rs, table: hook.Table, pkt: pkt, trace: &tr}
	for _, j := range rs.Jumps {
		if j.Table != hook.Table || j.From != hook.From {
			continue
		}
		acc, done, err := e.run(j.To)
		if err != nil {
			return tr, err
		}
		if done {
			tr.Accepted = acc
			return tr, nil
		}
	}
	return tr, nil
}

func (e *evaluator) step(s Step) error {
	if len(e.trace.Steps) >= maxEvalSteps {
		return fmt.Errorf("%w: the walk does not end (at %s)", ErrEval, s.Chain)
	}
	e.trace.Steps = append(e.trace.Steps, s)
	return nil
}

// run walks chain; done reports a terminal verdict (accepted), else the
// chain returned.
func (e *evaluator) run(chain string) (accepted, done bool, err error) {
	if e.depth++; e.depth > maxEvalDepth {
		return false, false, fmt.Errorf("%w: the walk does not end (at %s)", ErrEval, chain)
	}
	defer func() { e.depth-- }()
	if err := e.step(Step{Kind: StepEnter, Chain: chain, Rule: -1}); err != nil {
		return false, false, err
	}
	ch, ok := e.rs.Chain(e.table, chain)
	if !ok {
		return false, false, fmt.Errorf("%w: jump to missing chain %s %s", ErrEval, e.table, chain)
	}
	if d := ch.Dispatch; d != nil {
		return e.dispatch(ch, d)
	}
	for i, r := range ch.Rules {
		ok, err := e.matches(r)
		if err != nil {
			return false, false, fmt.Errorf("chain %s rule %d: %w", chain, i, err)
		}
		if !ok {
			continue
		}
		s := Step{Kind: StepMatch, Chain: chain, Rule: i, Text: r.String(), Verdict: r.Verdict.String(), Origin: r.Origin}
		v := r.Verdict
		switch v.Kind {
		case VerdictAccept, VerdictDrop:
			s.Terminal = true
			return v.Kind == VerdictAccept, true, e.step(s)
		case VerdictReturn:
			if err := e.step(s); err != nil {
				return false, false, err
			}
			return false, false, e.step(Step{Kind: StepReturn, Chain: chain, Rule: -1})
		case VerdictSetMark:
			e.mark = e.mark&^v.Mask | v.Mark
			if err := e.step(s); err != nil {
				return false, false, err
			}
		case VerdictJump, VerdictGoto:
			if err := e.step(s); err != nil {
				return false, false, err
			}
			if acc, done, err := e.run(v.Chain); err != nil || done {
				return acc, done, err
			}
			if v.Kind == VerdictGoto {
				return false, false, nil
			}
		default:
			return false, false, fmt.Errorf("%w: chain %s rule %d: verdict %v is not a filter verdict", ErrEval, chain, i, v)
		}
	}
	return false, false, e.step(Step{Kind: StepReturn, Chain: chain, Rule: -1})
}

// dispatch sends the packet to the chain of its interface (a goto), or
// drops it.
func (e *evaluator) dispatch(ch Chain, d *Dispatch) (accepted, done bool, err error) {
	if len(ch.Rules) > 0 {
		return false, false, fmt.Errorf("%w: dispatch chain %s has rules", ErrEval, ch.Name)
	}
	iface := e.pkt.In
	if d.Out {
		iface = e.pkt.Out
	}
	i := slices.IndexFunc(d.Targets, func(t DispatchTarget) bool { return t.Iface == iface })
	if i < 0 {
		return false, true, e.step(Step{Kind: StepNoTarget, Chain: ch.Name, Rule: -1, Verdict: "drop", Terminal: true})
	}
	return e.run(d.Targets[i].Chain)
}

// matches evaluates every term of a rule.
func (e *evaluator) matches(r Rule) (bool, error) {
	for _, m := range r.Match {
		// A term about addresses never matches a packet of the other
		// family, negated or not (nftables adds "meta nfproto").
		if f := m.AddrFamily(); f != 0 && f != FamilyOf(e.pkt.Src) {
			return false, nil
		}
		ok, err := e.term(r, m)
		if err != nil {
			return false, err
		}
		if m.Negate {
			switch m.Kind {
			case MatchSrcNet, MatchSrcSet, MatchDstSet:
			default:
				return false, fmt.Errorf("%w: negated %v", ErrEval, m)
			}
			ok = !ok
		}
		if !ok {
			return false, nil
		}
	}
	return true, nil
}

func (e *evaluator) term(r Rule, m Match) (bool, error) {
	pkt := e.pkt
	switch m.Kind {
	case MatchInIface:
		return IfaceMatches(m.Iface, pkt.In), nil
	case MatchOutIface:
		return IfaceMatches(m.Iface, pkt.Out), nil
	case MatchSrcNet:
		return m.Net.Contains(pkt.Src), nil
	case MatchProto:
		return m.Proto == pkt.Proto, nil
	case MatchSrcPorts, MatchDstPorts:
		if !slices.ContainsFunc(r.Match, func(x Match) bool { return x.Kind == MatchProto }) {
			return false, fmt.Errorf("%w: ports without a protocol", ErrEval)
		}
		port := pkt.SrcPort
		if m.Kind == MatchDstPorts {
			port = pkt.DstPort
		}
		return slices.ContainsFunc(m.Ports, func(p PortRange) bool { return p.Contains(port) }), nil
	case MatchFamily:
		return true, nil // checked by the caller
	case MatchICMPv6Types:
		return pkt.Proto == "icmpv6" && slices.Contains(m.ICMPTypes, pkt.ICMPType), nil
	case MatchSrcSet, MatchDstSet:
		set, err := e.set(m, SetTypeNet)
		a := pkt.Src
		if m.Kind == MatchDstSet {
			a = pkt.Dst
		}
		return err == nil && slices.ContainsFunc(set.Nets, func(p netip.Prefix) bool { return p.Contains(a) }), err
	case MatchSrcAddrPortSet, MatchDstAddrPortSet:
		set, err := e.set(m, SetTypeAddrPort)
		k := AddrPort{Addr: pkt.Src, Proto: pkt.Proto, Port: pkt.SrcPort}
		if m.Kind == MatchDstAddrPortSet {
			k = AddrPort{Addr: pkt.Dst, Proto: pkt.Proto, Port: pkt.DstPort}
		}
		return err == nil && slices.Contains(set.AddrPorts, k), err
	case MatchEstablished:
		return pkt.Established, nil
	case MatchMark:
		return e.mark&m.Mask == m.Mark, nil
	}
	return false, fmt.Errorf("%w: unknown match kind %d", ErrEval, m.Kind)
}

// IfaceMatches reports whether an interface name matches a pattern: a
// name, or a prefix ending in "+".
func IfaceMatches(pattern, iface string) bool {
	if p, ok := strings.CutSuffix(pattern, "+"); ok {
		return strings.HasPrefix(iface, p)
	}
	return pattern == iface
}

// set returns the set a match names, checked against the match.
func (e *evaluator) set(m Match, typ SetType) (Set, error) {
	set, ok := e.rs.Set(m.Set)
	switch {
	case !ok:
		return set, fmt.Errorf("%w: missing set %s", ErrEval, m.Set)
	case set.Type != typ:
		return set, fmt.Errorf("%w: set %s of type %s matched as %s", ErrEval, m.Set, set.Type, typ)
	case set.Family != m.Family || (set.Family != IPv4 && set.Family != IPv6): // the compiler always names it
		return set, fmt.Errorf("%w: set %s of family %d matched as family %d", ErrEval, m.Set, set.Family, m.Family)
	}
	for _, n := range set.Nets {
		if FamilyOf(n.Addr()) != set.Family {
			return set, fmt.Errorf("%w: set %s of family %v holds %s", ErrEval, m.Set, set.Family, n)
		}
	}
	for _, a := range set.AddrPorts {
		if FamilyOf(a.Addr) != set.Family {
			return set, fmt.Errorf("%w: set %s of family %v holds %s", ErrEval, m.Set, set.Family, a)
		}
	}
	return set, nil
}

// Chain returns the named chain of the table, if the ruleset has it.
func (r *Ruleset) Chain(table, name string) (Chain, bool) {
	i := slices.IndexFunc(r.Chains, func(c Chain) bool { return c.Table == table && c.Name == name })
	if i < 0 {
		return Chain{}, false
	}
	return r.Chains[i], true
}

// Set returns the named set, if the ruleset has it.
func (r *Ruleset) Set(name string) (Set, bool) {
	i := slices.IndexFunc(r.Sets, func(s Set) bool { return s.Name == name })
	if i < 0 {
		return Set{}, false
	}
	return r.Sets[i], true
}
