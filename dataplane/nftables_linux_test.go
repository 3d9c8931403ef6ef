package dataplane_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/policy"
)

func newNFT(t *testing.T, ns testkit.NetNS, resync time.Duration) *dataplane.NFTFirewall {
	t.Helper()
	f, err := dataplane.NewNFTFirewall(dataplane.NFTConfig{NetNS: ns.Path, Resync: resync})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	})
	return f
}

// nftList prints the namespace's Tabby table with the nft CLI, when
// installed (only tests use it).
func nftList(t *testing.T, ns testkit.NetNS) string {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		return ""
	}
	out, _ := exec.Command("nsenter", "--net="+ns.Path, "--", "nft", "list", "table", "inet", dataplane.NFTTable).CombinedOutput()
	return string(out)
}

func TestPrivilegedNFTables(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ns := testkit.NewNetNS(t, "tbdp-nft")
	f := newNFT(t, ns, -1)

	st, err := f.Apply(ctx, testState("10.244.1.7/32", false))
	if err != nil {
		t.Fatalf("first apply: %v", err)
	}
	// Chains: 2 base, forward, from-wl (vmap + drop), fw-calia, postrouting.
	want := dataplane.ApplyStats{ChainsWritten: 6, RulesWritten: 2 + 2 + 2 + 4 + 1, JumpsInserted: 2, SetsCreated: 5, MembersAdded: 6}
	if st != want {
		t.Errorf("first apply stats %+v, want %+v", st, want)
	}
	if out := nftList(t, ns); out != "" {
		for _, w := range []string{"iifname vmap @tabby-from-wl-map", `"calia" : goto tabby-fw-calia`, "ip saddr != 10.244.1.1 drop",
			"dport { 80, 8000-8100 }", "ip daddr . meta l4proto . th dport @tabby-p-named", "masquerade", "10.244.1.7", "10.244.2.0/24"} {
			if !strings.Contains(out, w) {
				t.Errorf("table lacks %q:\n%s", w, out)
			}
		}
	}
	if st, err := f.Apply(ctx, testState("10.244.1.7/32", false)); err != nil || st.Changed() {
		t.Errorf("repeated apply: %+v, %v", st, err)
	}
	// One chain and one member change: only they are written.
	st, err = f.Apply(ctx, testState("10.244.1.8/32", true))
	if want := (dataplane.ApplyStats{ChainsWritten: 1, RulesWritten: 5, MembersAdded: 1, MembersRemoved: 1}); err != nil || st != want {
		t.Errorf("changed apply: %+v, %v; want %+v", st, err, want)
	}
	// Tampering is repaired.
	if _, err := exec.LookPath("nft"); err == nil {
		run(t, "nsenter", "--net="+ns.Path, "--", "nft", "insert", "rule", "inet", "tabby", "tabby-fw-calia", "accept")
		run(t, "nsenter", "--net="+ns.Path, "--", "nft", "delete", "element", "inet", "tabby", "tabby-s-peers", "{ 10.244.2.0/24 }")
		if st, err := f.Apply(ctx, testState("10.244.1.8/32", true)); err != nil || st.ChainsWritten != 1 || st.MembersAdded != 1 {
			t.Errorf("apply after tampering: %+v, %v", st, err)
		}
	}
	// A new firewall (an agent restart) with a smaller state removes stale
	// chains, map elements and sets.
	f2 := newNFT(t, ns, 0)
	small := testState("10.244.1.8/32", true)
	small.Chains = append(small.Chains[:2:2], small.Chains[3])
	small.Chains[1].Dispatch = &policy.Dispatch{}
	small.Sets = small.Sets[:2]
	st, err = f2.Apply(ctx, small)
	if want := (dataplane.ApplyStats{ChainsDeleted: 1, SetsDeleted: 2, MembersRemoved: 1}); err != nil || st != want {
		t.Errorf("shrinking apply: %+v, %v; want %+v", st, err, want)
	}
	// With the default resync the record is trusted while the generation
	// is unchanged: no read for an unchanged apply, one after someone
	// else's change.
	reads := f2.Reads()
	if st, err := f2.Apply(ctx, small); err != nil || st.Changed() || f2.Reads() != reads {
		t.Errorf("cached apply: %+v, %v, reads %d -> %d", st, err, reads, f2.Reads())
	}
	if _, err := f.Apply(ctx, testState("10.244.1.9/32", true)); err != nil { // someone else's batch
		t.Fatal(err)
	}
	if st, err := f2.Apply(ctx, small); err != nil || !st.Changed() || f2.Reads() != reads+1 {
		t.Errorf("apply after a foreign change: %+v, %v, reads %d -> %d", st, err, reads, f2.Reads())
	}
	if err := f2.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f2.Remove(ctx); err != nil {
		t.Errorf("second Remove: %v", err)
	}
	if out := nftList(t, ns); out != "" && !strings.Contains(out, "No such file") {
		t.Errorf("table after Remove:\n%s", out)
	}
}
