package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/ctl"
)

// publish writes a node's status the way its agent does.
func publish(t *testing.T, h *harness, st api.AgentStatus) {
	t.Helper()
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.store.PutKV(context.Background(), ctl.StatusPrefix+st.Node, b, 0); err != nil {
		t.Fatal(err)
	}
}

func TestNodeStatus(t *testing.T) {
	h := newHarness(t)
	h.fail("node", "status") // nothing published yet
	h.ok("node", "status", "--all")
	nodes := h.file("nodes.yaml", `apiVersion: tabby.dev/v1
kind: Node
metadata: {name: node-1}
spec: {bgp: {ipv4Address: 198.18.0.11/24}}
---
apiVersion: tabby.dev/v1
kind: Node
metadata: {name: node-2}
spec: {bgp: {ipv4Address: 198.18.0.12/24}}
---
apiVersion: tabby.dev/v1
kind: Node
metadata: {name: node-3}
spec: {bgp: {ipv4Address: 198.18.0.13/24}}
`)
	h.ok("apply", "-f", nodes)
	up := fixedNow.Add(-10 * time.Minute)
	publish(t, h, api.AgentStatus{
		Node: "node-1", Address: "198.18.0.11/24", ASN: 64512, Workloads: 3,
		Peers: []api.PeerStatus{
			{Address: "198.18.0.12", Type: "mesh", State: "Established", Since: up},
			{Address: "198.18.0.1", Type: "global", State: "Active", Since: up.Add(time.Minute),
				Info: "notification received: notification-received code 6(cease) subcode 2(administrative shutdown)"},
			{Address: "198.18.0.13", Type: "mesh", State: "Connect"},
			{Address: "198.18.0.14", Type: "mesh", State: "Active", Since: up.Add(2 * time.Minute), Info: "hold timer expired: hold-timer-expired"},
		},
		Blocks: []string{"10.244.0.48/28"}, Advertised: []string{"10.244.0.48/28"},
	})
	publish(t, h, api.AgentStatus{
		Node: "node-2", Address: "198.18.0.12/24", ASN: 64512,
		Peers: []api.PeerStatus{{Address: "198.18.0.11", Type: "mesh", State: "Established", Since: up}},
	})
	h.ok("node", "status")
	h.ok("node", "status", "--node", "node-2")
	h.fail("node", "status", "--node", "node-3")
	h.fail("node", "status", "--node", "node-9")
	h.fail("node", "status", "--node", "node-1", "--all")
	h.ok("node", "status", "--all")
	h.golden("nodestatus")
}

// TestNodeStatusMaxPrefixAndBFD: a session shut down over its max-prefix
// limit says so whatever its state, and sessions running BFD show its state.
func TestNodeStatusMaxPrefixAndBFD(t *testing.T) {
	h := newHarness(t)
	h.ok("apply", "-f", h.file("node.yaml", "apiVersion: tabby.dev/v1\nkind: Node\nmetadata: {name: node-1}\nspec: {bgp: {ipv4Address: 198.18.0.11/24}}\n"))
	up := fixedNow.Add(-10 * time.Minute)
	publish(t, h, api.AgentStatus{
		Node: "node-1", Address: "198.18.0.11/24", ASN: 64512,
		Peers: []api.PeerStatus{
			{Address: "198.18.0.12", Type: "mesh", State: "Established", Since: up, BFD: "Up"},
			{Address: "198.18.0.1", Type: "global", State: "Idle", Since: up.Add(time.Minute),
				Info:                "notification sent: notification-sent code 6(cease) subcode 1(maximum number of prefixes reached)",
				PrefixLimitExceeded: true, Received: 10001, MaxPrefixes: 10000},
			{Address: "198.18.0.2", Type: "global", State: "Active", Since: up.Add(2 * time.Minute), BFD: "Down",
				Info: "admin down: bfd"},
		},
	})
	h.ok("node", "status")
	h.golden("nodestatus-limits")
}

// TestNodeStatusFamilies: when a session carries IPv6 (MP-BGP on the IPv4
// session), a FAMILIES column shows what each session carries.
func TestNodeStatusFamilies(t *testing.T) {
	h := newHarness(t)
	h.ok("apply", "-f", h.file("node.yaml", "apiVersion: tabby.dev/v1\nkind: Node\nmetadata: {name: node-1}\nspec: {bgp: {ipv4Address: 198.18.0.11/24, ipv6Address: 2001:db8::11/64}}\n"))
	up := fixedNow.Add(-10 * time.Minute)
	publish(t, h, api.AgentStatus{
		Node: "node-1", Address: "198.18.0.11/24", ASN: 64512,
		Peers: []api.PeerStatus{
			{Address: "198.18.0.12", Type: "mesh", State: "Established", Since: up, Families: []string{"ipv4", "ipv6"}},
			{Address: "198.18.0.13", Type: "mesh", State: "Established", Since: up, Families: []string{"ipv4"}},
			{Address: "198.18.0.14", Type: "mesh", State: "Active", Since: up},
		},
	})
	h.ok("node", "status")
	h.golden("nodestatus-families")
}
