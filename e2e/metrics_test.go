package e2e

import (
	"context"
	"net/http"
	"regexp"
	"strconv"
	"testing"

	"github.com/tabbynet/tabby/lab"
)

// agentGet fetches path from a node's agent over its status socket.
func agentGet(t *testing.T, l *lab.Lab, node, path string) (int, string) {
	t.Helper()
	code, body, err := l.AgentGet(context.Background(), node, path)
	if err != nil {
		t.Fatal(err)
	}
	return code, string(body)
}

var addCount = regexp.MustCompile(`(?m)^tabby_cni_operation_duration_seconds_count\{op="add"\} (\d+)$`)

// testHealthAndMetrics: every agent is live and ready, and its CNI latency
// histogram counts the pods created on its node.
func testHealthAndMetrics(t *testing.T, l *lab.Lab) {
	pods := map[string]int{}
	for _, p := range l.State().Pods {
		pods[p.Node]++
	}
	for _, n := range l.State().Nodes {
		for _, path := range []string{"/healthz", "/readyz"} {
			if code, body := agentGet(t, l, n.Name, path); code != http.StatusOK {
				t.Errorf("%s %s: %d %s", n.Name, path, code, body)
			}
		}
		code, body := agentGet(t, l, n.Name, "/metrics")
		if code != http.StatusOK {
			t.Fatalf("%s /metrics: %d", n.Name, code)
		}
		m := addCount.FindStringSubmatch(body)
		if m == nil {
			t.Errorf("%s /metrics has no CNI ADD histogram", n.Name)
			continue
		}
		got, _ := strconv.Atoi(m[1])
		if got < pods[n.Name] {
			t.Errorf("%s counted %d CNI ADDs, but %d pods were created on it", n.Name, got, pods[n.Name])
		}
		for _, metric := range []string{"tabby_bgp_peers", "tabby_routes_installed", "tabby_reconcile_duration_seconds"} {
			if !regexp.MustCompile(`(?m)^` + metric).MatchString(body) {
				t.Errorf("%s /metrics lacks %s", n.Name, metric)
			}
		}
	}
}
