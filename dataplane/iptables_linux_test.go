package dataplane_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/policy"
)

// backends lists the iptables backends installed here.
func backends(t *testing.T) []string {
	var out []string
	for _, b := range []string{dataplane.BackendLegacy, dataplane.BackendNFT} {
		if _, err := exec.LookPath("iptables-" + b + "-restore"); err == nil {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		t.Skip("privileged test skipped: neither iptables-legacy-restore nor iptables-nft-restore installed")
	}
	if _, err := exec.LookPath("ipset"); err != nil {
		t.Skip("privileged test skipped: ipset not installed")
	}
	return out
}

// inNS runs a command inside the namespace (nsenter: no /sys remount).
func inNS(t *testing.T, ns testkit.NetNS, argv ...string) string {
	t.Helper()
	return run(t, "nsenter", append([]string{"--net=" + ns.Path, "--"}, argv...)...)
}

func TestPrivilegedFirewall(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	for _, backend := range backends(t) {
		t.Run(backend, func(t *testing.T) { testFirewall(t, backend) })
	}
}

func testFirewall(t *testing.T, backend string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ns := testkit.NewNetNS(t, "tbdp-fw")
	ipt := "iptables-" + backend
	// Someone else's chain, jump and set, which must survive everything.
	inNS(t, ns, ipt, "-w", "-N", "KUBE-FOO")
	inNS(t, ns, ipt, "-w", "-A", "KUBE-FOO", "-j", "ACCEPT")
	inNS(t, ns, ipt, "-w", "-A", "FORWARD", "-j", "KUBE-FOO")
	inNS(t, ns, "ipset", "create", "kube-x", "hash:ip")

	// Resync -1: read the kernel on every Apply, so that tampering shows.
	f, err := dataplane.NewIPTablesFirewall(dataplane.FirewallConfig{NetNS: ns.Path, Backend: backend, Resync: -1})
	if err != nil {
		t.Fatal(err)
	}
	if f.Backend() != backend {
		t.Fatalf("backend %s, want %s", f.Backend(), backend)
	}
	st, err := f.Apply(ctx, testState("10.244.1.7/32", false))
	if err != nil {
		t.Fatalf("first apply: %v", err)
	}
	// Both tables: ip6tables gets the same chains without the rules about
	// IPv4 addresses and sets (4 chains, 5 rules, 2 jumps).
	want := dataplane.ApplyStats{ChainsWritten: 4 + 4, RulesWritten: 9 + 5, JumpsInserted: 2 + 2, SetsCreated: 4, MembersAdded: 5}
	if st != want {
		t.Errorf("first apply stats %+v, want %+v", st, want)
	}
	filter := inNS(t, ns, ipt+"-save", "-t", "filter")
	for _, want := range []string{
		"-A FORWARD -j tabby-FORWARD\n-A FORWARD -j KUBE-FOO", // ours on top
		"--dports 80,8000:8100",
		"-A tabby-fw-calia ! -s 10.244.1.1/32",
	} {
		if !strings.Contains(filter, want) {
			t.Errorf("filter table lacks %q:\n%s", want, filter)
		}
	}
	if nat := inNS(t, ns, ipt+"-save", "-t", "nat"); !strings.Contains(nat, "-A POSTROUTING -j tabby-POSTROUTING") || !strings.Contains(nat, "MASQUERADE") {
		t.Errorf("nat table:\n%s", nat)
	}
	if sets := inNS(t, ns, "ipset", "list", "tabby-s-peers"); !strings.Contains(sets, "10.244.1.7") {
		t.Errorf("set:\n%s", sets)
	}

	// The same state again changes nothing.
	if st, err := f.Apply(ctx, testState("10.244.1.7/32", false)); err != nil || st.Changed() {
		t.Errorf("repeated apply: %+v, %v", st, err)
	}

	// One chain and one member change: only they are written.
	st, err = f.Apply(ctx, testState("10.244.1.8/32", true))
	if err != nil {
		t.Fatal(err)
	}
	want = dataplane.ApplyStats{ChainsWritten: 1 + 1, RulesWritten: 5 + 2, MembersAdded: 1, MembersRemoved: 1}
	if st != want {
		t.Errorf("changed apply stats %+v, want %+v", st, want)
	}

	// A rule slipped into our chain by hand is noticed and rewritten away.
	inNS(t, ns, ipt, "-w", "-I", "tabby-from-wl", "1", "-j", "ACCEPT")
	if st, err := f.Apply(ctx, testState("10.244.1.8/32", true)); err != nil || st.ChainsWritten != 1 {
		t.Errorf("apply after tampering: %+v, %v", st, err)
	}

	// A restarted agent with a smaller state removes stale chains and sets,
	// including a stale jump, and a duplicate jump.
	inNS(t, ns, ipt, "-w", "-A", "FORWARD", "-j", "tabby-FORWARD")
	f2, err := dataplane.NewIPTablesFirewall(dataplane.FirewallConfig{NetNS: ns.Path, Backend: backend, Resync: -1})
	if err != nil {
		t.Fatal(err)
	}
	small := testState("10.244.1.8/32", true)
	small.Chains = small.Chains[:2] // tabby-FORWARD, tabby-from-wl …
	small.Chains[1].Dispatch = &policy.Dispatch{}
	small.Chains = append(small.Chains, testState("", false).Chains[3]) // … and the nat chain
	small.Sets = small.Sets[:2]
	st, err = f2.Apply(ctx, small)
	if err != nil {
		t.Fatal(err)
	}
	want = dataplane.ApplyStats{ChainsWritten: 1 + 1, RulesWritten: 1 + 1, ChainsDeleted: 1 + 1, JumpsDeleted: 1, SetsDeleted: 2}
	if st != want {
		t.Errorf("shrinking apply stats %+v, want %+v", st, want)
	}
	if out := inNS(t, ns, "ipset", "list", "-n"); strings.Contains(out, "tabby-s-peers") || !strings.Contains(out, "kube-x") {
		t.Errorf("sets after shrinking:\n%s", out)
	}

	// A foreign chain referencing a stale tabby chain: the desired chains
	// are still programmed, and the failed deletion is reported.
	grow := testState("10.244.1.8/32", true)
	if _, err := f2.Apply(ctx, grow); err != nil {
		t.Fatal(err)
	}
	inNS(t, ns, ipt, "-w", "-A", "KUBE-FOO", "-j", "tabby-fw-calia")
	grow.Chains[1].Dispatch = &policy.Dispatch{}
	grow.Chains = append(grow.Chains[:2], grow.Chains[3])
	st, err = f2.Apply(ctx, grow)
	if err == nil || !strings.Contains(err.Error(), "tabby-fw-calia") || !errors.Is(err, dataplane.ErrStaleCleanup) {
		t.Errorf("apply with a referenced stale chain: err = %v", err)
	}
	if st.ChainsWritten != 1+1 { // ip6tables, without the foreign reference, deletes it
		t.Errorf("desired chain not written beside the failed deletion: %+v", st)
	}
	inNS(t, ns, ipt, "-w", "-D", "KUBE-FOO", "-j", "tabby-fw-calia")

	// Remove leaves nothing of ours and everything of others.
	if err := f2.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"filter", "nat"} {
		out := inNS(t, ns, ipt+"-save", "-t", table)
		if strings.Contains(out, "tabby") {
			t.Errorf("%s table after Remove:\n%s", table, out)
		}
		if out6 := inNS(t, ns, "ip6tables-"+backend+"-save", "-t", table); strings.Contains(out6, "tabby") {
			t.Errorf("ip6tables %s table after Remove:\n%s", table, out6)
		}
		if table == "filter" && (!strings.Contains(out, "-A FORWARD -j KUBE-FOO") || !strings.Contains(out, "-A KUBE-FOO -j ACCEPT")) {
			t.Errorf("foreign rules lost:\n%s", out)
		}
	}
	if out := inNS(t, ns, "ipset", "list", "-n"); strings.Contains(out, "tabby") || !strings.Contains(out, "kube-x") {
		t.Errorf("sets after Remove:\n%s", out)
	}
	if err := f2.Remove(ctx); err != nil {
		t.Errorf("second Remove: %v", err)
	}

	// With the default resync, Apply trusts its record between reads: the
	// kernel (three tables and the sets, of each family) is read once,
	// and the record stays right across changes.
	f3, err := dataplane.NewIPTablesFirewall(dataplane.FirewallConfig{NetNS: ns.Path, Backend: backend})
	if err != nil {
		t.Fatal(err)
	}
	for i, member := range []string{"10.244.1.7/32", "10.244.1.8/32", "10.244.1.8/32"} {
		st, err := f3.Apply(ctx, testState(member, i > 0))
		if err != nil {
			t.Fatal(err)
		}
		if i == 2 && st.Changed() {
			t.Errorf("cached apply of an unchanged state: %+v", st)
		}
	}
	if f3.Reads() != 4+4 {
		t.Errorf("%d kernel reads, want 8", f3.Reads())
	}
	// The record matches the kernel: a reading firewall sees nothing to do.
	if st, err := f.Apply(ctx, testState("10.244.1.8/32", true)); err != nil || st.Changed() {
		t.Errorf("kernel differs from the cached firewall's record: %+v, %v", st, err)
	}
	if err := f.Remove(ctx); err != nil {
		t.Error(err)
	}
}

