package agent

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/policy"
)

// TestWhatifEvaluatesAppliedRules: GET /policy/evaluate answers from the
// Ruleset the policy owner applied (503 before), and refuses bad or huge
// queries with a 4xx that names the problem.
func TestWhatifEvaluatesAppliedRules(t *testing.T) {
	ctx := context.Background()
	store := storetest.New(t)
	mustCreate(t, store, &api.IPPool{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16"}})
	mustCreate(t, store, testWEP("node1", "prod", "web", "cali0000000001", "10.244.1.1", map[string]string{"app": "web"}))
	mustCreate(t, store, testWEP("node2", "prod", "client", "cali0000000002", "10.244.2.1", map[string]string{"app": "client"}))
	mustCreate(t, store, &api.NetworkPolicy{Metadata: api.ObjectMeta{Namespace: "prod", Name: "web"}, Spec: api.NetworkPolicySpec{
		PodSelector: api.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
		Ingress: []api.NetworkPolicyIngressRule{{From: []api.NetworkPolicyPeer{{PodSelector: &api.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
			Ports: []api.NetworkPolicyPort{{Port: &api.IntOrString{IntVal: 80}}}}},
	}})
	a := New(Default(), quietLog(), Deps{})
	a.cfg.NodeName = "node1"
	a.policy = newPolicyOwner("node1", startView(t, store), &fake.Firewall{}, quietLog())
	h := a.httpHandler()
	get := func(q string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/policy/evaluate?"+q, nil))
		return rec.Code, rec.Body.String()
	}
	pkt := func(port uint16) string {
		return policy.Packet{Src: netip.MustParseAddr("10.244.2.1"), Dst: netip.MustParseAddr("10.244.1.1"), Proto: "tcp",
			SrcPort: 40000, DstPort: port, In: "eth0", Out: "cali0000000001"}.Query("forward").Encode()
	}
	if code, body := get(pkt(80)); code != http.StatusServiceUnavailable || !strings.Contains(body, "not programmed") {
		t.Errorf("before a pass: %d %s", code, body)
	}
	if err := a.policy.sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		port   uint16
		accept bool
	}{{80, true}, {81, false}} {
		code, body := get(pkt(c.port))
		var nt policy.NodeTrace
		if code != http.StatusOK || json.Unmarshal([]byte(body), &nt) != nil {
			t.Fatalf("port %d: %d %s", c.port, code, body)
		}
		if nt.Node != "node1" || nt.Accepted != c.accept || len(nt.Traces) != 2 {
			t.Errorf("port %d: %+v, want accepted=%v after two hooks", c.port, nt, c.accept)
		}
		last := nt.Traces[len(nt.Traces)-1]
		if !strings.Contains(body, "tabby-tw-cali0000000001") || last.Accepted != c.accept {
			t.Errorf("port %d: trace does not go through the pod's ingress chain: %s", c.port, body)
		}
	}
	for _, c := range []struct {
		query string
		code  int
		want  string
	}{
		{"path=forward&src=10.244.2.1", http.StatusBadRequest, "dst:"},
		{"path=forward&src=%zz", http.StatusBadRequest, "malformed query"},
		{"src=" + strings.Repeat("1", 1<<16), http.StatusRequestURITooLong, "at most"},
	} {
		code, body := get(c.query)
		if code != c.code || !strings.Contains(body, c.want) || len(body) > 2000 {
			t.Errorf("%.60s: %d %.200s, want %d with %q", c.query, code, body, c.code, c.want)
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/policy/ruleset", nil))
	var rs policy.Ruleset
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &rs) != nil || !rs.Equal(a.policy.published.Load()) {
		t.Errorf("GET /policy/ruleset: %d, does not round-trip", rec.Code)
	}
}
