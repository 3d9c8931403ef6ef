package ctl

import (
	"context"
	"encoding/json"
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
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
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
		{"/nothing", http.StatusNotFound, ""},
	} {
		code, body := get(c.target)
		if code != c.code || !strings.Contains(body, c.want) || (c.target != "/" && len(body) > 4096) {
			t.Errorf("%.80s: %d %.300s, want %d with %q", c.target, code, body, c.code, c.want)
		}
		if code >= 400 && code != http.StatusNotFound {
			var e map[string]string
			if json.Unmarshal([]byte(body), &e) != nil || e["error"] == "" {
				t.Errorf("%.80s: error body %q is not {\"error\": ...}", c.target, body)
			}
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/api/pods", strings.NewReader("{bad json")))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", rec.Code)
	}
}
