package ctl

import (
	"cmp"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore/storetest"
)

// TestUIHostileInput: the web view's API answers huge, malformed or
// unknown queries with a bounded JSON 4xx that says what is wrong, serves
// the page and the lists, and never crashes.
func TestUIHostileInput(t *testing.T) {
	store := storetest.New(t)
	c := NewClient(store, nil)
	w := &api.WorkloadEndpoint{Metadata: api.ObjectMeta{Name: "node1-k8s-web-eth0", Namespace: "shop"},
		Spec: api.WorkloadEndpointSpec{Node: "node1", Orchestrator: "k8s", Pod: "web", ContainerID: "c1", Endpoint: "eth0",
			InterfaceName: "cali0000000001", IPNetworks: []string{"10.244.1.1/32"}}}
	w.SetDefaults()
	if _, err := store.Create(context.Background(), w); err != nil {
		t.Fatal(err)
	}
	h := (&UI{Client: c, Agents: AgentTemplate{Template: "unix:///nonexistent/{node}.sock"}}).Handler()
	get := func(target string) (int, string) {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, target, nil)
		r.Host = "127.0.0.1:9097"
		h.ServeHTTP(rec, r)
		return rec.Code, rec.Body.String()
	}
	huge := strings.Repeat("A", 1<<20)
	for _, c := range []struct {
		target string
		code   int
		want   string
	}{
		{"/", http.StatusOK, "<title>Tabby</title>"},
		{"/api/pods", http.StatusOK, `"addresses":["10.244.1.1/32"]`},
		{"/api/nodes", http.StatusOK, "[]"},
		{"/api/pods?x=1", http.StatusBadRequest, "unknown parameter"},
		{"/api/flows?" + huge, http.StatusRequestURITooLong, "at most 2048"},
		{"/api/explain?from=" + huge, http.StatusRequestURITooLong, "at most 2048"},
		{"/api/flows?action=%zz", http.StatusBadRequest, "malformed query"},
		{"/api/flows?action=maybe", http.StatusBadRequest, "action"},
		{"/api/explain?from=pod/shop/web", http.StatusBadRequest, "required"},
		{"/api/explain?from=a&from=b&to=c&port=80", http.StatusBadRequest, "given 2 times"},
		{"/api/explain?from=pod/shop/web&to=10.0.0.1&port=80/gre", http.StatusUnprocessableEntity, "protocol"},
		{"/api/explain?from=pod/shop/web&to=pod/shop/gone&port=80/tcp", http.StatusUnprocessableEntity, "no workload endpoint"},
		{"/api/explain?from=pod/shop/web&to=10.0.0.1&port=80/tcp&family=x", http.StatusBadRequest, "family"},
		{"/api/explain?from=pod/shop/web&to=10.0.0.1&port=80/tcp", http.StatusUnprocessableEntity, "agent of node1"},
		{"/nothing", http.StatusNotFound, "no such page"},
		{"/api/", http.StatusNotFound, "no such page"},
		{"/api/nodes/x", http.StatusNotFound, "no such page"},
	} {
		code, body := get(c.target)
		if code != c.code || !strings.Contains(body, c.want) || (c.target != "/" && len(body) > 4096) {
			t.Errorf("%.80s: %d %.300s, want %d with %q", c.target, code, body, c.code, c.want)
		}
		if code >= 400 {
			var e map[string]string
			if json.Unmarshal([]byte(body), &e) != nil || e["error"] == "" {
				t.Errorf("%.80s: error body %q is not {\"error\": ...}", c.target, body)
			}
		}
	}
}

// countingReader is an endless body that counts what was read of it.
type countingReader struct{ n int64 }

func (c *countingReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	c.n += int64(len(p))
	return len(p), nil
}

