package lab

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/tabbynet/tabby/ctl"
)

// WriteStatus prints the lab's nodes with their agents' BGP sessions and
// the pods with their addresses.
func (l *Lab) WriteStatus(ctx context.Context, w io.Writer) error {
	st := l.State()
	fmt.Fprintf(w, "lab %q (%s)\n", st.Name, st.Dir)
	for _, m := range st.Etcd {
		fmt.Fprintf(w, "%s  %s  %s\n", m.Name, m.ClientURL(), procState(m.Proc))
	}
	fmt.Fprintln(w)
	for _, n := range st.Nodes {
		agent := "no agent"
		if !st.NoAgents {
			agent = "agent " + procState(n.Agent)
		}
		fmt.Fprintf(w, "%s  %s  netns %s  %s\n", n.Name, n.Underlay(), n.NetNS, agent)
		if st.NoAgents || !n.Agent.Alive() {
			fmt.Fprintln(w)
			continue
		}
		s, err := l.NodeStatus(ctx, n.Name)
		if err != nil {
			fmt.Fprintf(w, "  status: %v\n\n", err)
			continue
		}
		fmt.Fprintf(w, "  ready %v\n", s.Ready)
		if err := ctl.WriteNodeStatus(w, *s); err != nil {
			return err
		}
		fmt.Fprintln(w)
	}
	if len(st.Pods) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tNAMESPACE\tNODE\tIP\tNETNS")
	for _, p := range st.Pods {
		ips := make([]string, len(p.IPs))
		for i, a := range p.IPs {
			ips[i] = a.String()
		}
		ipText := strings.Join(ips, ",")
		if len(ips) == 0 {
			ipText = "(none: adding, or ADD failed)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Name, p.Namespace, p.Node, ipText, p.NetNS)
	}
	return tw.Flush()
}

func procState(p *Proc) string {
	switch {
	case p == nil:
		return "not started"
	case p.Alive():
		return fmt.Sprintf("running, pid %d", p.PID)
	default:
		return fmt.Sprintf("not running (was pid %d)", p.PID)
	}
}
