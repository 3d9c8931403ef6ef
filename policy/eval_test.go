package policy

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// evalRuleset is a small hand-made ruleset: FORWARD jumps to "top", which
// dispatches by input interface; cali1's chain marks TCP to port 80 from
// 10.0.0.0/8, returns on the mark, and otherwise drops.
func evalRuleset() *Ruleset {
	accept := Verdict{Kind: VerdictSetMark, Mark: MarkAccept, Mask: MarkAccept}
	return &Ruleset{
		Jumps: []Jump{{Table: TableFilter, From: "FORWARD", To: "top"}},
		Chains: []Chain{
			{Table: TableFilter, Name: "top", Rules: []Rule{
				{Match: []Match{inIface("cali+")}, Verdict: Verdict{Kind: VerdictJump, Chain: "disp"}},
				{Match: []Match{inIface("cali+")}, Verdict: Verdict{Kind: VerdictAccept}},
			}},
			{Table: TableFilter, Name: "disp", Dispatch: &Dispatch{Targets: []DispatchTarget{{Iface: "cali1", Chain: "wl1"}}}},
			{Table: TableFilter, Name: "wl1", Rules: []Rule{
				{Match: []Match{protoMatch("tcp"), {Kind: MatchDstPorts, Ports: []PortRange{{80, 80}}}, setMatch("srcs", IPv4, false, false)}, Verdict: accept},
				{Match: []Match{{Kind: MatchMark, Mark: MarkAccept, Mask: MarkAccept}}, Verdict: Verdict{Kind: VerdictReturn}},
				{Verdict: Verdict{Kind: VerdictDrop}},
			}},
		},
		Sets: []Set{{Name: "srcs", Type: SetTypeNet, Family: IPv4, Nets: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}},
	}
}

func TestEvalTrace(t *testing.T) {
	a := netip.MustParseAddr
	pkt := Packet{Src: a("10.1.1.1"), Dst: a("10.2.2.2"), Proto: "tcp", SrcPort: 40000, DstPort: 80, In: "cali1", Out: "eth0"}
	enter := func(c string) Step { return Step{Kind: StepEnter, Chain: c, Rule: -1} }
	ret := func(c string) Step { return Step{Kind: StepReturn, Chain: c, Rule: -1} }
	match := func(c string, i int, term bool) Step {
		r := evalRuleset()
		ch, _ := r.Chain(TableFilter, c)
		return Step{Kind: StepMatch, Chain: c, Rule: i, Text: ch.Rules[i].String(), Verdict: ch.Rules[i].Verdict.String(), Terminal: term}
	}
	for _, c := range []struct {
		name   string
		mod    func(*Packet)
		accept bool
		steps  []Step
	}{
		{"marked and accepted", func(*Packet) {}, true, []Step{enter("top"), match("top", 0, false), enter("disp"), enter("wl1"),
			match("wl1", 0, false), match("wl1", 1, false), ret("wl1"), match("top", 1, true)}},
		{"wrong port dropped", func(p *Packet) { p.DstPort = 81 }, false, []Step{enter("top"), match("top", 0, false), enter("disp"), enter("wl1"),
			match("wl1", 2, true)}},
		{"source outside the set", func(p *Packet) { p.Src = a("192.0.2.1") }, false, []Step{enter("top"), match("top", 0, false), enter("disp"), enter("wl1"),
			match("wl1", 2, true)}},
		{"no dispatch target", func(p *Packet) { p.In = "cali2" }, false, []Step{enter("top"), match("top", 0, false), enter("disp"),
			{Kind: StepNoTarget, Chain: "disp", Rule: -1, Verdict: "drop", Terminal: true}}},
		{"not a workload: the hook's policy", func(p *Packet) { p.In = "eth0" }, true, []Step{enter("top"), ret("top")}},
		{"IPv6 never matches an IPv4 set", func(p *Packet) { p.Src, p.Dst = a("fd00::1"), a("fd00::2") }, false, []Step{enter("top"), match("top", 0, false), enter("disp"), enter("wl1"),
			match("wl1", 2, true)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := pkt
			c.mod(&p)
			tr, err := Eval(evalRuleset(), HookForward, p)
			if err != nil {
				t.Fatal(err)
			}
			if tr.Accepted != c.accept {
				t.Errorf("accepted = %v, want %v", tr.Accepted, c.accept)
			}
			if d := cmp.Diff(c.steps, tr.Steps); d != "" {
				t.Errorf("steps (-want +got):\n%s", d)
			}
		})
	}
}

// TestEvalRefuses: what Eval cannot evaluate faithfully is an error, never
// a verdict.
func TestEvalRefuses(t *testing.T) {
	a := netip.MustParseAddr
	pkt := Packet{Src: a("10.1.1.1"), Dst: a("10.2.2.2"), Proto: "tcp", DstPort: 80, In: "cali1"}
	for _, c := range []struct {
		name string
		port uint16 // 80 reaches wl1's first rule's set, 81 its last rule
		mod  func(*Ruleset, *Packet)
	}{
		{"unknown match kind", 80, func(r *Ruleset, _ *Packet) { r.Chains[2].Rules[0].Match[0].Kind = 99 }},
		{"missing chain", 81, func(r *Ruleset, _ *Packet) { r.Chains[1].Dispatch.Targets[0].Chain = "gone" }},
		{"missing set", 80, func(r *Ruleset, _ *Packet) { r.Sets = nil }},
		{"set of another family", 80, func(r *Ruleset, _ *Packet) { r.Sets[0].Family = IPv6 }},
		{"set of another type", 80, func(r *Ruleset, _ *Packet) { r.Sets[0].Type = SetTypeAddrPort }},
		{"ports without protocol", 80, func(r *Ruleset, _ *Packet) { r.Chains[2].Rules[0].Match[0] = inIface("cali1") }},
		{"negated protocol", 80, func(r *Ruleset, _ *Packet) { r.Chains[2].Rules[0].Match[0].Negate = true }},
		{"nat verdict in the filter path", 81, func(r *Ruleset, _ *Packet) { r.Chains[2].Rules[2].Verdict = Verdict{Kind: VerdictMasquerade} }},
		{"unknown verdict", 81, func(r *Ruleset, _ *Packet) { r.Chains[2].Rules[2].Verdict = Verdict{Kind: 42} }},
		{"a loop", 81, func(r *Ruleset, _ *Packet) {
			r.Chains[2].Rules[2].Verdict = Verdict{Kind: VerdictJump, Chain: "wl1"}
		}},
		{"mixed families", 81, func(_ *Ruleset, p *Packet) { p.Dst = a("fd00::1") }},
		{"no addresses", 81, func(_ *Ruleset, p *Packet) { p.Src = netip.Addr{} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			rs, p := evalRuleset(), pkt
			p.DstPort = c.port
			c.mod(rs, &p)
			tr, err := Eval(rs, HookForward, p)
			if !errors.Is(err, ErrEval) {
				t.Fatalf("err = %v (verdict %s), want ErrEval", err, tr.Verdict())
			}
		})
	}
	if _, err := Eval(nil, HookForward, pkt); !errors.Is(err, ErrEval) {
		t.Errorf("nil ruleset: err = %v", err)
	}
}
