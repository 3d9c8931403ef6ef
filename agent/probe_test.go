package agent

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/policy"
)

// recordingProber answers every probe "connected" and keeps the specs.
type recordingProber struct {
	mu    sync.Mutex
	specs []dataplane.ProbeSpec
}

func (p *recordingProber) probe(_ context.Context, s dataplane.ProbeSpec) (dataplane.ProbeResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.specs = append(p.specs, s)
	return dataplane.ProbeResult{Outcome: dataplane.ProbeConnected, Passed: true}, nil
}

func (p *recordingProber) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.specs)
}

// countingFirewall is a fake firewall with per-rule counters.
type countingFirewall struct {
	fake.Firewall
	counters []dataplane.RuleCounter
}

func (f *countingFirewall) RuleCounters(context.Context) ([]dataplane.RuleCounter, error) {
	return f.counters, nil
}

func probeTestAgent(t *testing.T, fw dataplane.Firewall) (*Agent, *recordingProber, http.Handler) {
	t.Helper()
	store := storetest.New(t)
	mustCreate(t, store, &api.IPPool{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16"}})
	mustCreate(t, store, &api.Node{Metadata: api.ObjectMeta{Name: "node2"}, Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: "198.18.0.3/24"}}})
	mustCreate(t, store, testWEP("node1", "prod", "client", "cali0000000002", "10.244.1.2", nil))
	mustCreate(t, store, testWEP("node2", "prod", "web", "cali0000000001", "10.244.2.1", nil))
	p := &recordingProber{}
	a := New(Default(), quietLog(), Deps{Prober: p.probe, Firewall: fw})
	a.cfg.NodeName = "node1"
	a.policy = newPolicyOwner("node1", startView(t, store), fw, quietLog())
	return a, p, a.httpHandler()
}

func postProbe(h http.Handler, body string) (int, string) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/policy/probe", strings.NewReader(body)))
	return rec.Code, rec.Body.String()
}

// TestProbeHandler: POST /policy/probe sends a probe only from a pod on
// this node to an address inside the cluster, and refuses everything else
// with a 4xx naming the field, before any packet leaves.
func TestProbeHandler(t *testing.T) {
	_, p, h := probeTestAgent(t, &fake.Firewall{})
	for _, c := range []struct {
		name, body string
		code       int
		want       string
	}{
		{"pod to pod", `{"namespace":"prod","pod":"client","dst":"10.244.2.1","proto":"tcp","port":80}`, 200, `"outcome":"connected"`},
		{"pod to node", `{"namespace":"prod","pod":"client","dst":"198.18.0.3","proto":"udp","port":53,"timeoutMs":500}`, 200, `"src":"10.244.1.2"`},
		{"unknown pod", `{"namespace":"prod","pod":"nobody","dst":"10.244.2.1","proto":"tcp","port":80}`, 404, "no workload endpoint on node node1"},
		{"pod of another node", `{"namespace":"prod","pod":"web","dst":"10.244.1.2","proto":"tcp","port":80}`, 404, "pod prod/web"},
		{"outside the cluster", `{"namespace":"prod","pod":"client","dst":"192.0.2.1","proto":"tcp","port":80}`, 403, "probes never leave the cluster"},
		{"node's neighbour", `{"namespace":"prod","pod":"client","dst":"198.18.0.4","proto":"tcp","port":80}`, 403, "dst: 198.18.0.4"},
		{"port zero", `{"namespace":"prod","pod":"client","dst":"10.244.2.1","proto":"tcp","port":0}`, 400, "port: 0"},
		{"port too big", `{"namespace":"prod","pod":"client","dst":"10.244.2.1","proto":"tcp","port":65536}`, 400, "port: 65536"},
		{"port a string", `{"namespace":"prod","pod":"client","dst":"10.244.2.1","proto":"tcp","port":"80/tcp"}`, 400, "ProbeRequest.port"},
		{"bad proto", `{"namespace":"prod","pod":"client","dst":"10.244.2.1","proto":"icmp","port":1}`, 400, "proto:"},
		{"bad dst", `{"namespace":"prod","pod":"client","dst":"10.244.2.300","proto":"tcp","port":80}`, 400, "dst:"},
		{"timeout", `{"namespace":"prod","pod":"client","dst":"10.244.2.1","proto":"tcp","port":80,"timeoutMs":60000}`, 400, "timeoutMs: 60000"},
		{"no pod", `{"dst":"10.244.2.1","proto":"tcp","port":80}`, 400, "namespace, pod"},
		{"unknown field", `{"namespace":"prod","pod":"client","dst":"10.244.2.1","proto":"tcp","port":80,"src":"1.2.3.4"}`, 400, "unknown field"},
		{"huge body", `{"namespace":"` + strings.Repeat("x", 1<<20) + `"}`, 400, "malformed probe request"},
	} {
		code, body := postProbe(h, c.body)
		if code != c.code || !strings.Contains(body, c.want) || len(body) > 2000 {
			t.Errorf("%s: %d %.300s, want %d with %q", c.name, code, body, c.code, c.want)
		}
	}
	want := []dataplane.ProbeSpec{
		{HostIf: "cali0000000002", Src: netip.MustParseAddr("10.244.1.2"), Dst: netip.MustParseAddrPort("10.244.2.1:80"), Proto: "tcp", Timeout: 2 * time.Second},
		{HostIf: "cali0000000002", Src: netip.MustParseAddr("10.244.1.2"), Dst: netip.MustParseAddrPort("198.18.0.3:53"), Proto: "udp", Timeout: 500 * time.Millisecond},
	}
	if diff := cmp.Diff(want, p.specs, cmp.Comparer(func(x, y netip.Addr) bool { return x == y }),
		cmp.Comparer(func(x, y netip.AddrPort) bool { return x == y })); diff != "" {
		t.Errorf("probes sent (-want +got):\n%s", diff)
	}
}

