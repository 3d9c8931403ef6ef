package api

import (
	"strings"
	"testing"
)

func TestHostEndpointValidate(t *testing.T) {
	ok := func() *HostEndpoint {
		return &HostEndpoint{Metadata: ObjectMeta{Name: "node-1-eth0", Labels: map[string]string{"role": "edge"}},
			Spec: HostEndpointSpec{Node: "node-1", InterfaceName: "eth0", ExpectedIPs: []string{"198.18.0.11"}}}
	}
	if err := ok().Validate(); err != nil {
		t.Fatalf("valid endpoint: %v", err)
	}
	star := ok()
	star.Spec.InterfaceName = "*"
	if err := star.Validate(); err != nil {
		t.Fatalf("all-interfaces endpoint: %v", err)
	}
	tests := map[string]struct {
		mod  func(*HostEndpoint)
		want string
	}{
		"no node":        {func(h *HostEndpoint) { h.Spec.Node = "" }, "spec.node"},
		"no interface":   {func(h *HostEndpoint) { h.Spec.InterfaceName = "" }, "spec.interfaceName"},
		"workload iface": {func(h *HostEndpoint) { h.Spec.InterfaceName = "cali12345678901" }, "workload interface"},
		"lo":             {func(h *HostEndpoint) { h.Spec.InterfaceName = "lo" }, "lo is never policed"},
		"long iface":     {func(h *HostEndpoint) { h.Spec.InterfaceName = "averyverylongname0" }, "15 characters"},
		"bad ip":         {func(h *HostEndpoint) { h.Spec.ExpectedIPs = []string{"198.18.0.300"} }, "spec.expectedIPs[0]"},
		"namespace":      {func(h *HostEndpoint) { h.Metadata.Namespace = "x" }, "cluster-scoped"},
	}
	for name, tc := range tests {
		h := ok()
		tc.mod(h)
		err := h.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one mentioning %q", name, err, tc.want)
		}
	}
}

func TestAutoHostEndpoint(t *testing.T) {
	n := &Node{Metadata: ObjectMeta{Name: "node-2", Labels: map[string]string{"zone": "a"}}, Spec: NodeSpec{BGP: &NodeBGPSpec{IPv4Address: "198.18.0.12/24"}}}
	h := AutoHostEndpoint(n)
	if h.Metadata.Name != "node-2-auto-hep" || h.Spec.Node != "node-2" || !h.AllInterfaces() || !h.DefaultAllow() || h.Metadata.Labels["zone"] != "a" ||
		len(h.Spec.ExpectedIPs) != 1 || h.Spec.ExpectedIPs[0] != "198.18.0.12" {
		t.Errorf("auto host endpoint = %+v", h)
	}
	if err := h.Validate(); err != nil {
		t.Errorf("auto host endpoint invalid: %v", err)
	}
	n.Metadata.Labels["zone"] = "b"
	if h.Metadata.Labels["zone"] != "a" {
		t.Error("auto host endpoint shares the node's label map")
	}
}

func TestClusterConfiguration(t *testing.T) {
	objs, err := Decode([]byte(`apiVersion: tabby.dev/v1
kind: ClusterConfiguration
metadata: {name: default}
spec:
  autoHostEndpoints: Enabled
  failsafeInboundHostPorts: [{protocol: TCP, port: 22}, {protocol: UDP, port: 53, net: 198.18.0.0/24}]
  failsafeOutboundHostPorts: []
`))
	if err != nil {
		t.Fatal(err)
	}
	c, ok := objs[0].(*ClusterConfiguration)
	if !ok {
		t.Fatalf("decoded %T", objs[0])
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if !c.AutoHostEndpointsEnabled() || len(c.FailsafeInbound()) != 2 || len(c.FailsafeOutbound()) != 0 {
		t.Errorf("config = %+v", c.Spec)
	}
	var none *ClusterConfiguration
	if none.AutoHostEndpointsEnabled() || len(none.FailsafeInbound()) != len(DefaultFailsafeInbound) || len(none.FailsafeOutbound()) != len(DefaultFailsafeOutbound) {
		t.Error("nil configuration is not the defaults")
	}
	bad := &ClusterConfiguration{Metadata: ObjectMeta{Name: "other"}, Spec: ClusterConfigurationSpec{AutoHostEndpoints: "yes",
		FailsafeInboundHostPorts: &[]ProtoPort{{Protocol: "ICMP", Port: 0, Net: "x"}}}}
	err = bad.Validate()
	for _, want := range []string{"singleton", "autoHostEndpoints", "protocol", "port", "net"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not mention %q", err, want)
		}
	}
}

func TestGlobalNetworkPolicyHostFlags(t *testing.T) {
	g := &GlobalNetworkPolicy{Metadata: ObjectMeta{Name: "p"}, Spec: GlobalNetworkPolicySpec{PreDNAT: true, ApplyOnForward: true,
		Ingress: []Rule{{Action: ActionDeny}}}}
	if err := g.Validate(); err != nil {
		t.Fatalf("preDNAT ingress policy: %v", err)
	}
	g.Spec.ApplyOnForward = false
	g.Spec.Egress = []Rule{{Action: ActionDeny}}
	g.Spec.DoNotTrack = true
	err := g.Validate()
	for _, want := range []string{"applyOnForward", "ingress only", "doNotTrack"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not mention %q", err, want)
		}
	}
}
