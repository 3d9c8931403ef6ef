package lab

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteStatus prints the lab's nodes with their agents' BGP sessions and
// the pods with their addresses.
func (l *Lab) WriteStatus(ctx context.Context, w io.Writer) error {
	st := l.State()
	fmt.Fprintf(w, "lab %q (%s), etcd %s (%s)\n\n", st.Name, st.Dir, EtcdClientURL, procState(st.Etcd))
	for _, n := range st.Nodes {
		agent := "no agent"
		if !st.NoAgents {
			agent = "agent " + procState(n.Agent)
		}
		fmt.Fprintf(w, "%s  %s  netns %s  %s\n", n.Name, n.IP, n.NetNS, agent)
		if st.NoAgents || !n.Agent.alive() {
			fmt.Fprintln(w)
			continue
		}
		s, err := l.NodeStatus(ctx, n.Name)
		if err != nil {
			fmt.Fprintf(w, "  status: %v\n\n", err)
			continue
		}
		as := ""
		if s.ASN != 0 {
			as = fmt.Sprintf(", AS %d", s.ASN)
		}
		fmt.Fprintf(w, "  ready %v%s, blocks %s, %d workloads\n", s.Ready, as, strings.Join(s.Blocks, " "), s.Workloads)
		WriteBGPTable(w, s)
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
	case p.alive():
		return fmt.Sprintf("running, pid %d", p.PID)
	default:
		return fmt.Sprintf("not running (was pid %d)", p.PID)
	}
}

// WriteBGPTable prints a node's BGP sessions like `calicoctl node status`.
func WriteBGPTable(w io.Writer, s *NodeStatus) {
	header := []string{"PEER ADDRESS", "PEER TYPE", "STATE", "SINCE", "INFO"}
	rows := [][]string{}
	for _, p := range s.Peers {
		state := "up"
		if p.State != "Established" {
			state = "start"
		}
		info := p.State
		if p.Info != "" {
			info += " " + p.Info
		}
		rows = append(rows, []string{p.Address, peerTypeText(p.Type), state, sinceText(p.Since), info})
	}
	widths := make([]int, len(header))
	for _, r := range append([][]string{header}, rows...) {
		for i, c := range r {
			widths[i] = max(widths[i], len(c))
		}
	}
	sep := "+"
	for _, wd := range widths {
		sep += strings.Repeat("-", wd+2) + "+"
	}
	line := func(r []string) {
		var b strings.Builder
		b.WriteString("|")
		for i, c := range r {
			fmt.Fprintf(&b, " %-*s |", widths[i], c)
		}
		fmt.Fprintln(w, b.String())
	}
	fmt.Fprintf(w, "IPv4 BGP status of %s\n", s.Node)
	fmt.Fprintln(w, sep)
	line(header)
	fmt.Fprintln(w, sep)
	for _, r := range rows {
		line(r)
	}
	fmt.Fprintln(w, sep)
}

func peerTypeText(t string) string {
	switch t {
	case "mesh":
		return "node-to-node mesh"
	case "global":
		return "global"
	case "node":
		return "node specific"
	case "rr-client", "rr":
		return "node specific (" + t + ")"
	}
	return t
}

func sinceText(s string) string {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return s
	}
	return t.Local().Format("15:04:05")
}
