package ctl

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// This file is the web view `tabbyctl ui` serves on localhost: a static
// page (ui/index.html, embedded, no framework, nothing fetched from
// elsewhere) and a small JSON API over the same functions as the CLI —
// nodes and their BGP sessions (published statuses), pods and their
// addresses, flows (QueryFlows), and what-if (ExplainPacket).

//go:embed ui/index.html
var uiFiles embed.FS

// maxUIQuery bounds a query string of the web view's API.
const maxUIQuery = 2048

// UI serves the web view. It holds no state between requests.
type UI struct {
	Client *Client
	// Agents reaches the nodes' agents (what-if and flows).
	Agents AgentTemplate
}

// Handler is the web view's HTTP handler.
func (u *UI) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		b, _ := uiFiles.ReadFile("ui/index.html")
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'")
		_, _ = w.Write(b)
	})
	mux.HandleFunc("GET /api/nodes", u.api(u.nodes))
	mux.HandleFunc("GET /api/pods", u.api(u.pods))
	mux.HandleFunc("GET /api/flows", u.api(u.flows))
	mux.HandleFunc("GET /api/explain", u.api(u.explain))
	return mux
}

// uiError is an error with the HTTP status it answers.
type uiError struct {
	code int
	err  error
}

func (e *uiError) Error() string { return e.err.Error() }

func badRequest(format string, args ...any) error {
	return &uiError{http.StatusBadRequest, fmt.Errorf(format, args...)}
}

// api wraps a JSON endpoint: bounded query, parsed once, errors as
// {"error": "..."} with a 4xx for the caller's mistakes.
func (u *UI) api(f func(ctx context.Context, q url.Values) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fail := func(code int, err error) {
			w.WriteHeader(code)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		}
		if len(r.URL.RawQuery) > maxUIQuery {
			fail(http.StatusRequestURITooLong, fmt.Errorf("query of %d bytes, at most %d", len(r.URL.RawQuery), maxUIQuery))
			return
		}
		q, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			fail(http.StatusBadRequest, fmt.Errorf("malformed query: %w", err))
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 20*time.Second)
		defer cancel()
		v, err := f(ctx, q)
		if err != nil {
			code := http.StatusBadGateway // the datastore or an agent failed
			if ue, ok := err.(*uiError); ok {
				code = ue.code
			}
			fail(code, err)
			return
		}
		_ = json.NewEncoder(w).Encode(v)
	}
}

// noParams refuses any parameter.
func noParams(q url.Values) error {
	for k := range q {
		return badRequest("%.40q: unknown parameter", k)
	}
	return nil
}

// UINode is a node and its BGP sessions in the web view.
type UINode struct {
	Name     string           `json:"name"`
	Address  string           `json:"address"`
	Sessions []api.PeerStatus `json:"sessions"`
}

func (u *UI) nodes(ctx context.Context, q url.Values) (any, error) {
	if err := noParams(q); err != nil {
		return nil, err
	}
	sts, err := u.Client.agentStatuses(ctx)
	if err != nil {
		return nil, err
	}
	out := []UINode{}
	for name, st := range sts {
		out = append(out, UINode{Name: name, Address: st.Address, Sessions: st.Peers})
	}
	slices.SortFunc(out, func(a, b UINode) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// UIPod is a pod and its addresses in the web view.
type UIPod struct {
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	Node      string   `json:"node"`
	Addresses []string `json:"addresses"`
}

func (u *UI) pods(ctx context.Context, q url.Values) (any, error) {
	if err := noParams(q); err != nil {
		return nil, err
	}
	weps, _, err := datastore.ListAs[*api.WorkloadEndpoint](ctx, u.Client.Store, api.KindWorkloadEndpoint, "")
	if err != nil {
		return nil, err
	}
	out := []UIPod{}
	for _, w := range weps {
		out = append(out, UIPod{Namespace: w.Metadata.Namespace, Name: w.Spec.Pod, Node: w.Spec.Node, Addresses: w.Spec.IPNetworks})
	}
	return out, nil
}

func (u *UI) flows(ctx context.Context, q url.Values) (any, error) {
	f, err := api.ParseFlowFilter(q)
	if err != nil {
		return nil, badRequest("%w", err)
	}
	sts, err := u.Client.agentStatuses(ctx)
	if err != nil {
		return nil, err
	}
	var nodes []string
	for n := range sts {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	eps, err := u.Agents.Endpoints(ctx, nodes)
	if err != nil {
		return nil, err
	}
	recs, err := QueryFlows(ctx, eps, f)
	if recs == nil {
		recs = []api.FlowRecord{}
	}
	return recs, err
}

func (u *UI) explain(ctx context.Context, q url.Values) (any, error) {
	o := PacketOptions{Agents: u.Agents}
	for k, v := range q {
		if len(v) != 1 {
			return nil, badRequest("%.40q: given %d times", k, len(v))
		}
		switch k {
		case "from":
			o.From = v[0]
		case "to":
			o.To = v[0]
		case "port":
			o.Port = v[0]
		case "family":
			n, err := strconv.Atoi(v[0])
			if err != nil {
				return nil, badRequest("family: %.20q: want 4 or 6", v[0])
			}
			o.Family = n
		default:
			return nil, badRequest("%.40q: unknown parameter", k)
		}
	}
	if o.From == "" || o.To == "" || o.Port == "" {
		return nil, badRequest("from, to and port are required")
	}
	xs, err := u.Client.ExplainPacket(ctx, o)
	if err != nil {
		return nil, &uiError{http.StatusUnprocessableEntity, err}
	}
	return xs, nil
}
