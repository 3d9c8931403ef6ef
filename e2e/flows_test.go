package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/ctl"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
)

// flowWant is a record some node must show for a connection.
type flowWant struct {
	node, action string
	port         uint16
	policy       string // PolicyName
	dir          string
	index        int
}

// TestFlowLogs, on each firewall backend: a NetworkPolicy allows one
// connection and denies another; every node involved shows both with the
// deciding policy and rule, within 2 s of the connection (measured; the
// assert is generous for a loaded machine). Then a flood of short flows:
// the buffers stay bounded, drops are counted, the default deny's rule
// counter moved and the agents keep serving. WebView (nftables) shows the
// same in headless Chromium (webview_test.go).
func TestFlowLogs(t *testing.T) {
	for _, b := range []struct{ backend, lab string }{
		{dataplane.FirewallNFTables, "flw"},
		{dataplane.FirewallIPTables, "flwi"},
	} {
		t.Run(b.backend, func(t *testing.T) { testFlowLogs(t, b.backend, b.lab) })
	}
}

func testFlowLogs(t *testing.T, backend, name string) {
	l := upLab(t, lab.Options{Name: name, Nodes: 2, AgentArgs: []string{"--firewall-backend", backend,
		"--flow-logs", "all", "--flow-log-interval", "500ms", "--flow-log-max-flows", "400", "--flow-log-max-records", "2000"}})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cli, err := l.AddPod(ctx, "node1", "fcli", lab.PodOptions{Namespace: "fl", Labels: map[string]string{"app": "client"}})
	if err != nil {
		t.Fatal(err)
	}
	web, err := l.AddPod(ctx, "node2", "fweb", lab.PodOptions{Namespace: "fl", Labels: map[string]string{"app": "web"}})
	if err != nil {
		t.Fatal(err)
	}
	webIP := web.IPs[0].Addr()
	startPolicyServer(t, l, "fweb", "fweb", []int{80, 81}, nil)
	tcp := func(p int32) api.NetworkPolicyPort {
		return api.NetworkPolicyPort{Protocol: strp("TCP"), Port: &api.IntOrString{IntVal: p}}
	}
	t.Cleanup(func() { deleteAllPolicies(t, l) })
	setPolicies(ctx, t, l, []api.Object{
		netpol("fl", "web-in", api.NetworkPolicySpec{PodSelector: *labels("app", "web"),
			Ingress: []api.NetworkPolicyIngressRule{{From: []api.NetworkPolicyPeer{{PodSelector: labels("app", "client")}}, Ports: []api.NetworkPolicyPort{tcp(80)}}}}),
		netpol("fl", "cli-out", api.NetworkPolicySpec{PodSelector: *labels("app", "client"), PolicyTypes: []api.PolicyType{api.PolicyTypeEgress},
			Egress: []api.NetworkPolicyEgressRule{{To: []api.NetworkPolicyPeer{{PodSelector: labels("app", "web")}}, Ports: []api.NetworkPolicyPort{tcp(80), tcp(81)}}}}),
	})
	testkit.Eventually(t, 30*time.Second, "policy in force", func() error {
		if r := probeFrom(ctx, t, l, "fcli", "tcp", netip.AddrPortFrom(webIP, 80)); !r.allowed {
			return fmt.Errorf("port 80 not allowed yet (%v)", r.err)
		}
		if r := probeFrom(ctx, t, l, "fcli", "tcp", netip.AddrPortFrom(webIP, 81)); r.allowed {
			return fmt.Errorf("port 81 not denied yet")
		}
		return nil
	})
	agents := []ctl.AgentEndpoint{
		{Node: "node1", URL: "unix://" + filepath.Join(l.NodeDir("node1"), "status.sock")},
		{Node: "node2", URL: "unix://" + filepath.Join(l.NodeDir("node2"), "status.sock")},
	}
	wants := []flowWant{
		{"node2", api.FlowAllow, 80, "fl/web-in", "ingress", 0},
		{"node2", api.FlowDeny, 81, "(default)", "ingress", -1},
		{"node1", api.FlowAllow, 80, "fl/cli-out", "egress", 0},
		{"node1", api.FlowAllow, 81, "fl/cli-out", "egress", 0},
	}
	// Fresh connections from fixed source ports, so that only these
	// match (the probes above used others).
	since := time.Now()
	sent := map[uint16]time.Time{}
	for _, port := range []uint16{80, 81} {
		sent[port] = time.Now()
		go dialFrom(netnsPath(t, l, "fcli"), netip.AddrPortFrom(cli.IPs[0].Addr(), 40000+port), netip.AddrPortFrom(webIP, port))
	}
	seen := map[int]time.Duration{}
	testkit.EventuallyEvery(t, 20*time.Second, 50*time.Millisecond, "flows on every node", func() error {
		recs, err := ctl.QueryFlows(ctx, agents, api.FlowFilter{Namespace: "fl", Since: since})
		if err != nil {
			return err
		}
		now := time.Now()
		for i, w := range wants {
			if _, ok := seen[i]; ok {
				continue
			}
			for _, r := range recs {
				if r.Node == w.node && r.Action == w.action && r.DstPort == w.port && r.SrcPort == 40000+w.port &&
					r.Policy.PolicyName() == w.policy && r.Policy.Direction == w.dir && r.Policy.Index == w.index &&
					r.Src.Name == "fcli" && r.Dst.Name == "fweb" {
					seen[i] = now.Sub(sent[w.port])
				}
			}
		}
		if len(seen) < len(wants) {
			return fmt.Errorf("seen %d of %d records: %v", len(seen), len(wants), recs)
		}
		return nil
	})
	for i, w := range wants {
		t.Logf("flow record %s %s :%d %s %s/%d seen after %v", w.node, w.action, w.port, w.policy, w.dir, w.index, seen[i])
		if seen[i] > 2*time.Second {
			t.Logf("warning: over the 2 s target (a loaded machine?)")
		}
	}
	// The same through the tabbyctl binary, JSON lines.
	out, err := tabbyctl(t, l, "flows", "--agent", "node1="+agents[0].URL, "--agent", "node2="+agents[1].URL,
		"--action", "deny", "--pod", "fl/fweb", "--since", since.UTC().Format(time.RFC3339Nano), "-o", "json")
	if err != nil || !strings.Contains(out, `"action":"deny"`) || !strings.Contains(out, `"dstPort":81`) || strings.Contains(out, `"action":"allow"`) {
		t.Errorf("tabbyctl flows --action deny: %v\n%s", err, out)
	}
	if out, err := tabbyctl(t, l, "flows", "--agent", "node1="+agents[0].URL, "--action", "maybe"); err == nil || !strings.Contains(out, `action: "maybe" is not allow or deny`) {
		t.Errorf("malformed filter: %v\n%s", err, out)
	}
	if code, body, err := l.AgentGet(ctx, "node2", "/flows?pod="+strings.Repeat("x", 5000)); err != nil || code != 400 || !strings.Contains(string(body), "longer than") {
		t.Errorf("hostile query: %d %v %s", code, err, body)
	}
	if backend == dataplane.FirewallNFTables {
		t.Run("WebView", func(t *testing.T) { testWebView(ctx, t, l) })
	}
	t.Run("Flood", func(t *testing.T) { testFlowFlood(ctx, t, l, agents, webIP) })
}

