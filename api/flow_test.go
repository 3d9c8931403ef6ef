package api

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestFlowRecordJSON(t *testing.T) {
	start := time.Date(2026, 12, 5, 23, 0, 0, 0, time.UTC)
	f := FlowRecord{
		Node: "n1", Start: start, End: start.Add(5 * time.Second), Proto: "tcp",
		SrcAddr: netip.MustParseAddr("10.244.1.2"), SrcPort: 40000, DstAddr: netip.MustParseAddr("10.244.2.3"), DstPort: 80,
		Src:    FlowEndpoint{Kind: FlowEndpointPod, Namespace: "prod", Name: "client", Labels: map[string]string{"app": "client"}},
		Dst:    FlowEndpoint{Kind: FlowEndpointExternal},
		Action: FlowDeny, Policy: FlowPolicyRule{Kind: "NetworkPolicy", Namespace: "prod", Name: "web", Direction: "ingress", Index: 0, Action: "Allow"},
		Packets: 3, Bytes: 180, Reporter: FlowReporterDst,
	}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"node":"n1","start":"2026-12-05T23:00:00Z","end":"2026-12-05T23:00:05Z","proto":"tcp","srcAddr":"10.244.1.2","srcPort":40000,"dstAddr":"10.244.2.3","dstPort":80,"src":{"kind":"pod","namespace":"prod","name":"client","labels":{"app":"client"}},"dst":{"kind":"external"},"action":"deny","policy":{"kind":"NetworkPolicy","namespace":"prod","name":"web","direction":"ingress","index":0,"action":"Allow"},"packets":3,"bytes":180,"reporter":"dst"}`
	if diff := cmp.Diff(want, string(b)); diff != "" {
		t.Errorf("json (-want +got):\n%s", diff)
	}
	var back FlowRecord
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(f, back, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	if f.Policy.PolicyName() != "prod/web" || (FlowPolicyRule{Index: -1, Direction: "ingress"}).PolicyName() != "(default)" || (FlowPolicyRule{}).PolicyName() != "" {
		t.Error("PolicyName")
	}
	none, _ := json.Marshal(FlowRecord{})
	var m map[string]any
	_ = json.Unmarshal(none, &m)
	if _, ok := m["policy"]; ok {
		t.Errorf("no policy still encoded: %s", none)
	}
}

func TestParseFlowFilter(t *testing.T) {
	since := time.Date(2026, 12, 5, 23, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name    string
		q       map[string][]string
		want    FlowFilter
		wantErr string
	}{
		{"empty", nil, FlowFilter{}, ""},
		{"all", map[string][]string{"pod": {"prod/web"}, "namespace": {"prod"}, "action": {"deny"}, "policy": {"prod/web-in"}, "since": {"2026-12-05T23:00:00Z"}},
			FlowFilter{Pod: "prod/web", Namespace: "prod", Action: "deny", Policy: "prod/web-in", Since: since}, ""},
		{"default policy", map[string][]string{"policy": {"(default)"}}, FlowFilter{Policy: "(default)"}, ""},
		{"bad action", map[string][]string{"action": {"drop"}}, FlowFilter{}, `action: "drop" is not allow or deny`},
		{"bad since", map[string][]string{"since": {"yesterday"}}, FlowFilter{}, `since: "yesterday" is not an RFC 3339 time`},
		{"unknown", map[string][]string{"pods": {"x"}}, FlowFilter{}, "pods: unknown filter"},
		{"twice", map[string][]string{"pod": {"a", "b"}}, FlowFilter{}, "pod: given 2 times"},
		{"bad pod", map[string][]string{"pod": {"a/b/c"}}, FlowFilter{}, `pod: "a/b/c" is not`},
		{"bad namespace", map[string][]string{"namespace": {"Prod"}}, FlowFilter{}, `namespace: "Prod" must be a DNS-1123 label`},
		{"hostile", map[string][]string{"pod": {strings.Repeat("a", 5000)}}, FlowFilter{}, "query: 5005 bytes is longer than 2048"},
		{"every problem", map[string][]string{"action": {"x"}, "since": {"y"}}, FlowFilter{}, "(2006-01-02T15:04:05Z)\naction: \"x\" is not allow or deny"},
	} {
		got, err := ParseFlowFilter(tt.q)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: error %v, want %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
		back, err := ParseFlowFilter(got.Query())
		if err != nil || !cmp.Equal(back, got) {
			t.Errorf("%s: Query round trip: %+v, %v", tt.name, back, err)
		}
	}
}

func TestFlowFilterMatches(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 23, 0, 0, 0, time.UTC)
	pod := func(ns, name string) FlowEndpoint {
		return FlowEndpoint{Kind: FlowEndpointPod, Namespace: ns, Name: name}
	}
	r := FlowRecord{End: t0, Src: pod("dev", "client"), Dst: pod("prod", "web"), Action: FlowDeny,
		Policy: FlowPolicyRule{Direction: "ingress", Index: -1, Action: "Deny"}}
	for _, tt := range []struct {
		f    FlowFilter
		want bool
	}{
		{FlowFilter{}, true},
		{FlowFilter{Action: FlowDeny}, true},
		{FlowFilter{Action: FlowAllow}, false},
		{FlowFilter{Namespace: "prod"}, true},
		{FlowFilter{Namespace: "kube-system"}, false},
		{FlowFilter{Pod: "prod/web"}, true},
		{FlowFilter{Pod: "web"}, true},
		{FlowFilter{Pod: "web", Namespace: "dev"}, false},
		{FlowFilter{Pod: "dev/web"}, false},
		{FlowFilter{Policy: "(default)"}, true},
		{FlowFilter{Policy: "prod/web"}, false},
		{FlowFilter{Since: t0}, true},
		{FlowFilter{Since: t0.Add(time.Nanosecond)}, false},
	} {
		if got := tt.f.Matches(r); got != tt.want {
			t.Errorf("%+v: Matches = %v, want %v", tt.f, got, tt.want)
		}
	}
}
