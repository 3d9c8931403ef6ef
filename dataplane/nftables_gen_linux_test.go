package dataplane_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/policy"
)

// nftGenRig is a firewall in a namespace of its own with the default
// resync, on a clock the test moves, and its log in a buffer.
type nftGenRig struct {
	t   *testing.T
	ctx context.Context
	ns  testkit.NetNS
	f   *dataplane.NFTFirewall
	now time.Time
	log bytes.Buffer
}

func newNFTGenRig(t *testing.T) *nftGenRig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	r := &nftGenRig{t: t, ctx: ctx, ns: testkit.NewNetNS(t, "tbdp-nftgen"), now: time.Unix(1e9, 0)}
	f, err := dataplane.NewNFTFirewall(dataplane.NFTConfig{NetNS: r.ns.Path, Log: slog.New(slog.NewTextHandler(&r.log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	})
	dataplane.SetNFTClock(f, func() time.Time { return r.now })
	r.f = f
	return r
}

// apply applies state after the clock moved by wait, and checks how many
// full reads of the table it made and that the kernel then holds state.
func (r *nftGenRig) apply(step string, wait time.Duration, state dataplane.FirewallState, reads int) dataplane.ApplyStats {
	r.t.Helper()
	r.now = r.now.Add(wait)
	before := r.f.Reads()
	st, err := r.f.Apply(r.ctx, state)
	if err != nil {
		r.t.Fatalf("%s: %v", step, err)
	}
	if got := r.f.Reads() - before; got != reads {
		r.t.Errorf("%s: %d full reads of the table, want %d", step, got, reads)
	}
	if diff, err := r.f.Diff(r.ctx, state); err != nil || len(diff) > 0 {
		r.t.Errorf("%s: kernel differs from the state applied: %v %v", step, diff, err)
	}
	return st
}

// TestPrivilegedNFTablesGeneration: with the default resync, the periodic
// check (an Apply of an unchanged state every 30 s, as the policy owner's
// pass) reads only the ruleset generation, not the table, as long as
// nobody else committed — (a) at rest, (c) after the agent's own writes —
// and reads and repairs the table at the first Apply after anyone else's
// commit (b); a full read still comes every DefaultNFTResync, and every
// Apply reads while the generation cannot be read (logged once).
func TestPrivilegedNFTablesGeneration(t *testing.T) {
	testkit.RequirePrivileged(t, "ip", "nft")
	r := newNFTGenRig(t)
	const pass = 30 * time.Second // the agent's default ResyncInterval
	nft := func(args ...string) {
		run(t, "nsenter", append([]string{"--net=" + r.ns.Path, "--", "nft"}, args...)...)
	}
	a, b := testState("10.244.1.7/32", false), testState("10.244.1.8/32", true)

	r.apply("first apply", 0, a, 1)
	// (a) At rest: nine periodic checks 30 s apart (4.5 min), no read.
	for range 9 {
		if st := r.apply("check at rest", pass, a, 0); st.Changed() {
			t.Errorf("check at rest changed %+v", st)
		}
	}
	if n := r.f.Trusted(); n != 9 {
		t.Errorf("%d applies trusted the record, want 9", n)
	}
	// The safety net: a full read once the last is DefaultNFTResync old.
	r.apply("check after DefaultNFTResync", dataplane.DefaultNFTResync, a, 1)

	// (c) The agent's own writes: a chain rewritten and a member changed,
	// then checks, with no read.
	if st := r.apply("own write", time.Second, b, 0); st.ChainsWritten != 1 || st.MembersAdded != 1 || st.MembersRemoved != 1 {
		t.Errorf("own write: %+v", st)
	}
	for range 3 {
		r.apply("check after own write", pass, b, 0)
	}

	// (b) Someone else's changes, a second after the last check: a
	// flushed chain and a deleted element bump the generation, so the next
	// check reads the table and repairs both.
	nft("flush", "chain", "inet", dataplane.NFTTable, "tabby-fw-calia")
	nft("delete", "element", "inet", dataplane.NFTTable, "tabby-s-peers", "{ 10.244.2.0/24 }")
	if st := r.apply("check after a foreign flush and delete", time.Second, b, 1); st.ChainsWritten != 1 || st.MembersAdded != 1 {
		t.Errorf("repair: %+v, want the chain written and the member added", st)
	}
	r.apply("check after the repair", pass, b, 0)
	// A commit that leaves Tabby's table alone (another table) costs one
	// read and changes nothing.
	nft("add", "table", "ip", "other")
	if st := r.apply("check after a foreign commit elsewhere", time.Second, b, 1); st.Changed() {
		t.Errorf("a commit to another table changed %+v", st)
	}
	r.apply("check after that", pass, b, 0)

	// A generation that cannot be read: every Apply reads the table (and
	// so still repairs), one warning; then trusted again once it can.
	dataplane.SetNFTGenFault(r.f, errors.New("injected"))
	r.apply("check, generation unreadable", pass, b, 1)
	nft("flush", "chain", "inet", dataplane.NFTTable, "tabby-fw-calia")
	if st := r.apply("repair, generation unreadable", pass, b, 1); st.ChainsWritten != 1 {
		t.Errorf("repair without the generation: %+v", st)
	}
	dataplane.SetNFTGenFault(r.f, nil)
	r.apply("check, generation back", pass, b, 1) // the record made without it is not trusted
	r.apply("check after that", pass, b, 0)
	logged := r.log.String()
	if n := strings.Count(logged, "level=WARN"); n != 1 || !strings.Contains(logged, "injected") {
		t.Errorf("want one warning naming the error, logged:\n%s", logged)
	}
	if !strings.Contains(logged, "readable again") {
		t.Errorf("want a note when the generation is readable again, logged:\n%s", logged)
	}
}

// TestPrivilegedNFTablesGenerationSplitBatch: an own write of more rules
// than one batch holds commits in parts, each bumping the generation; the
// record counts them and stays trusted.
func TestPrivilegedNFTablesGenerationSplitBatch(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	r := newNFTGenRig(t)
	a := bigNFTState(5, 10, 1000) // 5,000 rules in 1,000 chains
	b := bigNFTState(5, 10, 1000)
	for i := range b.Chains {
		b.Chains[i] = shiftPorts(b.Chains[i], 100)
	}
	r.apply("first apply", 0, a, 1)
	if st := r.apply("own write of every chain", time.Second, b, 0); st.RulesWritten < 5000 {
		t.Errorf("own write: %+v, want every rule written", st)
	}
	r.apply("check after it", 30*time.Second, b, 0)
}

// shiftPorts returns c with its rules' destination ports moved by d.
func shiftPorts(c policy.Chain, d uint16) policy.Chain {
	c.Rules = slices.Clone(c.Rules)
	for i, rule := range c.Rules {
		rule.Match = slices.Clone(rule.Match)
		for j, m := range rule.Match {
			if m.Kind == policy.MatchDstPorts {
				m.Ports = []policy.PortRange{{Lo: m.Ports[0].Lo + d, Hi: m.Ports[0].Hi + d}}
				rule.Match[j] = m
			}
		}
		c.Rules[i] = rule
	}
	return c
}
