package policy

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/tabbynet/tabby/api"
)

// Traffic from a pod to its own node goes through the pod's anti-spoofing
// check and egress policy, then the endpoint-to-host action; the protected
// ports are dropped whatever the action; replies to connections the node
// opened (kubelet probes) pass; traffic not from a workload is untouched.
func TestPodToHost(t *testing.T) {
	pod := testPod{name: "a", ns: "prod", node: "n1", ips: []string{"10.244.1.1"}, labels: map[string]string{"app": "web"}}
	host := netip.MustParseAddr("198.18.0.11")
	from := func(src string, dport int, est bool) packet {
		return packet{src: netip.MustParseAddr(src), dst: host, proto: "tcp", sport: 40000, dport: dport, in: pod.iface(), established: est}
	}
	ssh := from("10.244.1.1", 22, false)
	etcd := from("10.244.1.1", 2379, false)
	gobgp := from("10.244.1.1", 50051, false)
	probeReply := from("10.244.1.1", 35000, true)
	spoofed := from("10.244.9.9", 22, false)
	spoofedReply := from("10.244.9.9", 35000, true)
	fromUplink := packet{src: netip.MustParseAddr("198.18.0.12"), dst: host, proto: "tcp", sport: 40000, dport: 2379, in: "eth0"}

	allowHostEgress := np("prod", "to-nodes", api.NetworkPolicySpec{PodSelector: *sel("app", "web"),
		PolicyTypes: []api.PolicyType{api.PolicyTypeEgress},
		Egress:      []api.NetworkPolicyEgressRule{{To: []api.NetworkPolicyPeer{{IPBlock: &api.IPBlock{CIDR: "198.18.0.0/15"}}}}}})
	denyEgress := denyAllEgress("prod")

	type tc struct {
		pkt  packet
		want verdict
	}
	tests := []struct {
		name   string
		action string
		nps    []*api.NetworkPolicy
		cases  map[string]tc
	}{
		{"default (Drop)", "", nil, map[string]tc{
			"ssh": {ssh, vDrop}, "etcd": {etcd, vDrop}, "gobgp": {gobgp, vDrop},
			"probe reply": {probeReply, vAccept}, "spoofed": {spoofed, vDrop}, "spoofed reply": {spoofedReply, vDrop},
			"from the uplink": {fromUplink, vAccept},
		}},
		{"Accept", EndpointToHostAccept, nil, map[string]tc{
			"ssh": {ssh, vAccept}, "etcd": {etcd, vDrop}, "gobgp": {gobgp, vDrop},
			"probe reply": {probeReply, vAccept}, "spoofed": {spoofed, vDrop}, "from the uplink": {fromUplink, vAccept},
		}},
		{"Return", EndpointToHostReturn, nil, map[string]tc{
			"ssh": {ssh, vAccept}, "etcd": {etcd, vDrop}, "spoofed": {spoofed, vDrop},
		}},
		{"Accept, egress denied", EndpointToHostAccept, []*api.NetworkPolicy{denyEgress}, map[string]tc{
			"ssh": {ssh, vDrop}, "etcd": {etcd, vDrop}, "probe reply": {probeReply, vAccept},
		}},
		{"Accept, egress to the nodes allowed", EndpointToHostAccept, []*api.NetworkPolicy{allowHostEgress}, map[string]tc{
			"ssh": {ssh, vAccept}, "etcd": {etcd, vDrop}, "gobgp": {gobgp, vDrop},
		}},
		{"Drop, egress to the nodes allowed", EndpointToHostDrop, []*api.NetworkPolicy{allowHostEgress}, map[string]tc{
			"ssh": {ssh, vDrop}, "probe reply": {probeReply, vAccept},
		}},
	}
	for _, tt := range tests {
		rs := Compile(Input{
			Node: "n1", Endpoints: []*api.WorkloadEndpoint{pod.endpoint()}, NetworkPolicies: tt.nps, Pools: pools[:1],
			EndpointToHostAction: tt.action,
			HostProtectedPorts:   []HostPort{{"tcp", 2379}, {"tcp", 50051}},
		})
		for name, c := range tt.cases {
			if got := input(t, rs, c.pkt); got != c.want {
				t.Errorf("%s: %s: %v, want %v", tt.name, name, got, c.want)
			}
		}
		// The forward path is unchanged by the host path.
		if got := forward(t, rs, packet{src: netip.MustParseAddr("10.244.1.1"), dst: netip.MustParseAddr("10.244.2.1"), proto: "tcp", sport: 1, dport: 80, in: pod.iface(), out: "eth0"}); tt.nps == nil && got != vAccept {
			t.Errorf("%s: pod to a remote pod: %v", tt.name, got)
		}
	}
	if rs := Compile(Input{Node: "n1", EndpointToHostAction: "Allow"}); len(rs.Warnings) == 0 {
		t.Error("an unknown endpoint-to-host action compiled without a warning")
	} else if got := fmt.Sprint(rs.Warnings); got == "" {
		t.Error("empty warning")
	}
}
