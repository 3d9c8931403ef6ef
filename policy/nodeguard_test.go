package policy

import (
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
)

// guardCluster is the dual-stack test cluster with three nodes, a ToR
// peer of each family and the agent's health port.
func guardInput(t *testing.T, action string, nps ...*api.NetworkPolicy) Input {
	t.Helper()
	node := func(name, v4, v6 string) *api.Node {
		return &api.Node{Metadata: api.ObjectMeta{Name: name}, Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: v4, IPv6Address: v6}}}
	}
	nodes := []*api.Node{
		node("n1", "198.18.0.11/24", "fd00:198:18::11/64"),
		node("n2", "198.18.0.12/24", "fd00:198:18::12/64"),
		{Metadata: api.ObjectMeta{Name: "n3"}, Spec: api.NodeSpec{Addresses: []api.NodeAddress{{Address: "198.18.1.13", Type: "InternalIP"}}}},
	}
	peers := []*api.BGPPeer{
		{Metadata: api.ObjectMeta{Name: "tor"}, Spec: api.BGPPeerSpec{PeerIP: "198.18.0.1", ASNumber: 65000}},
		{Metadata: api.ObjectMeta{Name: "tor6"}, Spec: api.BGPPeerSpec{PeerIP: "[fd00:198:18::1]:1790", ASNumber: 65000}},
		{Metadata: api.ObjectMeta{Name: "mesh-select"}, Spec: api.BGPPeerSpec{PeerSelector: sel("rr", "true")}},
	}
	listen := uint16(1179)
	cfg := &api.BGPConfiguration{Spec: api.BGPConfigurationSpec{ListenPort: &listen}}
	in := cluster{nps: nps}.input6("n1")
	in.EndpointToHostAction = action
	in.Guard = NewNodeGuard(nodes, peers, cfg, []uint16{9099})
	return in
}

func TestNewNodeGuard(t *testing.T) {
	g := guardInput(t, "").Guard
	want := NodeGuard{
		NodeAddrs: []netip.Addr{
			netip.MustParseAddr("198.18.0.11"), netip.MustParseAddr("fd00:198:18::11"),
			netip.MustParseAddr("198.18.0.12"), netip.MustParseAddr("fd00:198:18::12"),
			netip.MustParseAddr("198.18.1.13"),
		},
		PeerAddrs: []netip.Addr{netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("fd00:198:18::1")},
		NodePorts: []uint16{179, 9099, 1179},
		PeerPorts: []uint16{179, 1790},
	}
	if diff := cmp.Diff(want, g, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("guard (-want +got):\n%s", diff)
	}
}

// A workload reaches no node's BGP or agent port and no peer's BGP port,
// in either family, whatever the endpoint-to-host action and whatever a
// policy allows; other ports and other destinations are untouched; traffic
// from the uplink is not the guard's business.
func TestNodeGuard(t *testing.T) {
	allowAll := np("prod", "allow-all-egress", api.NetworkPolicySpec{PodSelector: api.LabelSelector{},
		PolicyTypes: []api.PolicyType{api.PolicyTypeEgress},
		Egress:      []api.NetworkPolicyEgressRule{{}}})
	a, _ := findPod6("a") // on n1
	type tc struct {
		dst   string
		dport int
		input bool // to n1 itself
		want  verdict
	}
	cases := map[string]tc{
		"bgp to another node":           {"198.18.0.12", 179, false, vDrop},
		"bgp to another node v6":        {"fd00:198:18::12", 179, false, vDrop},
		"listen port of another node":   {"198.18.0.12", 1179, false, vDrop},
		"health port of another node":   {"198.18.0.12", 9099, false, vDrop},
		"health port of another node 6": {"fd00:198:18::12", 9099, false, vDrop},
		"bgp to a listed node address":  {"198.18.1.13", 179, false, vDrop},
		"bgp to its own node":           {"198.18.0.11", 179, true, vDrop},
		"bgp to its own node v6":        {"fd00:198:18::11", 179, true, vDrop},
		"bgp to the tor":                {"198.18.0.1", 179, false, vDrop},
		"peer port of the tor v6":       {"fd00:198:18::1", 1790, false, vDrop},
		"bgp to the tor v6":             {"fd00:198:18::1", 179, false, vDrop},
		"ssh to another node":           {"198.18.0.12", 22, false, vAccept},
		"https to another node v6":      {"fd00:198:18::12", 443, false, vAccept},
		"health port of the tor":        {"198.18.0.1", 9099, false, vAccept},
		"bgp outside the cluster":       {"203.0.113.7", 179, false, vAccept},
	}
	for _, action := range []string{EndpointToHostAccept, EndpointToHostReturn} {
		for _, nps := range [][]*api.NetworkPolicy{nil, {allowAll}} {
			rs := Compile(guardInput(t, action, nps...))
			for name, c := range cases {
				dst := netip.MustParseAddr(c.dst)
				pkt := packet{src: a.addrOf(t, FamilyOf(dst)), dst: dst, proto: "tcp", sport: 40000, dport: c.dport, in: a.iface(), out: "eth0"}
				run := forward
				if c.input {
					pkt.out = ""
					run = input
				}
				if got := run(t, rs, pkt); got != c.want {
					t.Errorf("action %s, %d policies, %s: %v, want %v", action, len(nps), name, got, c.want)
				}
			}
			fromUplink := packet{src: netip.MustParseAddr("198.18.0.12"), dst: netip.MustParseAddr("198.18.0.11"), proto: "tcp", sport: 40000, dport: 179, in: "eth0"}
			if got := input(t, rs, fromUplink); got != vAccept {
				t.Errorf("bgp from the uplink: %v", got)
			}
		}
	}
}

