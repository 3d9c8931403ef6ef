package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp/session"
	"github.com/tabbynet/tabby/datastore"
)

// StatusPrefix is where each agent publishes its status (a JSON record
// under a lease, so that a dead agent's status disappears).
const StatusPrefix = datastore.NodeStatusPrefix

// isEstablished reports whether a published session state is that of a
// working session.
func isEstablished(state string) bool {
	st, ok := session.Parse(state)
	return ok && st == session.Established
}

// NodeStatusOptions are the arguments of node status.
type NodeStatusOptions struct {
	// Node whose sessions to show.
	Node string
	// All shows every node's.
	All bool
}

// agentStatus reads one node's published status; found is false when
// there is none.
func (c *Client) agentStatus(ctx context.Context, node string) (st api.AgentStatus, found bool, err error) {
	kv, err := c.Store.GetKV(ctx, StatusPrefix+node)
	if isNotFound(err) {
		return st, false, nil
	}
	if err != nil {
		return st, false, err
	}
	if err := json.Unmarshal(kv.Value, &st); err != nil {
		return st, false, fmt.Errorf("status of node %s: %w", node, err)
	}
	return st, true, nil
}

// agentStatuses reads every published status, by node.
func (c *Client) agentStatuses(ctx context.Context) (map[string]api.AgentStatus, error) {
	kvs, _, err := c.Store.ListKV(ctx, StatusPrefix)
	if err != nil {
		return nil, fmt.Errorf("listing node status: %w", err)
	}
	out := map[string]api.AgentStatus{}
	for _, kv := range kvs {
		var st api.AgentStatus
		name := strings.TrimPrefix(kv.Key, StatusPrefix)
		if err := json.Unmarshal(kv.Value, &st); err != nil {
			return nil, fmt.Errorf("status of node %s: %w", name, err)
		}
		out[name] = st
	}
	return out, nil
}

// NodeStatus prints BGP sessions the way calicoctl node status does, from
// the status the agents publish in etcd.
func (c *Client) NodeStatus(ctx context.Context, out io.Writer, o NodeStatusOptions) error {
	if !o.All {
		st, found, err := c.agentStatus(ctx, o.Node)
		if err != nil {
			return err
		}
		if !found {
			return c.noStatus(ctx, o.Node)
		}
		return WriteNodeStatus(out, st)
	}
	statuses, err := c.agentStatuses(ctx)
	if err != nil {
		return err
	}
	nodes, _, err := c.Store.List(ctx, api.KindNode, "")
	if err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	// The Node records say which nodes exist: a status record outliving
	// its node (its lease not yet expired) is not listed.
	names := make([]string, 0, len(nodes))
	for _, n := range nodes {
		names = append(names, n.GetMeta().Name)
	}
	slices.Sort(names)
	if len(names) == 0 {
		_, err := fmt.Fprintln(out, "No nodes and no published status.")
		return err
	}
	sessions, established, publishing := 0, 0, 0
	for i, n := range names {
		if i > 0 {
			fmt.Fprintln(out)
		}
		st, ok := statuses[n]
		if !ok {
			fmt.Fprintf(out, "Node %s: no status published (is tabby-agent running there?)\n", n)
			continue
		}
		publishing++
		if err := WriteNodeStatus(out, st); err != nil {
			return err
		}
		for _, p := range st.Peers {
			sessions++
			if isEstablished(p.State) {
				established++
			}
		}
	}
	_, err = fmt.Fprintf(out, "\n%d of %d nodes publish status; %d of %d BGP sessions established.\n",
		publishing, len(names), established, sessions)
	return err
}

// noStatus explains why a node has no status.
func (c *Client) noStatus(ctx context.Context, node string) error {
	statuses, err := c.agentStatuses(ctx)
	if err != nil {
		return err
	}
	have := make([]string, 0, len(statuses))
	for n := range statuses {
		have = append(have, n)
	}
	slices.Sort(have)
	msg := fmt.Sprintf("no BGP status published for node %q", node)
	if _, err := c.Store.Get(ctx, api.KindNode, "", node); isNotFound(err) {
		msg += " (and no Node resource of that name)"
	} else {
		msg += ": is tabby-agent running there? (an agent's status goes away with its lease)"
	}
	if len(have) > 0 {
		msg += "; nodes with status: " + strings.Join(have, ", ") + " (use --node NAME or --all)"
	}
	return errors.New(msg)
}

