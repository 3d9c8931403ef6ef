package ctl

import (
	"fmt"
	"io"
	"strings"

	"github.com/tabbynet/tabby/policy"
)

// WritePacketExplanations prints explain packet's answers.
func WritePacketExplanations(w io.Writer, xs []PacketExplanation) error {
	var b strings.Builder
	for i, x := range xs {
		if i > 0 {
			b.WriteString("\n")
		}
		x.write(&b)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (x PacketExplanation) write(b *strings.Builder) {
	port := fmt.Sprintf(":%d %s", x.Port, x.Proto)
	if x.Port == 0 {
		port = " " + x.Proto
	}
	fmt.Fprintf(b, "Packet %s -> %s%s, a new connection\n", x.From.Addr, x.To.Addr, port)
	fmt.Fprintf(b, "  from   %s\n", x.From)
	fmt.Fprintf(b, "  to     %s\n", x.To)
	if x.Via != "" {
		fmt.Fprintf(b, "  via    %s (translated to this endpoint before the filter: policy sees the endpoint's address and port)\n", x.Via)
	}
	for _, h := range x.Hops {
		fmt.Fprintf(b, "\n%s, %s: %s\n", h.Node, h.Side, verdictWord(h.Accepted))
		fmt.Fprintf(b, "  route    %s\n", h.Route)
		fmt.Fprintf(b, "  hooks    %s, in %s, out %s\n", hookNames(h.Traces), ifaceOrUplink(h.Packet.In), ifaceOrUplink(h.Packet.Out))
		if s, ok := policy.Decider(h.Traces); ok {
			fmt.Fprintf(b, "  decided  %s\n", stepText(s))
		} else {
			b.WriteString("  decided  no rule of Tabby's ended the walk: the hook's own policy (ACCEPT)\n")
		}
		b.WriteString("  walk\n")
		for _, tr := range h.Traces {
			fmt.Fprintf(b, "    %s %s\n", tr.Hook.Table, tr.Hook.From)
			for _, s := range tr.Steps {
				fmt.Fprintf(b, "      %s\n", stepLine(s))
			}
		}
	}
	if x.Live != nil {
		x.Live.write(b)
	}
	switch {
	case x.Allowed:
		b.WriteString("\nVerdict: ALLOWED\n")
	default:
		fmt.Fprintf(b, "\nVerdict: DENIED at %s\n", x.DeniedAt)
	}
}

func verdictWord(accepted bool) string {
	if accepted {
		return "ACCEPT"
	}
	return "DROP"
}

func ifaceOrUplink(s string) string {
	if s == "" {
		return "(not a workload)"
	}
	return s
}

func hookNames(trs []policy.Trace) string {
	var s []string
	for _, tr := range trs {
		s = append(s, tr.Hook.From)
	}
	return strings.Join(s, " then ")
}

func stepText(s policy.Step) string {
	if s.Kind == policy.StepNoTarget {
		return fmt.Sprintf("%s: no chain for the interface, drop", s.Chain)
	}
	if o := s.Origin; o != nil {
		return fmt.Sprintf("%s (%s rule %d: %s)", OriginText(o), s.Chain, s.Rule, s.Text)
	}
	return fmt.Sprintf("%s rule %d: %s", s.Chain, s.Rule, s.Text)
}

// OriginText names a policy rule: "NetworkPolicy alpha/web ingress rule 0
// (Allow)", "default Deny of ingress (no policy allowed it)".
func OriginText(o *policy.Origin) string {
	if o.Default() {
		return fmt.Sprintf("default %s at the end of %s policies (none allowed it)", o.Action, o.Direction)
	}
	tier := ""
	if o.Tier != "" {
		tier = " in tier " + o.Tier
	}
	return fmt.Sprintf("%s %s%s %s rule %d (%s)", o.Kind, o.Policy(), tier, o.Direction, o.Index, o.Action)
}

func stepLine(s policy.Step) string {
	switch s.Kind {
	case policy.StepEnter:
		return "-> " + s.Chain
	case policy.StepReturn:
		return "<- " + s.Chain + " returns"
	}
	return "   " + stepText(s)
}
