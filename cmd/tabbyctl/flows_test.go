package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
)

// fakeAgent serves recs on GET /flows, filtered as an agent does.
func fakeAgent(t *testing.T, recs ...api.FlowRecord) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, err := api.ParseFlowFilter(r.URL.Query())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rec := range recs {
			if f.Matches(rec) {
				_ = json.NewEncoder(w).Encode(rec)
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestFlowsMergesNodes(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	rec := func(node string, end time.Duration, action string, pol api.FlowPolicyRule) api.FlowRecord {
		return api.FlowRecord{Node: node, Start: t0, End: t0.Add(end), Proto: "tcp", Action: action, Policy: pol,
			SrcAddr: netip.MustParseAddr("10.244.1.2"), SrcPort: 40000, DstAddr: netip.MustParseAddr("10.244.2.3"), DstPort: 80,
			Src: api.FlowEndpoint{Kind: "pod", Namespace: "dev", Name: "client"}, Dst: api.FlowEndpoint{Kind: "pod", Namespace: "prod", Name: "web"}, Reporter: "dst"}
	}
	np := api.FlowPolicyRule{Kind: "NetworkPolicy", Namespace: "prod", Name: "web", Direction: "ingress", Index: 0, Action: "Allow"}
	a := fakeAgent(t, rec("n1", 2*time.Second, "allow", np))
	b := fakeAgent(t, rec("n2", time.Second, "deny", api.FlowPolicyRule{Direction: "ingress", Index: -1, Action: "Deny"}), rec("n2", 3*time.Second, "allow", np))
	h := newOfflineHarness(t)
	out := h.ok("flows", "--agent", "n1="+a.URL, "--agent", "n2="+b.URL, "-o", "json")
	var nodes []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var r api.FlowRecord
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		nodes = append(nodes, r.Node+"/"+r.Action)
	}
	if got, want := strings.Join(nodes, " "), "n2/deny n1/allow n2/allow"; got != want {
		t.Errorf("merged order %q, want %q", got, want)
	}
	out = h.ok("flows", "--agent", "n1="+a.URL, "--agent", "n2="+b.URL, "--action", "deny")
	if !strings.Contains(out, "(default)") || !strings.Contains(out, "ingress/-1/Deny") || strings.Contains(out, "allow") {
		t.Errorf("deny table:\n%s", out)
	}
	out = h.ok("flows", "--agent", "n2="+b.URL, "--policy", "prod/web", "--pod", "prod/web")
	if !strings.Contains(out, "prod/web") || strings.Contains(out, "deny") {
		t.Errorf("policy table:\n%s", out)
	}
}

func TestFlowsBadInput(t *testing.T) {
	h := newOfflineHarness(t)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--action", "drop", "--agent", "n=http://x:1"}, `action: "drop" is not allow or deny`},
		{[]string{"--since", "yesterday", "--agent", "n=http://x:1"}, `--since "yesterday"`},
		{[]string{"--pod", "a/b/c", "--agent", "n=http://x:1"}, `pod: "a/b/c" is not`},
		{[]string{"--namespace", "Prod", "--policy", "x y", "--agent", "n=http://x:1"}, "namespace: \"Prod\" must be a DNS-1123 label"},
		{[]string{"--agent", "nonode"}, `agent "nonode": want node=`},
		{[]string{"--agent", "n=ftp://x"}, `is not unix:///path or http://host:port`},
		{[]string{"-o", "yaml", "--agent", "n=http://x:1"}, `--output "yaml"`},
	} {
		err := h.fail(append([]string{"flows"}, tt.args...)...)
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: error %q, want %q", tt.args, err, tt.want)
		}
	}
}
