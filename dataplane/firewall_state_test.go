package dataplane_test

import (
	"net/netip"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/policy"
)

// testState is a small firewall state in the neutral model: a forward
// chain, a dispatch to one endpoint chain (member is in the peers set,
// extraRule appends a drop to the endpoint chain), the nat chain and four
// sets of both types. Chains: tabby-FORWARD, tabby-from-wl, tabby-fw-calia,
// tabby-POSTROUTING, in that order.
func testState(member string, extraRule bool) dataplane.FirewallState {
	m := func(ms ...policy.Match) []policy.Match { return ms }
	v := func(k policy.VerdictKind) policy.Verdict { return policy.Verdict{Kind: k} }
	fw := policy.Chain{Table: policy.TableFilter, Name: "tabby-fw-calia", Rules: []policy.Rule{
		{Match: m(policy.Match{Kind: policy.MatchSrcNet, Net: netip.MustParsePrefix("10.244.1.1/32"), Negate: true}), Verdict: v(policy.VerdictDrop)},
		{Match: m(policy.Match{Kind: policy.MatchEstablished}), Verdict: v(policy.VerdictAccept)},
		{Match: m(policy.Match{Kind: policy.MatchDstSet, Set: "tabby-s-peers"}, policy.Match{Kind: policy.MatchProto, Proto: "tcp"},
			policy.Match{Kind: policy.MatchDstPorts, Ports: []policy.PortRange{{Lo: 80, Hi: 80}, {Lo: 8000, Hi: 8100}}}),
			Verdict: policy.Verdict{Kind: policy.VerdictSetMark, Mark: policy.MarkAccept, Mask: policy.MarkAccept}},
		{Match: m(policy.Match{Kind: policy.MatchDstAddrPortSet, Set: "tabby-p-named"}), Verdict: v(policy.VerdictReturn)},
	}}
	if extraRule {
		fw.Rules = append(fw.Rules, policy.Rule{Verdict: v(policy.VerdictDrop)})
	}
	peers := []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24")}
	if member != "" {
		peers = append([]netip.Prefix{netip.MustParsePrefix(member)}, peers...)
	}
	pools := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	return dataplane.FirewallState{
		Chains: []policy.Chain{
			{Table: policy.TableFilter, Name: "tabby-FORWARD", Rules: []policy.Rule{
				{Match: m(policy.Match{Kind: policy.MatchInIface, Iface: "cali+"}), Verdict: policy.Verdict{Kind: policy.VerdictJump, Chain: "tabby-from-wl"}},
				{Match: m(policy.Match{Kind: policy.MatchInIface, Iface: "cali+"}), Verdict: v(policy.VerdictAccept)},
			}},
			{Table: policy.TableFilter, Name: "tabby-from-wl", Dispatch: &policy.Dispatch{Targets: []policy.DispatchTarget{{Iface: "calia", Chain: "tabby-fw-calia"}}}},
			fw,
			{Table: policy.TableNAT, Name: "tabby-POSTROUTING", Rules: []policy.Rule{{
				Match:   m(policy.Match{Kind: policy.MatchSrcSet, Set: "tabby-masq-pools"}, policy.Match{Kind: policy.MatchDstSet, Set: "tabby-all-pools", Negate: true}),
				Verdict: v(policy.VerdictMasquerade),
			}}},
		},
		Jumps: []policy.Jump{
			{Table: policy.TableFilter, From: "FORWARD", To: "tabby-FORWARD"},
			{Table: policy.TableNAT, From: "POSTROUTING", To: "tabby-POSTROUTING"},
		},
		Sets: []policy.Set{
			{Name: "tabby-all-pools", Type: policy.SetTypeNet, Nets: pools},
			{Name: "tabby-masq-pools", Type: policy.SetTypeNet, Nets: pools},
			{Name: "tabby-s-peers", Type: policy.SetTypeNet, Nets: peers},
			{Name: "tabby-p-named", Type: policy.SetTypeAddrPort, AddrPorts: []policy.AddrPort{{Addr: netip.MustParseAddr("10.244.2.1"), Proto: "tcp", Port: 8080}}},
		},
	}
}
