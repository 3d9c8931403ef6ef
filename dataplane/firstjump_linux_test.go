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

// jumpState is testState with an INPUT jump too, as the agent programs.
func jumpState() dataplane.FirewallState {
	s := testState("10.244.1.7/32", false)
	s.Chains = append(s.Chains, policy.Chain{Table: policy.TableFilter, Name: "tabby-INPUT", Rules: []policy.Rule{
		{Match: []policy.Match{{Kind: policy.MatchInIface, Iface: "cali+"}}, Verdict: policy.Verdict{Kind: policy.VerdictDrop}},
	}})
	s.Jumps = append(s.Jumps, policy.Jump{Table: policy.TableFilter, From: "INPUT", To: "tabby-INPUT"})
	return s
}

// Another tool inserting rules above Tabby's jumps in FORWARD and INPUT
// (and appending a second copy) does not keep them there: the periodic
// re-read of the kernel puts each jump back as rule 1, once, and leaves the
// other tool's rules in place. Before the fix the jump stayed below the
// ACCEPT, and pod traffic passed without policy.
func TestPrivilegedIPTablesJumpsStayFirst(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	for _, backend := range backends(t) {
		t.Run(backend, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			ns := testkit.NewNetNS(t, "tbdp-jump")
			ipt := "iptables-" + backend
			// The record is trusted for 100 ms, then the kernel is read
			// again: the agent's periodic check, shortened.
			f, err := dataplane.NewIPTablesFirewall(dataplane.FirewallConfig{NetNS: ns.Path, Backend: backend, Resync: 100 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Apply(ctx, jumpState()); err != nil {
				t.Fatal(err)
			}
			inNS(t, ns, ipt, "-w", "-I", "FORWARD", "1", "-s", "10.244.0.0/16", "-j", "ACCEPT")
			inNS(t, ns, ipt, "-w", "-I", "INPUT", "1", "-j", "ACCEPT")
			inNS(t, ns, ipt, "-w", "-A", "INPUT", "-j", "tabby-INPUT")
			firstOK := func() bool {
				for _, c := range []string{"FORWARD", "INPUT"} {
					lines := strings.Split(strings.TrimSpace(inNS(t, ns, ipt, "-w", "-S", c)), "\n")
					if len(lines) < 2 || lines[1] != "-A "+c+" -j tabby-"+c || strings.Count(strings.Join(lines, "\n"), "-j tabby-"+c) != 1 {
						return false
					}
				}
				return true
			}
			if firstOK() {
				t.Fatal("the tampering did not take")
			}
			var total dataplane.ApplyStats
			deadline := time.Now().Add(20 * time.Second)
			for !firstOK() {
				if time.Now().After(deadline) {
					t.Fatalf("the jumps are not back on top:\n%s", inNS(t, ns, ipt+"-save", "-t", "filter"))
				}
				time.Sleep(50 * time.Millisecond)
				st, err := f.Apply(ctx, jumpState())
				if err != nil {
					t.Fatal(err)
				}
				total.JumpsInserted += st.JumpsInserted
				total.JumpsDeleted += st.JumpsDeleted
			}
			if total.JumpsInserted != 2 || total.JumpsDeleted != 3 {
				t.Errorf("jumps inserted %d, deleted %d; want 2 and 3 (FORWARD moved, INPUT moved and its copy removed)", total.JumpsInserted, total.JumpsDeleted)
			}
			filter := inNS(t, ns, ipt+"-save", "-t", "filter")
			for _, w := range []string{"-A FORWARD -j tabby-FORWARD\n-A FORWARD -s 10.244.0.0/16 -j ACCEPT", "-A INPUT -j tabby-INPUT\n-A INPUT -j ACCEPT\n"} {
				if !strings.Contains(filter, w) {
					t.Errorf("filter table lacks %q:\n%s", w, filter)
				}
			}
			// Nothing more to do once they are first.
			time.Sleep(150 * time.Millisecond)
			if st, err := f.Apply(ctx, jumpState()); err != nil || st.Changed() {
				t.Errorf("apply after the repair: %+v, %v", st, err)
			}
			if err := f.Remove(ctx); err != nil {
				t.Error(err)
			}
		})
	}
}

// nftables has no single FORWARD chain to be first in: every base chain
// of every table at a hook sees each packet, in priority order, and an
// accept ends only its own base chain. Tabby's verdicts therefore apply
// whatever other tables do; the one way around them is a rule inside
// Tabby's own base chains, which the next Apply removes (any change bumps
// the ruleset generation, so it reads the table again).
func TestPrivilegedNFTablesBaseChainsStayOurs(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("privileged test skipped: the nft CLI (used to tamper) is not installed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ns := testkit.NewNetNS(t, "tbdp-nftjump")
	f := newNFT(t, ns, time.Hour)
	if _, err := f.Apply(ctx, jumpState()); err != nil {
		t.Fatal(err)
	}
	nft := func(args ...string) string {
		return run(t, "nsenter", append([]string{"--net=" + ns.Path, "--", "nft"}, args...)...)
	}
	nft("insert", "rule", "inet", dataplane.NFTTable, "forward", "accept")
	nft("insert", "rule", "inet", dataplane.NFTTable, "input", "accept")
	st, err := f.Apply(ctx, jumpState())
	if err != nil {
		t.Fatal(err)
	}
	if st.ChainsWritten != 2 {
		t.Errorf("apply after tampering with the base chains: %+v, want both rewritten", st)
	}
	for _, c := range []struct{ chain, hook, jump string }{{"forward", "forward", "tabby-FORWARD"}, {"input", "input", "tabby-INPUT"}} {
		out := nft("list", "chain", "inet", dataplane.NFTTable, c.chain)
		var rules []string
		for _, line := range strings.Split(out, "\n") {
			line = strings.TrimSpace(line)
			if line != "" && !strings.HasPrefix(line, "table") && !strings.HasPrefix(line, "chain") && !strings.HasPrefix(line, "type") && line != "}" {
				rules = append(rules, line)
			}
		}
		if len(rules) != 1 || !strings.HasPrefix(rules[0], "jump "+c.jump) {
			t.Errorf("base chain %s holds %q, want only the jump to %s:\n%s", c.chain, rules, c.jump, out)
		}
		if !strings.Contains(out, "type filter hook "+c.hook+" priority filter; policy accept;") {
			t.Errorf("base chain %s is not at hook %s, priority filter:\n%s", c.chain, c.hook, out)
		}
	}
	if err := f.Remove(ctx); err != nil {
		t.Error(err)
	}
}
