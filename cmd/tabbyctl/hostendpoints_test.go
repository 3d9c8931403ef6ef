package main

import (
	"testing"

	"github.com/tabbynet/tabby/api"
)

// TestHostEndpoints: HostEndpoint and ClusterConfiguration go through get,
// apply and delete like the other kinds; applying a policy that would
// block failsafe ports on host endpoints says so (and that failsafes still
// win), for stored and automatic host endpoints; node status lists a host
// endpoint whose interface is missing.
func TestHostEndpoints(t *testing.T) {
	h := newHarness(t)
	m := h.file("heps.yaml", `apiVersion: tabby.dev/v1
kind: Node
metadata: {name: node-1, labels: {role: worker}}
spec: {bgp: {ipv4Address: 198.18.0.11/24}}
---
apiVersion: tabby.dev/v1
kind: HostEndpoint
metadata: {name: node-1-eth9, labels: {role: edge}}
spec: {node: node-1, interfaceName: eth9, expectedIPs: [198.18.0.11]}
`)
	h.ok("apply", "-f", m)
	h.ok("get", "heps", "-o", "wide")
	h.fail("apply", "-f", h.file("bad.yaml", `apiVersion: tabby.dev/v1
kind: HostEndpoint
metadata: {name: bad}
spec: {node: node-1, interfaceName: cali0123456789a}
`))
	edge := h.file("edge-deny.yaml", `apiVersion: tabby.dev/v1
kind: GlobalNetworkPolicy
metadata: {name: edge-deny}
spec:
  selector: {matchLabels: {role: edge}}
  ingress: [{action: Deny, protocol: TCP, destination: {ports: [22]}}, {action: Allow}]
`)
	h.ok("apply", "-f", edge)
	// Workers have no host endpoint until automatic ones are enabled.
	workers := h.file("workers.yaml", `apiVersion: tabby.dev/v1
kind: GlobalNetworkPolicy
metadata: {name: workers-default-deny}
spec: {selector: {matchLabels: {role: worker}}, types: [Ingress]}
`)
	h.ok("apply", "-f", workers)
	h.ok("apply", "-f", h.file("cc.yaml", `apiVersion: tabby.dev/v1
kind: ClusterConfiguration
metadata: {name: default}
spec:
  autoHostEndpoints: Enabled
  failsafeInboundHostPorts: [{protocol: TCP, port: 22}, {protocol: TCP, port: 179}]
`))
	h.ok("get", "clusterconfig", "-o", "wide")
	h.ok("apply", "-f", workers)
	h.ok("apply", "-f", h.file("pre.yaml", `apiVersion: tabby.dev/v1
kind: GlobalNetworkPolicy
metadata: {name: nodeport}
spec: {selector: {matchLabels: {role: worker}}, preDNAT: true, applyOnForward: true, ingress: [{action: Deny, protocol: TCP, destination: {ports: [30080]}}]}
`))
	h.fail("apply", "-f", h.file("notrack.yaml", `apiVersion: tabby.dev/v1
kind: GlobalNetworkPolicy
metadata: {name: notrack}
spec: {selector: {matchLabels: {role: worker}}, doNotTrack: true, applyOnForward: true}
`))
	publish(t, h, api.AgentStatus{Node: "node-1", Address: "198.18.0.11/24", ASN: 64512,
		HostEndpoints: []api.HostEndpointStatus{{Name: "node-1-auto-hep", Interface: "*", State: api.HostEndpointPoliced},
			{Name: "node-1-eth9", Interface: "eth9", State: api.HostEndpointNoInterface}}})
	h.ok("node", "status", "--node", "node-1")
	h.ok("delete", "hep", "node-1-eth9")
	h.ok("get", "hep")
	h.golden("hostendpoints")
}
