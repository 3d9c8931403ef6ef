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
