package ctl

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/api"
)

func TestWriteNodeStatusTunnels(t *testing.T) {
	st := api.AgentStatus{Node: "node1", Address: "198.18.0.11/24", ASN: 64512, Tunnels: []api.TunnelStatus{
		{Device: "vxlan.tabby", Mode: "CrossSubnet", Addr: netip.MustParseAddr("10.244.0.0"), MAC: "66:a0:1b:2c:3d:4e", VNI: 4096, Port: 4789, MTU: 1450,
			Peers: 2, Routes: 1, Paths: []api.TunnelPath{{Dst: netip.MustParsePrefix("10.244.1.0/26"), Via: netip.MustParseAddr("10.244.1.0"), Node: "node2"}},
			Direct: []string{"node3"}, Native: []string{"node4"}},
		{Device: "vxlan-v6.tabby", Mode: "off"},
	}}
	var b strings.Builder
	if err := WriteNodeStatus(&b, st); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"VXLAN vxlan.tabby: CrossSubnet, address 10.244.0.0, MAC 66:a0:1b:2c:3d:4e, VNI 4096, port 4789, MTU 1450; 2 peers, 1 tunnelled route\n",
		"  10.244.1.0/26 via 10.244.1.0 dev vxlan.tabby onlink   (node2)\n",
		"  native (same subnet, CrossSubnet): node3\n",
		"  native until they have a tunnel: node4\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("node status lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "vxlan-v6") {
		t.Errorf("a tunnel that is off is shown:\n%s", b.String())
	}
}

func TestTunnelledPath(t *testing.T) {
	node := func(name, addr, tun string) *api.Node {
		return &api.Node{Metadata: api.ObjectMeta{Name: name}, Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: addr},
			IPv4VXLANTunnelAddr: tun, VXLANTunnelMACAddr: map[bool]string{true: "66:a0:1b:2c:3d:4e"}[tun != ""]}}
	}
	cl := &cluster{nodes: map[string]*api.Node{
		"node1": node("node1", "198.18.0.11/24", "10.244.0.0"),
		"node2": node("node2", "198.18.1.12/24", "10.244.1.0"),
		"node3": node("node3", "198.18.0.13/24", "10.244.2.0"),
		"node4": node("node4", "198.18.1.14/24", ""),
	}}
	pod := netip.MustParseAddr("10.244.0.5")
	for _, tc := range []struct {
		mode        api.VXLANMode
		from, owner string
		want        string // "" = native
	}{
		{api.VXLANModeAlways, "node3", "node1", "10.244.0.0"},
		{api.VXLANModeCrossSubnet, "node3", "node1", ""},
		{api.VXLANModeCrossSubnet, "node2", "node1", "10.244.0.0"},
		{api.VXLANModeNever, "node2", "node1", ""},
		{api.VXLANModeAlways, "node1", "node4", ""}, // no tunnel recorded: native
	} {
		cl.ippools = []*api.IPPool{{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", VXLANMode: tc.mode}}}
		via, ok := cl.tunnelled(tc.from, tc.owner, pod)
		got := ""
		if ok {
			got = via.String()
		}
		if got != tc.want {
			t.Errorf("%s %s -> %s: via %q, want %q", tc.mode, tc.from, tc.owner, got, tc.want)
		}
	}
}
