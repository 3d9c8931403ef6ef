package dataplane_test

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/policy"
)

// bigNFTState is testState with sets sets of members /32 addresses each
// and chains more chains of five rules, each matching one of the sets.
func bigNFTState(sets, members, chains int) dataplane.FirewallState {
	st := testState("", false)
	for i := range sets {
		s := policy.Set{Name: fmt.Sprintf("tabby-s-big%d", i), Type: policy.SetTypeNet}
		for j := range members {
			n := i*members + j
			s.Nets = append(s.Nets, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + n>>16), byte(n >> 8), byte(n)}), 32))
		}
		st.Sets = append(st.Sets, s)
	}
	for i := range chains {
		c := policy.Chain{Table: policy.TableFilter, Name: fmt.Sprintf("tabby-pi-big%d", i)}
		for j := range 5 {
			c.Rules = append(c.Rules, policy.Rule{Match: []policy.Match{
				{Kind: policy.MatchSrcSet, Set: fmt.Sprintf("tabby-s-big%d", (i+j)%sets)},
				{Kind: policy.MatchProto, Proto: "tcp"},
				{Kind: policy.MatchDstPorts, Ports: []policy.PortRange{{Lo: uint16(8000 + j), Hi: uint16(8000 + j)}}},
			}, Verdict: policy.Verdict{Kind: policy.VerdictAccept}})
		}
		st.Chains = append(st.Chains, c)
	}
	return st
}

// BenchmarkPrivilegedNFTPeriodicCheck measures the policy owner's
// periodic check at rest on a table of 3,000 or 30,000 set elements (50
// sets of 60 or 600 /32s; 30,000 endpoints at 1,000 nodes) and 100 chains
// of 5 rules: one Apply of the state already in the kernel, in a
// namespace of its own.
//
//	full-read   the table read back on every check (Resync -1): what every
//	            30 s check did before branch nftgen, whose 30 s bound
//	            expired between two 30 s passes
//	generation  the default: the ruleset generation is the record's, so
//	            the record is trusted and nothing is dumped
//
// cpu-ns/op is the process's user and system time (the kernel's dump
// runs in the caller's system time) per check.
func BenchmarkPrivilegedNFTPeriodicCheck(b *testing.B) {
	testkit.RequirePrivileged(b, "ip")
	for _, size := range []struct{ sets, members int }{{50, 60}, {50, 600}} {
		state := bigNFTState(size.sets, size.members, 100)
		for _, c := range []struct {
			name   string
			resync time.Duration
		}{{"full-read", -1}, {"generation", 0}} {
			b.Run(fmt.Sprintf("elements=%d/%s", size.sets*size.members, c.name), func(b *testing.B) {
				periodicCheck(b, state, c.resync, size.sets*size.members)
			})
		}
	}
}

// periodicCheck applies state in a new namespace, then times Applies of
// it again.
func periodicCheck(b *testing.B, state dataplane.FirewallState, resync time.Duration, elements int) {
	ctx := context.Background()
	ns := testkit.NewNetNS(b, "tbdp-nftgenb")
	f, err := dataplane.NewNFTFirewall(dataplane.NFTConfig{NetNS: ns.Path, Resync: resync})
	if err != nil {
		b.Skip(err)
	}
	defer func() {
		if err := f.Close(); err != nil {
			b.Error(err)
		}
	}()
	st, err := f.Apply(ctx, state)
	if err != nil {
		b.Fatal(err)
	}
	if st.MembersAdded < elements {
		b.Fatalf("initial apply added %d members, want %d", st.MembersAdded, elements)
	}
	reads := f.Reads()
	runtime.GC() // the initial apply's garbage is not the checks'
	b.ReportAllocs()
	cpu0 := testkit.ProcessCPU()
	for b.Loop() {
		if st, err := f.Apply(ctx, state); err != nil || st.Changed() {
			b.Fatalf("check: %+v, %v", st, err)
		}
	}
	b.ReportMetric(float64(testkit.ProcessCPU()-cpu0)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(f.Reads()-reads)/float64(b.N), "reads/op")
}
