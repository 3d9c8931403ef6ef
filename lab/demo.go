package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"strings"
	"time"

	"github.com/tabbynet/tabby/ctl"
)

// Demo brings up a lab (3 nodes × 2 pods unless o says otherwise), waits
// until every BGP session is established and every node has routes to the
// others' blocks, and shows the result: the BGP sessions, one pod's
// addresses, routes and neighbours, one node's routing table, and a ping
// matrix between all pods. Unless keep, it tears the lab down again. Any
// failed step or ping is an error.
func Demo(ctx context.Context, o Options, keep bool, w io.Writer) (err error) {
	if o.Nodes == 0 {
		o.Nodes = 3
	}
	if o.PodsPerNode == 0 {
		o.PodsPerNode = 2
	}
	if o.Log == nil {
		o.Log = w
	}
	l, err := Up(ctx, o)
	if err != nil {
		return err
	}
	defer func() {
		if keep {
			flags := l.CLIFlags()
			fmt.Fprintf(w, "\nthe lab stays up; try `tabby-lab %s status`, `tabby-lab %s exec node1 -- ip route` and `tabby-lab %s down`\n", flags, flags, flags)
			return
		}
		err = errors.Join(err, l.Down())
	}()

	Section(w, "waiting for BGP sessions and routes")
	wctx, cancel := context.WithTimeout(ctx, 120*time.Second)
	defer cancel()
	if err := l.WaitEstablished(wctx); err != nil {
		return err
	}
	if err := l.WaitRoutes(wctx); err != nil {
		return err
	}
	fmt.Fprintln(w, "every session established, every block routed")

	st := l.State()
	Section(w, "BGP sessions (tabby-agent status socket, GET /status)")
	for _, n := range st.Nodes {
		s, err := l.NodeStatus(ctx, n.Name)
		if err != nil {
			return err
		}
		if err := ctl.WriteNodeStatus(w, *s); err != nil {
			return err
		}
		fmt.Fprintln(w)
	}

	if len(st.Pods) < 2 {
		return errors.New("the demo needs at least two pods")
	}
	pod, other := st.Pods[0], st.Pods[len(st.Pods)-1]
	// One ping first, so that the pod has resolved its gateway 169.254.1.1
	// (answered by proxy ARP with ee:ee:ee:ee:ee:ee).
	if err := l.Ping(ctx, pod.Name, other.IPs[0].Addr()); err != nil {
		return fmt.Errorf("ping from %s to %s (%s): %w", pod.Name, other.Name, other.IPs[0].Addr(), err)
	}
	for _, c := range [][]string{{"ip", "addr"}, {"ip", "route"}, {"ip", "neigh"}} {
		Section(w, fmt.Sprintf("pod %s on %s: %s", pod.Name, pod.Node, strings.Join(c, " ")))
		out, err := l.Exec(ctx, pod.Name, c...)
		if err != nil {
			return err
		}
		w.Write(out)
	}
	node := st.Nodes[0]
	Section(w, fmt.Sprintf("node %s: ip route (proto 80: workloads and blackholes, proto 81: learned over BGP)", node.Name))
	out, err := l.Exec(ctx, node.Name, "ip", "route")
	if err != nil {
		return err
	}
	w.Write(out)

	Section(w, "ping matrix (ping -c1 -W1 from each pod)")
	ping := func(from PodState, to netip.Addr) error { return l.Ping(ctx, from.Name, to) }
	if failed := PingMatrix(st.Pods, ping, w); failed > 0 {
		return fmt.Errorf("%d pings failed", failed)
	}
	fmt.Fprintln(w, "\nall pods reach each other")
	return nil
}

// CLIFlags are the tabby-lab flags that name this lab.
func (l *Lab) CLIFlags() string {
	flags := "--name " + l.Name()
	if runDir := filepath.Dir(l.Dir()); runDir != DefaultRunDir {
		flags += " --run-dir " + runDir
	}
	return flags
}

// Section prints a demo section's title.
func Section(w io.Writer, title string) {
	fmt.Fprintf(w, "\n=== %s\n", title)
}

// PingMatrix pings every pod from every other pod, prints a table and
// returns how many pings failed.
func PingMatrix(pods []PodState, ping func(from PodState, to netip.Addr) error, w io.Writer) int {
	width := 6
	for _, p := range pods {
		width = max(width, len(p.Name)+2)
	}
	fmt.Fprintf(w, "%-*s", width+12, "from \\ to")
	for _, p := range pods {
		fmt.Fprintf(w, "%-*s", width, p.Name)
	}
	fmt.Fprintln(w)
	failed := 0
	for _, from := range pods {
		fmt.Fprintf(w, "%-*s", width+12, fmt.Sprintf("%s (%s)", from.Name, from.Node))
		for _, to := range pods {
			mark := "-"
			if to.Name != from.Name {
				mark = "ok"
				if err := ping(from, to.IPs[0].Addr()); err != nil {
					mark = "FAIL"
					failed++
				}
			}
			fmt.Fprintf(w, "%-*s", width, mark)
		}
		fmt.Fprintln(w)
	}
	return failed
}
