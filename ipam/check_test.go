package ipam

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// snapBuilder builds consistent snapshots that tests then break.
type snapBuilder struct{ s *snapshot }

func newSnap() *snapBuilder {
	return &snapBuilder{s: &snapshot{pools: []poolInfo{testPool("default", "10.244.0.0/24", 30)}, bad: map[string]error{}}}
}

func (sb *snapBuilder) block(cidr, node string) *block {
	b := newBlock(netip.MustParsePrefix(cidr), node, "default")
	sb.s.blocks = append(sb.s.blocks, b)
	if node != "" {
		sb.s.affinities = append(sb.s.affinities, affinity{node: node, block: b.cidr, state: affinityConfirmed})
	}
	return b
}

// alloc allocates addr in b for handle, with handle record and endpoint.
func (sb *snapBuilder) alloc(b *block, addr, h, node string, withEndpoint bool) {
	a := netip.MustParseAddr(addr)
	if err := b.allocateAddr(a, attrRecord{Handle: h, Node: node, Time: t0}); err != nil {
		panic(err)
	}
	sb.s.handles = append(sb.s.handles, &handle{handleRecord: handleRecord{Handle: h, Node: node, Addrs: []handleAddr{{Addr: a, Block: b.cidr}}}})
	if withEndpoint {
		sb.s.endpoints = append(sb.s.endpoints, endpointInfo{key: "ns/" + h, node: node, handle: h, addrs: []netip.Addr{a}})
	}
}

func kinds(r Report) []string {
	var out []string
	for _, i := range r.Inconsistencies {
		out = append(out, i.Kind+" "+i.Key)
	}
	return out
}

