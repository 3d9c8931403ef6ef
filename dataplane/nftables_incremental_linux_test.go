package dataplane_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/policy"
)

// TestPrivilegedNFTablesIncrementalEqualsKernel drives the nftables
// backend the way the agent does (a long-lived policy.Compiler, Apply
// trusting its record between reads) through random changes — a policy's
// port, a pod's labels, pods removed and added back, a policy removed — and
// after every pass requires the kernel's table to equal the desired state
// computed from scratch (Diff reads the kernel and renders without the
// memo). It guards the memo's and the record's in-place updates.
func TestPrivilegedNFTablesIncrementalEqualsKernel(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	ctx := context.Background()
	ns := testkit.NewNetNS(t, "tbdp-w16binc")
	f, err := dataplane.NewNFTFirewall(dataplane.NFTConfig{NetNS: ns.Path})
	if err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { _ = f.Remove(ctx); _ = f.Close() })
	in := scaleInput(60)
	all := slices.Clone(in.Endpoints)
	pols := slices.Clone(in.NetworkPolicies)
	in.Endpoints, in.NetworkPolicies = slices.Clone(all), slices.Clone(pols)
	comp := policy.NewCompiler()
	rng := rand.New(rand.NewPCG(16, 2))
	for step := range 60 {
		var what string
		switch rng.IntN(5) {
		case 0:
			i := rng.IntN(len(in.NetworkPolicies))
			in.NetworkPolicies[i] = withPort(in.NetworkPolicies[i], int32(7000+rng.IntN(3)))
			what = "policy port"
		case 1:
			i := rng.IntN(len(in.Endpoints))
			in.Endpoints[i] = withLabel(in.Endpoints[i], fmt.Sprintf("app%d", rng.IntN(20)))
			what = "pod labels"
		case 2:
			n := 1 + rng.IntN(3)
			in.Endpoints = slices.Clone(in.Endpoints[:max(1, len(in.Endpoints)-n)])
			what = "pods removed"
		case 3:
			in.Endpoints = slices.Clone(all[:min(len(all), len(in.Endpoints)+1+rng.IntN(3))])
			what = "pods added"
		case 4:
			if rng.IntN(2) == 0 && len(in.NetworkPolicies) > 1 {
				in.NetworkPolicies = slices.Clone(in.NetworkPolicies[1:])
				what = "policy removed"
			} else {
				in.NetworkPolicies = slices.Clone(pols)
				what = "policies restored"
			}
		}
		rs := comp.Compile(in)
		if _, err := f.Apply(ctx, *rs); err != nil {
			t.Fatalf("step %d (%s): %v", step, what, err)
		}
		diff, err := f.Diff(ctx, *rs)
		if err != nil {
			t.Fatal(err)
		}
		if len(diff) > 0 {
			t.Fatalf("step %d (%s): kernel differs from the desired state: %v", step, what, diff[:min(len(diff), 10)])
		}
		if st, err := f.Apply(ctx, *comp.Compile(in)); err != nil || st.Changed() {
			t.Fatalf("step %d (%s): a second pass changed %+v (%v)", step, what, st, err)
		}
	}
	// Every pass after the first diffed against the record, the
	// generation being its own: that is what the Diffs checked.
	if n := f.Reads(); n != 1 {
		t.Errorf("%d full reads of the table, want 1 (the first Apply's)", n)
	}
}

// TestPrivilegedNFTablesChainNameTwice: one nftables table holds the
// chains of both model tables, so a filter and a nat chain of one name
// are refused (iptables would accept them) before anything is written.
func TestPrivilegedNFTablesChainNameTwice(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	ctx := context.Background()
	ns := testkit.NewNetNS(t, "tbdp-w16bdup")
	f, err := dataplane.NewNFTFirewall(dataplane.NFTConfig{NetNS: ns.Path})
	if err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { _ = f.Remove(ctx); _ = f.Close() })
	st := testState("10.244.1.7/32", false)
	if err := dataplane.ValidateFirewallState(st); err != nil {
		t.Fatal(err)
	}
	dup := st.Chains[len(st.Chains)-1]
	dup.Table = map[string]string{policy.TableFilter: policy.TableNAT, policy.TableNAT: policy.TableFilter}[dup.Table]
	st.Chains = append(slices.Clone(st.Chains), dup)
	if _, err := f.Apply(ctx, st); err == nil || !strings.Contains(err.Error(), "listed twice") {
		t.Fatalf("Apply of chain %s in both tables: %v, want an error naming it listed twice", dup.Name, err)
	}
	if has, err := f.HasTable(); err != nil || has {
		t.Fatalf("table written after a refused Apply (%v, %v)", has, err)
	}
}
