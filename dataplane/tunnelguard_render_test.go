package dataplane

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/policy"
)

// The tunnel guard renders, in each family, as one drop of the VXLAN port
// from any source outside the family's node set, jumped to from INPUT.
func TestRenderTunnelGuard(t *testing.T) {
	rs := policy.Compile(policy.Input{Node: "n1", TunnelGuard: &policy.TunnelGuard{Port: 4789, Nodes: []netip.Addr{
		netip.MustParseAddr("198.18.1.11"), netip.MustParseAddr("198.18.2.12"), netip.MustParseAddr("2001:db8::11"),
	}}})
	for _, tc := range []struct {
		fam  policy.Family
		want []string
	}{
		{policy.IPv4, []string{
			"-I INPUT -j tabby-tunnel",
			"-A tabby-tunnel -p udp -m udp --dport 4789 -m set ! --match-set tabby-tunnel-nodes-v4 src -j DROP",
			"add tabby-tunnel-nodes-v4 198.18.1.11/32",
			"add tabby-tunnel-nodes-v4 198.18.2.12/32",
		}},
		{policy.IPv6, []string{
			"-I INPUT -j tabby-tunnel",
			"-A tabby-tunnel -p udp -m udp --dport 4789 -m set ! --match-set tabby-tunnel-nodes-v6 src -j DROP",
			"add tabby-tunnel-nodes-v6 2001:db8::11/128",
		}},
	} {
		lines := iptLines(RenderIPTablesFamily(*rs, tc.fam))
		for _, w := range tc.want {
			if !slices.Contains(lines, w) {
				t.Errorf("%v: no line %q in:\n%s", tc.fam, w, strings.Join(lines, "\n"))
			}
		}
	}
	// Without a guard (no pool encapsulates) nothing of it is there.
	lines := strings.Join(iptLines(RenderIPTables(*policy.Compile(policy.Input{Node: "n1"}))), "\n")
	if strings.Contains(lines, "tunnel") {
		t.Errorf("tunnel rules without a guard:\n%s", lines)
	}
}

// Two Tabby jumps from one base chain (tabby-INPUT and the tunnel guard's)
// are both "first" in whichever order they are: planning them again must
// not move one above the other at every Apply.
func TestPlanTableTwoJumpsFromOneChain(t *testing.T) {
	jumps := []policy.Jump{{Table: "filter", From: "INPUT", To: "tabby-tunnel"}, {Table: "filter", From: "INPUT", To: "tabby-INPUT"}}
	in := IPTChain{Table: "filter", Name: "tabby-INPUT"}
	tun := IPTChain{Table: "filter", Name: "tabby-tunnel"}
	for _, order := range []string{
		"-A INPUT -j tabby-INPUT\n-A INPUT -j tabby-tunnel\n",
		"-A INPUT -j tabby-tunnel\n-A INPUT -j tabby-INPUT\n",
	} {
		p := planTable("filter", []IPTChain{in, tun}, jumps, mustParse(t, saveOf(order, in, tun)))
		if len(p.firstJumps) != 0 || len(p.missingJumps) != 0 {
			t.Errorf("INPUT %q: to put first %v, missing %v; want none", order, p.firstJumps, p.missingJumps)
		}
	}
	// A foreign rule between them still sends the lower one back on top.
	p := planTable("filter", []IPTChain{in, tun}, jumps, mustParse(t, saveOf("-A INPUT -j tabby-INPUT\n-A INPUT -j ACCEPT\n-A INPUT -j tabby-tunnel\n", in, tun)))
	if len(p.firstJumps) != 1 || p.firstJumps[0].To != "tabby-tunnel" {
		t.Errorf("with a foreign rule between: to put first %v, want tabby-tunnel", p.firstJumps)
	}
}
