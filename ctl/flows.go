package ctl

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tabbynet/tabby/api"
)

// AgentEndpoint is where a node's agent serves its status API: a unix
// socket ("unix:///var/run/tabby/status.sock") or an HTTP address
// ("http://198.18.0.11:9099").
type AgentEndpoint struct {
	Node string
	URL  string
}

// ParseAgentEndpoint reads "node=unix:///path" or "node=http://host:port".
func ParseAgentEndpoint(s string) (AgentEndpoint, error) {
	node, u, ok := strings.Cut(s, "=")
	if !ok || node == "" {
		return AgentEndpoint{}, fmt.Errorf("agent %q: want node=unix:///path or node=http://host:port", s)
	}
	pu, err := url.Parse(u)
	if err != nil || (pu.Scheme != "unix" && pu.Scheme != "http") || (pu.Scheme == "unix" && pu.Path == "") || (pu.Scheme == "http" && pu.Host == "") {
		return AgentEndpoint{}, fmt.Errorf("agent %q: %q is not unix:///path or http://host:port", s, u)
	}
	return AgentEndpoint{Node: node, URL: u}, nil
}

// AgentEndpoints are the HTTP status APIs of every node that publishes a
// status, at its address and port (agents listen there when started with
// --http-listen on the node's address).
func (c *Client) AgentEndpoints(ctx context.Context, port uint16) ([]AgentEndpoint, error) {
	sts, err := c.agentStatuses(ctx)
	if err != nil {
		return nil, err
	}
	var out []AgentEndpoint
	for node, st := range sts {
		a, err := netip.ParseAddr(st.Address)
		if p, perr := netip.ParsePrefix(st.Address); perr == nil {
			a, err = p.Addr(), nil
		}
		if err != nil {
			return nil, fmt.Errorf("node %s: address %q: %w", node, st.Address, err)
		}
		out = append(out, AgentEndpoint{Node: node, URL: "http://" + netip.AddrPortFrom(a, port).String()})
	}
	slices.SortFunc(out, func(a, b AgentEndpoint) int { return cmp.Compare(a.Node, b.Node) })
	return out, nil
}

// maxFlowLine bounds one JSON line of an agent's answer.
const maxFlowLine = 1 << 20

// agentFlows fetches one agent's records the filter keeps.
func agentFlows(ctx context.Context, ep AgentEndpoint, f api.FlowFilter) ([]api.FlowRecord, error) {
	hc, base, err := agentClient(ep.URL)
	if err != nil {
		return nil, fmt.Errorf("node %s: agent address %q: %w", ep.Node, ep.URL, err)
	}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/flows?"+url.Values(f.Query()).Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", ep.Node, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("node %s: %s: %s", ep.Node, resp.Status, strings.TrimSpace(string(msg)))
	}
	var out []api.FlowRecord
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxFlowLine)
	for sc.Scan() {
		var r api.FlowRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return out, fmt.Errorf("node %s: flow record: %w", ep.Node, err)
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("node %s: %w", ep.Node, err)
	}
	return out, nil
}

// QueryFlows asks every agent for the records f keeps and merges them by
// end time, node and flow. It returns what it got with the errors of the
// nodes that did not answer, joined.
func QueryFlows(ctx context.Context, agents []AgentEndpoint, f api.FlowFilter) ([]api.FlowRecord, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	type res struct {
		recs []api.FlowRecord
		err  error
	}
	results := make([]res, len(agents))
	done := make(chan struct{})
	for i, ep := range agents {
		go func() {
			results[i].recs, results[i].err = agentFlows(ctx, ep, f)
			done <- struct{}{}
		}()
	}
	for range agents {
		<-done
	}
	var all []api.FlowRecord
	var errs []error
	for _, r := range results {
		all = append(all, r.recs...)
		errs = append(errs, r.err)
	}
	slices.SortStableFunc(all, func(a, b api.FlowRecord) int {
		return cmp.Or(a.End.Compare(b.End), cmp.Compare(a.Node, b.Node), a.Start.Compare(b.Start), cmp.Compare(a.Key(), b.Key()))
	})
	return all, errors.Join(errs...)
}

// FollowFlows prints every node's new records as they come, polling every
// poll, until ctx ends. Each agent's records of one interval share their
// end time, so the next poll asks for those that ended later.
func FollowFlows(ctx context.Context, agents []AgentEndpoint, f api.FlowFilter, poll time.Duration, emit func([]api.FlowRecord) error, warn func(error)) error {
	last := map[string]time.Time{}
	for {
		recs, err := QueryFlows(ctx, agents, f)
		if err != nil && ctx.Err() == nil {
			warn(err)
		}
		var fresh []api.FlowRecord
		for _, r := range recs {
			if r.End.After(last[r.Node]) {
				fresh = append(fresh, r)
			}
		}
		for _, r := range fresh {
			last[r.Node] = maxTime(last[r.Node], r.End)
		}
		if len(fresh) > 0 {
			if err := emit(fresh); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(poll):
		}
		// Ask only for what ended after the slowest node's last record.
		if len(last) == len(agents) {
			var since time.Time
			for _, t := range last {
				if since.IsZero() || t.Before(since) {
					since = t
				}
			}
			f.Since = maxTime(f.Since, since)
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// WriteFlows prints records as a table or (asJSON) as JSON lines.
func WriteFlows(w io.Writer, recs []api.FlowRecord, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		for _, r := range recs {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
	t := newTable("END", "NODE", "ACTION", "PROTO", "SOURCE", "DESTINATION", "POLICY", "RULE", "PACKETS", "BYTES", "REPORTER")
	for _, r := range recs {
		rule := "-"
		if !r.Policy.IsZero() {
			rule = r.Policy.Direction + "/" + strconv.Itoa(r.Policy.Index) + "/" + r.Policy.Action
		}
		t.add(r.End.UTC().Format(time.RFC3339), r.Node, r.Action, r.Proto,
			flowEnd(r.Src, netip.AddrPortFrom(r.SrcAddr, r.SrcPort)), flowEnd(r.Dst, netip.AddrPortFrom(r.DstAddr, r.DstPort)),
			orDash(r.Policy.PolicyName()), rule, strconv.FormatUint(r.Packets, 10), strconv.FormatUint(r.Bytes, 10), r.Reporter)
	}
	return t.writePlain(w)
}

func flowEnd(e api.FlowEndpoint, ap netip.AddrPort) string {
	switch e.Kind {
	case api.FlowEndpointPod:
		return e.Namespace + "/" + e.Name + "(" + ap.String() + ")"
	case api.FlowEndpointHost:
		return "host/" + e.Name + "(" + ap.String() + ")"
	}
	return ap.String()
}