func TestFirewallBadBackend(t *testing.T) {
	if _, err := dataplane.NewIPTablesFirewall(dataplane.FirewallConfig{Backend: "ebtables"}); err == nil {
		t.Error("unknown backend accepted")
	}
}

// TestCheckNFLOGTarget: an iptables without the NFLOG extension is refused
// (the agent does not start with flow logs it cannot write); one that
// prints NFLOG's options passes.
func TestCheckNFLOGTarget(t *testing.T) {
	dir := t.TempDir()
	script := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	with := script("with", `echo "NFLOG target options:"; echo " --nflog-group NUM		NETLINK group used for logging"`)
	without := script("without", `echo "iptables v1.8.11 (legacy): Couldn't load target 'NFLOG'" >&2; exit 2`)
	silent := script("silent", `echo "Usage: iptables -[ACD] chain rule-specification [options]"`)
	if err := dataplane.CheckNFLOGTarget(with); err != nil {
		t.Errorf("with NFLOG: %v", err)
	}
	for _, p := range []string{without, silent} {
		if err := dataplane.CheckNFLOGTarget(p); err == nil || !strings.Contains(err.Error(), "no NFLOG target") {
			t.Errorf("%s: %v, want no NFLOG target", filepath.Base(p), err)
		}
	}
}