// peerInfo is the INFO column of a session: a session shut down over its
// max-prefix limit says so first, whatever its state.
func peerInfo(p api.PeerStatus) string {
	if p.PrefixLimitExceeded {
		return fmt.Sprintf("MAX-PREFIX EXCEEDED: peer sent %d prefixes, limit %d; shut down until its BGPPeer changes", p.Received, p.MaxPrefixes)
	}
	return PeerInfoText(p.State, p.Info)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// peerTypeText spells peer types the way calicoctl does.
func peerTypeText(t string) string {
	switch t {
	case "mesh":
		return "node-to-node mesh"
	case "global":
		return "global"
	case "node":
		return "node specific"
	case "rr", "rr-client":
		return "route reflector"
	}
	return orNone(t)
}

// WriteNodeStatus prints one agent's status: its BGP sessions in a box the
// way calicoctl node status does, its affine blocks and advertisements.
func WriteNodeStatus(out io.Writer, st api.AgentStatus) error {
	est := 0
	for _, p := range st.Peers {
		if isEstablished(p.State) {
			est++
		}
	}
	var b strings.Builder
	over := 0
	for _, p := range st.Peers {
		if p.PrefixLimitExceeded {
			over++
		}
	}
	overText := ""
	if over > 0 {
		overText = fmt.Sprintf(" (%d shut down over max-prefix)", over)
	}
	fmt.Fprintf(&b, "Node %s (%s, AS %d): %d of %s established%s, %s\n", st.Node, orNone(st.Address), st.ASN,
		est, plural(len(st.Peers), "BGP session", "BGP sessions"), overText, plural(st.Workloads, "workload", "workloads"))
	if len(st.Peers) == 0 {
		b.WriteString("No BGP peers.\n")
	} else {
		b.WriteString(sessionsHeading(st.Peers))
		peers := slices.Clone(st.Peers)
		slices.SortFunc(peers, func(x, y api.PeerStatus) int { return strings.Compare(x.Address, y.Address) })
		// The BFD column appears only when some session runs BFD.
		bfd := slices.ContainsFunc(peers, func(p api.PeerStatus) bool { return p.BFD != "" })
		// The FAMILIES column appears only when some session carries
		// IPv6 (MP-BGP on the IPv4 session).
		fams := slices.ContainsFunc(peers, func(p api.PeerStatus) bool { return slices.Contains(p.Families, "ipv6") })
		cols := []string{"PEER ADDRESS", "PEER TYPE", "STATE", "SINCE"}
		if bfd {
			cols = append(cols, "BFD")
		}
		if fams {
			cols = append(cols, "FAMILIES")
		}
		t := newTable(append(cols, "INFO")...)
		for _, p := range peers {
			since := "-"
			if !p.Since.IsZero() {
				since = p.Since.UTC().Format(time.DateTime)
			}
			row := []string{p.Address, peerTypeText(p.Type), p.State, since}
			if bfd {
				row = append(row, orDash(p.BFD))
			}
			if fams {
				row = append(row, orDash(strings.Join(p.Families, ",")))
			}
			t.add(append(row, peerInfo(p))...)
		}
		if err := t.writeBoxed(&b); err != nil {
			return err
		}
	}
	fmt.Fprintf(&b, "Affine blocks: %s\n", orNone(strings.Join(st.Blocks, ", ")))
	fmt.Fprintf(&b, "Advertised:    %s\n", orNone(strings.Join(st.Advertised, ", ")))
	for _, p := range st.BGPProblems {
		fmt.Fprintf(&b, "BGP problem:   %s\n", p)
	}
	if lines := serviceStatusLines(st); len(lines) > 0 {
		b.WriteString("Service advertisements\n")
		for _, l := range lines {
			fmt.Fprintf(&b, "  %s\n", l)
		}
	}
	hostEndpointLines(&b, st.HostEndpoints)
	writeTunnels(&b, st)
	writeBGPExtras(&b, st)
	_, err := io.WriteString(out, b.String())
	return err
}

// sessionsHeading names the sessions' address family as calicoctl does
// ("IPv4 BGP status"); sessions of both families (an IPv6-only peer) are
// "BGP status".
func sessionsHeading(peers []api.PeerStatus) string {
	v6 := 0
	for _, p := range peers {
		if strings.Contains(p.Address, ":") {
			v6++
		}
	}
	switch v6 {
	case 0:
		return "IPv4 BGP status\n"
	case len(peers):
		return "IPv6 BGP status\n"
	}
	return "BGP status\n"
}