// dialFrom connects once from the namespace at nsPath, from src to dst,
// and closes.
func dialFrom(nsPath string, src, dst netip.AddrPort) {
	_ = ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(src)}
		c, err := d.Dial("tcp", dst.String())
		if err == nil {
			c.Close()
		}
		return nil
	})
}

// testFlowFlood sends thousands of short denied flows (UDP, a new source
// port each) and short allowed TCP connections: the agents' flow tables
// stay bounded, count what they dropped and keep serving.
func testFlowFlood(ctx context.Context, t *testing.T, l *lab.Lab, agents []ctl.AgentEndpoint, webIP netip.Addr) {
	start := time.Now()
	if err := ns.WithNetNSPath(netnsPath(t, l, "fcli"), func(ns.NetNS) error {
		for range 3000 {
			c, err := net.Dial("udp", netip.AddrPortFrom(webIP, 81).String())
			if err != nil {
				return err
			}
			_, _ = c.Write([]byte("x"))
			c.Close()
		}
		for range 200 {
			c, err := net.DialTimeout("tcp", netip.AddrPortFrom(webIP, 80).String(), 2*time.Second)
			if err == nil {
				c.Close()
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("flood sent in %v", time.Since(start))
	// The UDP flood is denied by fcli's egress policy on node1 (cli-out
	// allows TCP only): node1's table fills.
	testkit.Eventually(t, 20*time.Second, "flow drops counted on node1", func() error {
		code, body, err := l.AgentGet(ctx, "node1", "/metrics")
		if err != nil || code != 200 {
			return fmt.Errorf("metrics: %d %v", code, err)
		}
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, "tabby_flowlog_flows_dropped_total ") && line != "tabby_flowlog_flows_dropped_total 0" {
				t.Log(line)
				return nil
			}
		}
		return fmt.Errorf("no drops counted yet")
	})
	recs, err := ctl.QueryFlows(ctx, agents, api.FlowFilter{})
	if err != nil {
		t.Fatalf("agents stopped serving: %v", err)
	}
	perNode := map[string]int{}
	for _, r := range recs {
		perNode[r.Node]++
	}
	for n, c := range perNode {
		if c > 2000 {
			t.Errorf("node %s holds %d records, more than --flow-log-max-records 2000", n, c)
		}
	}
	code, body, err := l.AgentGet(ctx, "node1", "/metrics")
	// The default deny at the end of the egress policies (tier "default"
	// since tiers: the tier label is not pinned here).
	if err != nil || code != 200 || !strings.Contains(string(body), `tabby_policy_rule_packets_total{action="Deny",direction="egress",kind="",namespace="",policy="",rule="-1",tier=`) {
		t.Errorf("rule counters: %d %v: no default-deny egress counter in\n%s", code, err, grepLines(string(body), "tabby_policy_rule_packets_total"))
	}
	t.Logf("records held: %v", perNode)
}

// grepLines is the lines of s that start with prefix.
func grepLines(s, prefix string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
