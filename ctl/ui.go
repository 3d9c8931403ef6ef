package ctl

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/policy"
)

// This file is the web view `tabbyctl ui` serves on localhost: a static
// page (ui/index.html, embedded, no framework, nothing fetched from
// elsewhere) and a small JSON API over the same functions as the CLI —
// nodes and their BGP sessions (published statuses), pods and their
// addresses, flows (QueryFlows), and what-if (ExplainPacket).

//go:embed ui/index.html
var uiFiles embed.FS

// Bounds of a request to the web view: its query string, its body (the
// API takes none: a little slack for clients that send an empty form),
// its headers, and the time an answer may take (an agent that hangs).
const (
	maxUIQuery      = 2048
	maxUIBody       = 1024
	maxUIHeader     = 16 << 10
	uiRequestBudget = 20 * time.Second
)

// UI serves the web view. It holds no state between requests.
type UI struct {
	Client *Client
	// Agents reaches the nodes' agents (what-if and flows).
	Agents AgentTemplate
	// AnyHost accepts any Host header. By default only an IP literal or
	// "localhost" is: a page elsewhere that rebinds its own DNS name to
	// 127.0.0.1 cannot read the view (DNS rebinding).
	AnyHost bool
}

// Server is an HTTP server for the web view with bounded headers and
// timeouts for every phase, so a slow or stalled client holds nothing for
// long.
func (u *UI) Server() *http.Server {
	return &http.Server{
		Handler:           u.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      uiRequestBudget + 10*time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    maxUIHeader,
	}
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
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeUIError(w, http.StatusNotFound, fmt.Errorf("%.100q: no such page; the view is / and its API /api/nodes, /api/pods, /api/flows, /api/explain", r.URL.Path))
	})
	return u.guard(mux)
}

// guard refuses, before any handler, what the view never takes: a Host
// that is not this machine's, a method other than GET or HEAD, and a body
// (read at most maxUIBody bytes of it).
func (u *UI) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-store")
		if !u.AnyHost && !localHost(r.Host) {
			writeUIError(w, http.StatusForbidden, fmt.Errorf("host %.100q: the view answers only to an IP address or localhost", r.Host))
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeUIError(w, http.StatusMethodNotAllowed, fmt.Errorf("method %.20q: the view is read-only, use GET", r.Method))
			return
		}
		if r.ContentLength > maxUIBody {
			writeUIError(w, http.StatusRequestEntityTooLarge, fmt.Errorf("body of %d bytes: the view takes none", r.ContentLength))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxUIBody)
		n, err := io.Copy(io.Discard, r.Body)
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			writeUIError(w, http.StatusRequestEntityTooLarge, fmt.Errorf("body over %d bytes: the view takes none", maxUIBody))
			return
		case err != nil:
			writeUIError(w, http.StatusBadRequest, fmt.Errorf("reading the body: %w", err))
			return
		case n > 0:
			writeUIError(w, http.StatusBadRequest, fmt.Errorf("body of %d bytes: the view takes none, parameters go in the query", n))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// localHost: host (a Host header, with or without port) is an IP literal
// or localhost.
func localHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	_, err := netip.ParseAddr(host)
	return err == nil
}

// writeUIError answers {"error": "..."} with code.
func writeUIError(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
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
		fail := func(code int, err error) { writeUIError(w, code, err) }
		if len(r.URL.RawQuery) > maxUIQuery {
			fail(http.StatusRequestURITooLong, fmt.Errorf("query of %d bytes, at most %d", len(r.URL.RawQuery), maxUIQuery))
			return
		}
		q, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			fail(http.StatusBadRequest, fmt.Errorf("malformed query: %w", err))
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), uiRequestBudget)
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
		w.Header().Set("Content-Type", "application/json")
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
	out := make([]UIExplanation, len(xs))
	for i, x := range xs {
		out[i].PacketExplanation = x
		for _, h := range x.Hops {
			d := "no rule of Tabby's ended the walk: the hook's own policy (ACCEPT)"
			if s, ok := policy.Decider(h.Traces); ok {
				d = stepText(s)
			}
			out[i].Decided = append(out[i].Decided, d)
		}
	}
	return out, nil
}

// UIExplanation is explain packet's answer with, for each hop, the rule
// that decided in words (as the CLI prints it).
type UIExplanation struct {
	PacketExplanation
	Decided []string `json:"decided"`
}
