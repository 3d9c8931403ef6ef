package ctl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// Agents reaches the status API of a node's agent.
type Agents interface {
	// Get fetches path (with its query) from node's agent and returns the
	// HTTP status and the body.
	Get(ctx context.Context, node, path string) (int, []byte, error)
}

// DefaultAgentAddress is where the agent of the node tabbyctl runs on
// serves its status API (agent.Config's StatusSocket).
const DefaultAgentAddress = "unix:///var/run/tabby/status.sock"

// AgentTemplate reaches agents at an address made from a template:
// "unix:///PATH" (a status socket; "{node}" in PATH is the node's name, as
// in a lab's "unix:///run/tabby-lab/lab/{node}/status.sock") or
// "http://HOST:PORT" ("{node}" the name, "{addr}" the node's BGP address,
// for agents started with --http-listen on the node's address). Without
// "{node}" or "{addr}" only Local is reached.
type AgentTemplate struct {
	Template string
	// Local is the node the template reaches when it names no node; ""
	// = any.
	Local string
	// Addr gives a node's address for "{addr}".
	Addr func(ctx context.Context, node string) netip.Addr
}

// maxAgentAnswer bounds what is read from an agent.
const maxAgentAnswer = 64 << 20

// AgentPoster is Agents that also post: `explain packet --live` asks the
// source's agent for a probe (POST /policy/probe).
type AgentPoster interface {
	Agents
	// Post sends body (JSON) to path on node's agent.
	Post(ctx context.Context, node, path string, body []byte) (int, []byte, error)
}

// Get implements Agents.
func (t AgentTemplate) Get(ctx context.Context, node, path string) (int, []byte, error) {
	return t.do(ctx, http.MethodGet, node, path, nil)
}

// Post implements AgentPoster.
func (t AgentTemplate) Post(ctx context.Context, node, path string, body []byte) (int, []byte, error) {
	return t.do(ctx, http.MethodPost, node, path, body)
}

func (t AgentTemplate) do(ctx context.Context, method, node, path string, body []byte) (int, []byte, error) {
	tmpl := t.Template
	if tmpl == "" {
		tmpl = DefaultAgentAddress
	}
	perNode := strings.Contains(tmpl, "{node}") || strings.Contains(tmpl, "{addr}")
	if !perNode && t.Local != "" && t.Local != node {
		return 0, nil, fmt.Errorf("agent of %s: %s reaches only the agent of %s; give --agent with {node} or {addr}", node, tmpl, t.Local)
	}
	target, err := t.expand(ctx, tmpl, node)
	if err != nil {
		return 0, nil, err
	}
	c, base, err := agentClient(target)
	if err != nil {
		return 0, nil, fmt.Errorf("agent address %q: %w", tmpl, err)
	}
	c.Timeout = 10 * time.Second
	defer c.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, method, base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("agent of %s: %w", node, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxAgentAnswer))
	if err != nil {
		return 0, nil, fmt.Errorf("agent of %s: %w", node, err)
	}
	return resp.StatusCode, answer, nil
}

// agentClient returns an HTTP client for an agent's address (unix:///PATH
// or http(s)://HOST:PORT) and the base URL its paths go after.
func agentClient(target string) (*http.Client, string, error) {
	if sock, ok := strings.CutPrefix(target, "unix://"); ok {
		return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}}, "http://agent", nil
	}
	if !strings.HasPrefix(target, "http://") && !strings.HasPrefix(target, "https://") {
		return nil, "", errors.New("want unix:///PATH or http://HOST:PORT")
	}
	return &http.Client{}, strings.TrimSuffix(target, "/"), nil
}

// expand fills the template for node.
func (t AgentTemplate) expand(ctx context.Context, tmpl, node string) (string, error) {
	target := strings.ReplaceAll(tmpl, "{node}", node)
	if strings.Contains(target, "{addr}") {
		var a netip.Addr
		if t.Addr != nil {
			a = t.Addr(ctx, node)
		}
		if !a.IsValid() {
			return "", fmt.Errorf("agent of %s: the node has no address", node)
		}
		host := a.String()
		if a.Is6() {
			host = "[" + host + "]"
		}
		target = strings.ReplaceAll(target, "{addr}", host)
	}
	return target, nil
}

// Endpoints are the template's addresses of nodes, for QueryFlows.
func (t AgentTemplate) Endpoints(ctx context.Context, nodes []string) ([]AgentEndpoint, error) {
	tmpl := t.Template
	if tmpl == "" {
		tmpl = DefaultAgentAddress
	}
	var out []AgentEndpoint
	for _, n := range nodes {
		u, err := t.expand(ctx, tmpl, n)
		if err != nil {
			return nil, err
		}
		out = append(out, AgentEndpoint{Node: n, URL: u})
	}
	return out, nil
}

// NodeAddr is a node's BGP (IPv4) address from the datastore, invalid
// when it has none.
func (c *Client) NodeAddr(ctx context.Context, node string) netip.Addr {
	n, err := datastore.GetAs[*api.Node](ctx, c.Store, api.KindNode, "", node)
	if err != nil {
		return netip.Addr{}
	}
	p, _ := n.IPv4()
	return p.Addr()
}