func TestCheckSnapshot(t *testing.T) {
	tests := []struct {
		name         string
		build        func(sb *snapBuilder)
		grace        time.Duration
		wantLeaks    []string
		wantOrphans  []string // handle/addr/reason-prefix
		wantProblems []string
	}{
		{
			name: "consistent",
			build: func(sb *snapBuilder) {
				b := sb.block("10.244.0.0/30", "n1")
				sb.alloc(b, "10.244.0.1", "h1", "n1", true)
				sb.alloc(b, "10.244.0.2", "h2", "n2", true) // borrowed is fine
				sb.block("10.244.0.4/30", "")
			},
		},
		{
			name: "leak past grace",
			build: func(sb *snapBuilder) {
				b := sb.block("10.244.0.0/30", "n1")
				sb.alloc(b, "10.244.0.1", "h1", "n1", false)
			},
			grace:     time.Minute,
			wantLeaks: []string{"10.244.0.1"},
		},
		{
			name: "a node's tunnel address is not a leak",
			build: func(sb *snapBuilder) {
				b := sb.block("10.244.0.0/30", "n1")
				sb.alloc(b, "10.244.0.0", TunnelHandle("n1"), "n1", false)
				sb.alloc(b, "10.244.0.1", "h1", "n1", false)
			},
			grace:     time.Minute,
			wantLeaks: []string{"10.244.0.1"},
		},
		{
			name: "young allocation is not a leak",
			build: func(sb *snapBuilder) {
				b := sb.block("10.244.0.0/30", "n1")
				sb.alloc(b, "10.244.0.1", "h1", "n1", false)
			},
			grace: 2 * time.Hour,
		},
		{
			name: "handle without allocation and allocation without handle",
			build: func(sb *snapBuilder) {
				b := sb.block("10.244.0.0/30", "n1")
				sb.alloc(b, "10.244.0.1", "h1", "n1", true)
				sb.s.handles = append(sb.s.handles,
					&handle{handleRecord: handleRecord{Handle: "ghost", Addrs: []handleAddr{{Addr: netip.MustParseAddr("10.244.0.3"), Block: b.cidr}}}},
					&handle{handleRecord: handleRecord{Handle: "empty"}})
				sb.s.handles = sb.s.handles[1:] // drop h1's record
			},
			wantOrphans: []string{
				"empty  handle record lists no addresses",
				"ghost 10.244.0.3 handle lists an address that is not allocated",
				"h1 10.244.0.1 allocation's handle has no record of it",
			},
		},
		{
			name: "handle claims someone else's address",
			build: func(sb *snapBuilder) {
				b := sb.block("10.244.0.0/30", "n1")
				sb.alloc(b, "10.244.0.1", "h1", "n1", true)
				sb.s.handles[0].Handle = "h2"
			},
			wantOrphans: []string{
				`h1 10.244.0.1 allocation's handle has no record of it`,
				`h2 10.244.0.1 handle lists an address allocated to handle "h1"`,
			},
		},
		{
			name: "duplicate address in overlapping blocks",
			build: func(sb *snapBuilder) {
				b := sb.block("10.244.0.0/30", "n1")
				sb.alloc(b, "10.244.0.1", "h1", "n1", true)
				b2 := sb.block("10.244.0.0/29", "n2")
				b2.pool = "default"
				if err := b2.allocateAddr(netip.MustParseAddr("10.244.0.1"), attrRecord{Handle: "h2", Node: "n2", Time: t0}); err != nil {
					panic(err)
				}
				sb.s.handles = append(sb.s.handles, &handle{handleRecord: handleRecord{Handle: "h2", Addrs: []handleAddr{{Addr: netip.MustParseAddr("10.244.0.1"), Block: b2.cidr}}}})
			},
			// Blocks are examined in CIDR order (the /29 first), so h2 is
			// the address's first holder and h1's record and endpoint
			// disagree with it.
			wantOrphans:  []string{`h1 10.244.0.1 handle lists an address allocated to handle "h2"`},
			wantProblems: []string{"blocks-overlap 10.244.0.0-29", "duplicate-address 10.244.0.0-30", "endpoint-handle-mismatch ns/h1"},
		},
		{
			name: "block outside pools, wrong pool name",
			build: func(sb *snapBuilder) {
				sb.block("10.9.0.0/30", "")
				sb.block("10.244.0.8/30", "").pool = "other"
			},
			wantProblems: []string{"block-outside-pools 10.9.0.0-30", "block-pool-mismatch 10.244.0.8-30"},
		},
		{
			name: "affinity records out of step",
			build: func(sb *snapBuilder) {
				sb.block("10.244.0.0/30", "n1")
				sb.block("10.244.0.4/30", "n2")
				sb.block("10.244.0.8/30", "n3")
				sb.s.affinities = []affinity{
					{node: "n2", block: netip.MustParsePrefix("10.244.0.4/30"), state: affinityPending},
					{node: "n3", block: netip.MustParsePrefix("10.244.0.8/30"), state: affinityConfirmed},
					{node: "n4", block: netip.MustParsePrefix("10.244.0.8/30"), state: affinityConfirmed},
					{node: "n5", block: netip.MustParsePrefix("10.244.0.12/30"), state: affinityPending},
				}
			},
			wantProblems: []string{
				"affinity-missing 10.244.0.0-30",
				"affinity-not-confirmed 10.244.0.4-30",
				"affinity-stale ipam/affinities/n4/10.244.0.8-30",
				"affinity-stale ipam/affinities/n5/10.244.0.12-30",
			},
		},
		{
			name: "endpoints out of step",
			build: func(sb *snapBuilder) {
				b := sb.block("10.244.0.0/30", "n1")
				sb.alloc(b, "10.244.0.1", "h1", "n1", true)
				sb.s.endpoints[0].handle = "other"
				sb.s.endpoints = append(sb.s.endpoints, endpointInfo{key: "ns/stray", node: "n1", addrs: []netip.Addr{netip.MustParseAddr("10.244.0.2")}})
			},
			wantProblems: []string{"endpoint-handle-mismatch ns/h1", "endpoint-unallocated ns/stray"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sb := newSnap()
			tt.build(sb)
			r := checkSnapshot(sb.s, t0.Add(time.Hour), tt.grace)
			var leaks, orphans []string
			for _, l := range r.Leaks {
				leaks = append(leaks, l.Addr.String())
			}
			for _, o := range r.OrphanHandles {
				a := ""
				if o.Addr.IsValid() {
					a = o.Addr.String()
				}
				orphans = append(orphans, o.Handle+" "+a+" "+o.Reason)
			}
			opt := cmpopts.EquateEmpty()
			if diff := cmp.Diff(tt.wantLeaks, leaks, opt); diff != "" {
				t.Errorf("leaks (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantOrphans, orphans, opt); diff != "" {
				t.Errorf("orphan handles (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantProblems, kinds(r), opt); diff != "" {
				t.Errorf("inconsistencies (-want +got):\n%s\n%+v", diff, r.Inconsistencies)
			}
			if want := len(tt.wantLeaks)+len(tt.wantOrphans)+len(tt.wantProblems) == 0; r.OK() != want {
				t.Errorf("OK() = %v, want %v", r.OK(), want)
			}
		})
	}
}

func TestUsage(t *testing.T) {
	sb := newSnap()
	b := sb.block("10.244.0.0/30", "n1")
	sb.alloc(b, "10.244.0.1", "h1", "n1", true)
	sb.alloc(b, "10.244.0.2", "h2", "n2", true)
	b2 := sb.block("10.244.0.4/30", "")
	sb.alloc(b2, "10.244.0.4", "h3", "n2", true)
	sb.block("10.9.0.0/30", "")
	got := usage(sb.s)
	want := []PoolUsage{
		{
			Name: "default", CIDR: netip.MustParsePrefix("10.244.0.0/24"), BlockSize: 30,
			Total: 256, InUse: 3, Free: 253, Borrowed: 2, SizeBits: 8,
			Blocks: []BlockUsage{
				{CIDR: netip.MustParsePrefix("10.244.0.0/30"), Affinity: "n1", Total: 4, InUse: 2, Free: 2, Borrowed: 1},
				{CIDR: netip.MustParsePrefix("10.244.0.4/30"), Total: 4, InUse: 1, Free: 3, Borrowed: 1},
			},
		},
		{
			Total: 4, Free: 4,
			Blocks: []BlockUsage{{CIDR: netip.MustParsePrefix("10.9.0.0/30"), Total: 4, Free: 4}},
		},
	}
	if diff := cmp.Diff(want, got, netipOpts); diff != "" {
		t.Errorf("usage (-want +got):\n%s", diff)
	}
}