// TestProbeRateLimit: concurrent callers get probeBurst probes, then 429.
func TestProbeRateLimit(t *testing.T) {
	_, p, h := probeTestAgent(t, &fake.Firewall{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for range 3 * probeBurst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _ := postProbe(h, `{"namespace":"prod","pod":"client","dst":"10.244.2.1","proto":"tcp","port":80}`)
			mu.Lock()
			codes[code]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	// A few tokens may come back while the requests run (probeRate a second).
	if codes[http.StatusTooManyRequests] == 0 || codes[http.StatusOK] < probeBurst || codes[http.StatusOK] > probeBurst+5 || p.count() != codes[http.StatusOK] {
		t.Errorf("codes %v, %d probes sent: want %d (and a few refilled) 200s, the rest 429", codes, p.count(), probeBurst)
	}
	code, body := postProbe(h, `{"namespace":"prod","pod":"client","dst":"10.244.2.1","proto":"tcp","port":80}`)
	if code != http.StatusTooManyRequests || !strings.Contains(body, "too many probes") {
		t.Errorf("after the burst: %d %s", code, body)
	}
}

// TestRuleCountersAPI: GET /policy/counters sums the kernel's counters by
// Origin, and says so rather than fails on a firewall without them.
func TestRuleCountersAPI(t *testing.T) {
	get := func(h http.Handler) policy.RuleCounters {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/policy/counters", nil))
		var rc policy.RuleCounters
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &rc) != nil {
			t.Fatalf("GET /policy/counters: %d %s", rec.Code, rec.Body)
		}
		return rc
	}
	_, _, h := probeTestAgent(t, &fake.Firewall{})
	if rc := get(h); rc.Available || !strings.Contains(rc.Reason, "no per-rule counters") || rc.Node != "node1" {
		t.Errorf("without counters: %+v", rc)
	}
	deny := &policy.Origin{Kind: policy.OriginNamespaced, Namespace: "prod", Name: "web", Direction: policy.DirIngress, Index: -1, Action: "Deny"}
	allow := &policy.Origin{Kind: policy.OriginNamespaced, Namespace: "prod", Name: "web", Direction: policy.DirIngress, Index: 0, Action: "Allow"}
	fw := &countingFirewall{counters: []dataplane.RuleCounter{
		{Origin: deny, Packets: 2, Bytes: 120}, {Origin: allow, Packets: 5, Bytes: 300}, {Origin: deny, Packets: 1, Bytes: 60}, {Packets: 9},
	}}
	_, _, h = probeTestAgent(t, fw)
	want := policy.RuleCounters{Node: "node1", Available: true, Counters: []policy.OriginCount{{Origin: *deny, Packets: 3, Bytes: 180}, {Origin: *allow, Packets: 5, Bytes: 300}}}
	if diff := cmp.Diff(want, get(h)); diff != "" {
		t.Errorf("counters (-want +got):\n%s", diff)
	}
}
