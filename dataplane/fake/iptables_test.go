package fake_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/policy"
)

func TestFirewall(t *testing.T) {
	ctx := context.Background()
	state := func(member string) dataplane.FirewallState {
		return dataplane.FirewallState{
			Chains: []policy.Chain{{Table: "filter", Name: "tabby-FORWARD", Rules: []policy.Rule{{Verdict: policy.Verdict{Kind: policy.VerdictAccept}}}}},
			Jumps:  []policy.Jump{{Table: "filter", From: "FORWARD", To: "tabby-FORWARD"}},
			Sets:   []policy.Set{{Name: "tabby-s", Type: policy.SetTypeNet, Nets: []netip.Prefix{netip.MustParsePrefix(member)}}},
		}
	}
	var f fake.Firewall
	st, err := f.Apply(ctx, state("10.0.0.1/32"))
	want := dataplane.ApplyStats{ChainsWritten: 1, RulesWritten: 1, JumpsInserted: 1, SetsCreated: 1, MembersAdded: 1}
	if err != nil || st != want {
		t.Errorf("first apply: %+v, %v; want %+v", st, err, want)
	}
	if st, err := f.Apply(ctx, state("10.0.0.1/32")); err != nil || st.Changed() {
		t.Errorf("repeated apply: %+v, %v", st, err)
	}
	st, _ = f.Apply(ctx, state("10.0.0.2/32"))
	if want := (dataplane.ApplyStats{MembersAdded: 1, MembersRemoved: 1}); st != want {
		t.Errorf("member change: %+v, want %+v", st, want)
	}
	wantLines := []string{
		"*filter :tabby-FORWARD",
		"*filter -A tabby-FORWARD -j ACCEPT",
		"*filter -I FORWARD -j tabby-FORWARD",
		"create tabby-s hash:net",
		"add tabby-s 10.0.0.2/32",
	}
	if diff := cmp.Diff(wantLines, f.Lines()); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
	if _, err := f.Apply(ctx, dataplane.FirewallState{Chains: []policy.Chain{{Table: "filter", Name: "KUBE-X"}}}); err == nil {
		t.Error("foreign chain name accepted")
	}
	f.SetFail("Apply", fake.ErrInjected)
	if _, err := f.Apply(ctx, state("10.0.0.3/32")); !errors.Is(err, fake.ErrInjected) {
		t.Errorf("injected failure: %v", err)
	}
	f.SetFail("Apply", nil)
	if err := f.Remove(ctx); err != nil || len(f.Lines()) != 0 {
		t.Errorf("after Remove: %v %q", err, f.Lines())
	}
	if f.Applies() != 4 {
		t.Errorf("applies = %d, want 4", f.Applies())
	}
}