// TestUIRefusesWhatItNeverTakes: other methods, bodies (huge, endless or
// small), foreign Host names: a JSON 4xx that says why, having read at most
// a bounded part of the body; and the server has a timeout for every phase.
func TestUIRefusesWhatItNeverTakes(t *testing.T) {
	h := (&UI{Client: NewClient(storetest.New(t), nil), Agents: AgentTemplate{Template: "unix:///nonexistent/{node}.sock"}}).Handler()
	for _, c := range []struct {
		name, method, target, host string
		body                       io.Reader
		length                     int64 // -1: unknown (chunked)
		code                       int
		want                       string
	}{
		{"post", http.MethodPost, "/api/pods", "", strings.NewReader("{bad json"), 9, http.StatusMethodNotAllowed, "read-only"},
		{"put", http.MethodPut, "/", "", nil, 0, http.StatusMethodNotAllowed, "read-only"},
		{"delete", http.MethodDelete, "/api/flows", "", nil, 0, http.StatusMethodNotAllowed, "read-only"},
		{"options", http.MethodOptions, "/api/explain", "", nil, 0, http.StatusMethodNotAllowed, "read-only"},
		{"huge declared body", http.MethodGet, "/api/pods", "", &countingReader{}, 1 << 30, http.StatusRequestEntityTooLarge, "takes none"},
		{"endless chunked body", http.MethodGet, "/api/pods", "", &countingReader{}, -1, http.StatusRequestEntityTooLarge, "over 1024 bytes"},
		{"small body", http.MethodGet, "/api/nodes", "", strings.NewReader("a=1"), 3, http.StatusBadRequest, "parameters go in the query"},
		{"foreign host", http.MethodGet, "/api/pods", "evil.example:9097", nil, 0, http.StatusForbidden, "only to an IP address or localhost"},
		{"foreign host page", http.MethodGet, "/", "evil.example", nil, 0, http.StatusForbidden, "evil.example"},
		{"localhost", http.MethodGet, "/api/pods", "localhost:9097", nil, 0, http.StatusOK, "[]"},
		{"ipv6 loopback", http.MethodGet, "/api/pods", "[::1]:9097", nil, 0, http.StatusOK, "[]"},
		{"head", http.MethodHead, "/api/pods", "", nil, 0, http.StatusOK, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(c.method, c.target, c.body)
			r.ContentLength = c.length
			r.Host = cmp.Or(c.host, "127.0.0.1:9097")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			body := rec.Body.String()
			if rec.Code != c.code || !strings.Contains(body, c.want) || len(body) > 4096 {
				t.Errorf("%d %.300s, want %d with %q", rec.Code, body, c.code, c.want)
			}
			if cr, ok := c.body.(*countingReader); ok && cr.n > 64<<10 {
				t.Errorf("read %d bytes of the body", cr.n)
			}
			if rec.Code >= 400 {
				var e map[string]string
				if json.Unmarshal([]byte(body), &e) != nil || e["error"] == "" {
					t.Errorf("error body %q is not {\"error\": ...}", body)
				}
			}
			if rec.Code == http.StatusMethodNotAllowed && rec.Header().Get("Allow") != "GET, HEAD" {
				t.Errorf("Allow: %q", rec.Header().Get("Allow"))
			}
		})
	}
	srv := (&UI{}).Server()
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.WriteTimeout <= uiRequestBudget || srv.IdleTimeout <= 0 || srv.MaxHeaderBytes <= 0 || srv.MaxHeaderBytes > 64<<10 {
		t.Errorf("server bounds: %+v", srv)
	}
}

// TestUIServerOverTCP: the server of tabbyctl ui over a real connection —
// headers over its bound get 431, an 8 MiB body 413 without the server
// reading it all, and the page still answers after.
func TestUIServerOverTCP(t *testing.T) {
	u := &UI{Client: NewClient(storetest.New(t), nil), Agents: AgentTemplate{Template: "unix:///nonexistent/{node}.sock"}}
	srv := httptest.NewUnstartedServer(nil)
	srv.Config = u.Server()
	srv.Start()
	defer srv.Close()
	do := func(method, path string, body io.Reader, header string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, body)
		if err != nil {
			t.Fatal(err)
		}
		if header != "" {
			req.Header.Set("X-Big", header)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return resp.StatusCode, string(b)
	}
	if code, body := do(http.MethodGet, "/api/pods", nil, strings.Repeat("h", 64<<10)); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("huge header: %d %.200s", code, body)
	}
	if code, body := do(http.MethodGet, "/api/pods", strings.NewReader(strings.Repeat("b", 8<<20)), ""); code != http.StatusRequestEntityTooLarge || !strings.Contains(body, "takes none") {
		t.Errorf("8 MiB body: %d %.200s", code, body)
	}
	if code, body := do(http.MethodGet, "/", nil, ""); code != http.StatusOK || !strings.Contains(body, "<title>Tabby</title>") {
		t.Errorf("page after: %d %.200s", code, body)
	}
}
