package dataplane

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/policy"
)

// iptLines renders a state as iptables-save-like lines per table, then
// ipset lines, chains in the renderer's order.
func iptLines(s IPTablesState) []string {
	var out []string
	for _, table := range []string{"filter", "nat"} {
		out = append(out, "*"+table)
		for _, j := range s.Jumps {
			if j.Table == table {
				out = append(out, fmt.Sprintf("-I %s -j %s", j.From, j.To))
			}
		}
		for _, c := range s.Chains {
			if c.Table == table {
				for _, r := range c.Rules {
					out = append(out, "-A "+c.Name+" "+strings.Join(r, " "))
				}
			}
		}
	}
	for _, set := range s.Sets {
		out = append(out, "create "+set.Name+" "+set.Type)
		for _, m := range set.Members {
			out = append(out, "add "+set.Name+" "+m)
		}
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// TestRenderIPTablesLayout pins the iptables rendering of a small node: the
// same rules the compiler emitted as iptables arguments before the neutral
// model.
func TestRenderIPTablesLayout(t *testing.T) {
	sel := func(k, v string) *api.LabelSelector {
		return &api.LabelSelector{MatchLabels: map[string]string{k: v}}
	}
	wep := func(name, node, ip, iface, app string) *api.WorkloadEndpoint {
		return &api.WorkloadEndpoint{Metadata: api.ObjectMeta{Name: name, Namespace: "prod", Labels: map[string]string{"app": app}},
			Spec: api.WorkloadEndpointSpec{Node: node, InterfaceName: iface, IPNetworks: []string{ip + "/32"},
				Ports: []api.EndpointPort{{Name: "http", Protocol: "TCP", Port: 8080}}}}
	}
	tcp := func(p api.IntOrString) api.NetworkPolicyPort {
		return api.NetworkPolicyPort{Protocol: ptr("TCP"), Port: &p}
	}
	in := policy.Input{
		HostProtectedPorts: []policy.HostPort{{Proto: "tcp", Port: 2379}, {Proto: "tcp", Port: 50051}},
		Node:               "n1",
		Endpoints:          []*api.WorkloadEndpoint{wep("a", "n1", "10.244.1.1", "calia", "web"), wep("b", "n2", "10.244.2.1", "calib", "client")},
		NetworkPolicies: []*api.NetworkPolicy{{Metadata: api.ObjectMeta{Namespace: "prod", Name: "web"}, Spec: api.NetworkPolicySpec{
			PodSelector: *sel("app", "web"),
			Ingress: []api.NetworkPolicyIngressRule{{From: []api.NetworkPolicyPeer{{PodSelector: sel("app", "client")}},
				Ports: []api.NetworkPolicyPort{tcp(api.FromInt(80)), tcp(api.FromInt(443)), tcp(api.FromString("http"))}}},
		}}},
		GlobalPolicies: []*api.GlobalNetworkPolicy{{Metadata: api.ObjectMeta{Name: "g"}, Spec: api.GlobalNetworkPolicySpec{
			Order: ptr(1.0), Egress: []api.Rule{
				{Action: api.ActionDeny, Protocol: ptr("UDP"), Destination: api.EntityRule{NotNets: []string{"10.0.0.0/8"}, Ports: []api.IntOrString{api.FromInt(53)}}},
				{Action: api.ActionAllow, Protocol: ptr("TCP"), Source: api.EntityRule{Ports: []api.IntOrString{api.FromString("1000:2000"), api.FromInt(3)}}},
			}}}},
		Pools: []*api.IPPool{{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", NATOutgoing: true}}},
	}
	rs := policy.Compile(in)
	if len(rs.Warnings) > 0 {
		t.Fatalf("warnings: %v", rs.Warnings)
	}
	var pi, po, clients, named, notNets string
	for _, c := range rs.Chains {
		switch {
		case strings.HasPrefix(c.Name, "tabby-pi-"):
			pi = c.Name
		case strings.HasPrefix(c.Name, "tabby-po-"):
			po = c.Name
		}
	}
	for _, s := range rs.Sets {
		switch {
		case strings.HasPrefix(s.Name, "tabby-s-"):
			clients = s.Name
		case strings.HasPrefix(s.Name, "tabby-p-"):
			named = s.Name
		case strings.HasPrefix(s.Name, "tabby-n-"):
			notNets = s.Name
		}
	}
	want := []string{
		"*filter",
		"-I FORWARD -j tabby-FORWARD",
		"-I INPUT -j tabby-INPUT",
		"-A tabby-FORWARD -i cali+ -j tabby-from-wl",
		"-A tabby-FORWARD -o cali+ -j tabby-to-wl",
		"-A tabby-FORWARD -i cali+ -j ACCEPT",
		"-A tabby-FORWARD -o cali+ -j ACCEPT",
		"-A tabby-INPUT -i cali+ -p tcp -m multiport --dports 2379,50051 -j DROP",
		"-A tabby-INPUT -i cali+ -j tabby-from-wl",
		"-A tabby-INPUT -i cali+ -j DROP",
		"-A tabby-from-wl -i calia -g tabby-fw-calia",
		"-A tabby-from-wl -j DROP",
		"-A tabby-fw-calia ! -s 10.244.1.1/32 -j DROP",
		"-A tabby-fw-calia -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
		"-A tabby-fw-calia -j MARK --set-xmark 0x0/0x10000",
		"-A tabby-fw-calia -j " + po,
		"-A tabby-fw-calia -m mark --mark 0x10000/0x10000 -j RETURN",
		"-A tabby-fw-calia -j DROP",
		"-A " + pi + " -m set --match-set " + clients + " src -p tcp -m multiport --dports 80,443 -j MARK --set-xmark 0x10000/0x10000",
		"-A " + pi + " -m set --match-set " + clients + " src -p tcp -m set --match-set " + named + " dst,dst -j MARK --set-xmark 0x10000/0x10000",
		"-A " + pi + " -m mark --mark 0x10000/0x10000 -j RETURN",
		"-A " + po + " -p udp -m set ! --match-set " + notNets + " dst -m udp --dport 53 -j DROP",
		"-A " + po + " -p tcp -m multiport --sports 1000:2000,3 -j MARK --set-xmark 0x10000/0x10000",
		"-A " + po + " -m mark --mark 0x10000/0x10000 -j RETURN",
		"-A tabby-to-wl -o calia -g tabby-tw-calia",
		"-A tabby-to-wl -j DROP",
		"-A tabby-tw-calia -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
		"-A tabby-tw-calia -j MARK --set-xmark 0x0/0x10000",
		"-A tabby-tw-calia -j " + pi,
		"-A tabby-tw-calia -m mark --mark 0x10000/0x10000 -j RETURN",
		"-A tabby-tw-calia -j DROP",
		"*nat",
		"-I POSTROUTING -j tabby-POSTROUTING",
		"-A tabby-POSTROUTING -m set --match-set tabby-masq-pools src -m set ! --match-set tabby-all-pools dst -j MASQUERADE",
		"create tabby-all-pools hash:net",
		"add tabby-all-pools 10.244.0.0/16",
		"create tabby-masq-pools hash:net",
		"add tabby-masq-pools 10.244.0.0/16",
		"create " + notNets + " hash:net",
		"add " + notNets + " 10.0.0.0/8",
		"create " + named + " hash:ip,port",
		"add " + named + " 10.244.1.1,tcp:8080",
		"create " + clients + " hash:net",
		"add " + clients + " 10.244.2.1/32",
	}
	if diff := cmp.Diff(want, iptLines(RenderIPTables(*rs))); diff != "" {
		t.Errorf("iptables rendering (-want +got):\n%s", diff)
	}
}

// TestRenderIPTablesFanout: with many endpoints the dispatch chains fan out
// by the character after "cali", each sub-chain ending in DROP.
func TestRenderIPTablesFanout(t *testing.T) {
	d := &policy.Dispatch{Out: true}
	for i := range 100 {
		iface := fmt.Sprintf("cali%011x", i*7919)
		d.Targets = append(d.Targets, policy.DispatchTarget{Iface: iface, Chain: "tabby-tw-" + iface})
	}
	st := RenderIPTables(FirewallState{Chains: []policy.Chain{{Table: "filter", Name: "tabby-to-wl", Dispatch: d}}})
	byName := map[string]IPTChain{}
	targets := 0
	for _, c := range st.Chains {
		byName[c.Name] = c
		if last := c.Rules[len(c.Rules)-1]; strings.Join(last, " ") != "-j DROP" {
			t.Errorf("%s ends in %v, want DROP", c.Name, last)
		}
	}
	top := byName["tabby-to-wl"]
	if len(top.Rules) > 17 {
		t.Errorf("top dispatch has %d rules, want at most 16 fan-out rules and a drop", len(top.Rules))
	}
	for _, r := range top.Rules[:len(top.Rules)-1] {
		sub := byName[r[3]]
		if r[0] != "-o" || r[2] != "-g" || len(sub.Rules) == 0 {
			t.Fatalf("fan-out rule %v", r)
		}
		for _, sr := range sub.Rules[:len(sub.Rules)-1] {
			if !strings.HasPrefix(sr[1], strings.TrimSuffix(r[1], "+")) {
				t.Errorf("%s in sub-chain %s", sr[1], sub.Name)
			}
			targets++
		}
	}
	if targets != 100 {
		t.Errorf("%d targets in sub-chains, want 100", targets)
	}
}

// TestRenderIP6TablesLayout pins the ip6tables rendering of a dual-stack
// node: the IPv6 rules and family inet6 sets only, neighbour discovery one
// rule per ICMPv6 type, anti-spoofing of the IPv6 address, masquerade of
// the IPv6 pools.
func TestRenderIP6TablesLayout(t *testing.T) {
	wep := func(name, node, iface, app string, ips ...string) *api.WorkloadEndpoint {
		return &api.WorkloadEndpoint{Metadata: api.ObjectMeta{Name: name, Namespace: "prod", Labels: map[string]string{"app": app}},
			Spec: api.WorkloadEndpointSpec{Node: node, InterfaceName: iface, IPNetworks: ips,
				Ports: []api.EndpointPort{{Name: "http", Protocol: "TCP", Port: 8080}}}}
	}
	http := api.FromString("http")
	in := policy.Input{
		Node: "n1",
		Endpoints: []*api.WorkloadEndpoint{
			wep("a", "n1", "calia", "web", "10.244.1.1/32", "fd00:10:244:1::1/128"),
			wep("b", "n2", "calib", "client", "10.244.2.1/32", "fd00:10:244:2::1/128"),
			wep("c", "n1", "calic", "v4only", "10.244.1.3/32"),
		},
		NetworkPolicies: []*api.NetworkPolicy{{Metadata: api.ObjectMeta{Namespace: "prod", Name: "web"}, Spec: api.NetworkPolicySpec{
			PodSelector: api.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []api.NetworkPolicyIngressRule{{From: []api.NetworkPolicyPeer{{IPBlock: &api.IPBlock{CIDR: "fd00:10:244::/48", Except: []string{"fd00:10:244:2::/64"}}}},
				Ports: []api.NetworkPolicyPort{{Protocol: ptr("TCP"), Port: &http}}}},
		}}},
		Pools: []*api.IPPool{
			{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", NATOutgoing: true}},
			{Metadata: api.ObjectMeta{Name: "p6"}, Spec: api.IPPoolSpec{CIDR: "fd00:10:244::/48", NATOutgoing: true}},
		},
	}
	rs := policy.Compile(in)
	if len(rs.Warnings) > 0 {
		t.Fatalf("warnings: %v", rs.Warnings)
	}
	var pi, block, named string
	for _, c := range rs.Chains {
		if strings.HasPrefix(c.Name, "tabby-pi-") {
			pi = c.Name
		}
	}
	for _, s := range rs.Sets {
		switch {
		case strings.HasPrefix(s.Name, "tabby-n6-"):
			block = s.Name
		case strings.HasPrefix(s.Name, "tabby-p6-"):
			named = s.Name
		}
	}
	want := []string{
		"*filter",
		"-I FORWARD -j tabby-FORWARD",
		"-I INPUT -j tabby-INPUT",
		"-A tabby-FORWARD -i cali+ -j tabby-from-wl",
		"-A tabby-FORWARD -o cali+ -j tabby-to-wl",
		"-A tabby-FORWARD -i cali+ -j ACCEPT",
		"-A tabby-FORWARD -o cali+ -j ACCEPT",
		"-A tabby-INPUT -i cali+ -p ipv6-icmp -m icmp6 --icmpv6-type 130 -j ACCEPT",
		"-A tabby-INPUT -i cali+ -p ipv6-icmp -m icmp6 --icmpv6-type 131 -j ACCEPT",
		"-A tabby-INPUT -i cali+ -p ipv6-icmp -m icmp6 --icmpv6-type 132 -j ACCEPT",
		"-A tabby-INPUT -i cali+ -p ipv6-icmp -m icmp6 --icmpv6-type 133 -j ACCEPT",
		"-A tabby-INPUT -i cali+ -p ipv6-icmp -m icmp6 --icmpv6-type 135 -j ACCEPT",
		"-A tabby-INPUT -i cali+ -p ipv6-icmp -m icmp6 --icmpv6-type 136 -j ACCEPT",
		"-A tabby-INPUT -i cali+ -j tabby-from-wl",
		"-A tabby-INPUT -i cali+ -j DROP",
		"-A tabby-from-wl -i calia -g tabby-fw-calia",
		"-A tabby-from-wl -i calic -g tabby-fw-calic",
		"-A tabby-from-wl -j DROP",
		"-A tabby-fw-calia ! -s fd00:10:244:1::1/128 -j DROP",
		"-A tabby-fw-calia -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
		"-A tabby-fw-calic -j DROP", // no IPv6 address: no IPv6
		"-A tabby-fw-calic -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
		"-A " + pi + " -m set --match-set " + block + " src -p tcp -m set --match-set " + named + " dst,dst -j MARK --set-xmark 0x10000/0x10000",
		"-A " + pi + " -m mark --mark 0x10000/0x10000 -j RETURN",
		"-A tabby-to-wl -o calia -g tabby-tw-calia",
		"-A tabby-to-wl -o calic -g tabby-tw-calic",
		"-A tabby-to-wl -j DROP",
		"-A tabby-tw-calia -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
		"-A tabby-tw-calia -j MARK --set-xmark 0x0/0x10000",
		"-A tabby-tw-calia -j " + pi,
		"-A tabby-tw-calia -m mark --mark 0x10000/0x10000 -j RETURN",
		"-A tabby-tw-calia -j DROP",
		"-A tabby-tw-calic -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
		"*nat",
		"-I POSTROUTING -j tabby-POSTROUTING",
		"-A tabby-POSTROUTING -m set --match-set tabby-masq-pools6 src -m set ! --match-set tabby-all-pools6 dst -j MASQUERADE",
		"create tabby-all-pools6 hash:net",
		"add tabby-all-pools6 fd00:10:244::/48",
		"create tabby-masq-pools6 hash:net",
		"add tabby-masq-pools6 fd00:10:244::/48",
		"create " + block + " hash:net",
		"add " + block + " fd00:10:244::/63",
		"add " + block + " fd00:10:244:3::/64",
		"add " + block + " fd00:10:244:4::/62",
		"add " + block + " fd00:10:244:8::/61",
		"add " + block + " fd00:10:244:10::/60",
		"add " + block + " fd00:10:244:20::/59",
		"add " + block + " fd00:10:244:40::/58",
		"add " + block + " fd00:10:244:80::/57",
		"add " + block + " fd00:10:244:100::/56",
		"add " + block + " fd00:10:244:200::/55",
		"add " + block + " fd00:10:244:400::/54",
		"add " + block + " fd00:10:244:800::/53",
		"add " + block + " fd00:10:244:1000::/52",
		"add " + block + " fd00:10:244:2000::/51",
		"add " + block + " fd00:10:244:4000::/50",
		"add " + block + " fd00:10:244:8000::/49",
		"create " + named + " hash:ip,port",
		"add " + named + " fd00:10:244:1::1,tcp:8080",
	}
	r6 := RenderIPTablesFamily(*rs, policy.IPv6)
	if diff := cmp.Diff(want, iptLines(r6)); diff != "" {
		t.Errorf("ip6tables rendering (-want +got):\n%s", diff)
	}
	for _, s := range r6.Sets {
		if s.Family != policy.IPv6 {
			t.Errorf("set %s rendered for ip6tables has family %v", s.Name, s.Family)
		}
	}
}