// natOutgoing never masquerades traffic to a cluster node, in either
// family; the node sets hold every node address of their family.
func TestNodeGuardNAT(t *testing.T) {
	rs := Compile(guardInput(t, ""))
	nat, _ := rs.Chain(TableNAT, ChainPostrouting)
	var got []string
	for _, r := range nat.Rules {
		got = append(got, r.String())
	}
	want := []string{
		"daddr @tabby-nodes return",
		"saddr @tabby-masq-pools daddr != @tabby-all-pools masquerade",
		"ip6 daddr @tabby-nodes6 return",
		"ip6 saddr @tabby-masq-pools6 ip6 daddr != @tabby-all-pools6 masquerade",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("postrouting (-want +got):\n%s", diff)
	}
	for name, want := range map[string][]string{
		SetNodes:     {"198.18.0.11/32", "198.18.0.12/32", "198.18.1.13/32"},
		SetNodes6:    {"fd00:198:18::11/128", "fd00:198:18::12/128"},
		SetBGPPeers:  {"198.18.0.1/32"},
		SetBGPPeers6: {"fd00:198:18::1/128"},
	} {
		s, ok := rs.Set(name)
		if !ok {
			t.Fatalf("no set %s", name)
		}
		if diff := cmp.Diff(want, s.Members()); diff != "" {
			t.Errorf("set %s (-want +got):\n%s", name, diff)
		}
	}
	// Without a guard (as in the other tests' inputs) nothing of it is
	// emitted.
	plain := Compile(cluster{}.input6("n1"))
	if _, ok := plain.Chain(TableFilter, ChainNodeGuard); ok {
		t.Error("guard chain without a guard")
	}
	if _, ok := plain.Set(SetNodes); ok {
		t.Error("node set without a guard")
	}
}

// The incremental Compiler gives what Compile gives while the guard
// changes under it (nodes join and leave, a peer appears, the guard goes
// away and comes back), and Equal sees each change.
func TestCompilerNodeGuard(t *testing.T) {
	in := benchInput(60, 30)
	cc := NewCompiler()
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, 0, byte(i)}) }
	var prev *Ruleset
	for step := range 12 {
		switch {
		case step == 9:
			in.Guard = NodeGuard{}
		case step%3 == 2:
			in.Guard.PeerAddrs = append(slices.Clone(in.Guard.PeerAddrs), netip.AddrFrom16([16]byte{0xfd, 0, 1, 0x98, 0, 0x18, 15: byte(step)}))
		default:
			in.Guard.NodeAddrs = append(slices.Clone(in.Guard.NodeAddrs), addr(step+1))
			in.Guard.NodePorts = []uint16{179, 9099}
		}
		got, want := cc.Compile(in), Compile(in)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d: Compiler differs from Compile (-got +want):\n%s", step, cmp.Diff(got.Lines(), want.Lines()))
		}
		if prev != nil && got.Equal(prev) {
			t.Fatalf("step %d: the guard changed and Equal saw nothing", step)
		}
		prev = got
	}
}
