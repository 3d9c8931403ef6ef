package agent

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/bgp/session"
)

// gatherLines renders what a registry exports as sorted
// `name{label="value",...} value` lines.
func gatherLines(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			out = append(out, fmt.Sprintf("%s{%s} %g", mf.GetName(), strings.Join(ls, ","), m.GetGauge().GetValue()))
		}
	}
	slices.Sort(out)
	return out
}

// TestPeerMetrics: the per-peer series follow the last status handed over,
// peers gone from it disappear, and nothing is exported before the first.
func TestPeerMetrics(t *testing.T) {
	a, b := netip.MustParseAddr("198.18.0.2"), netip.MustParseAddr("198.18.0.3")
	for _, tc := range []struct {
		name string
		sets [][]bgp.PeerStatus
		want []string
	}{
		{name: "none yet"},
		{
			name: "two peers, one with BFD and over its limit",
			sets: [][]bgp.PeerStatus{{
				{Address: a, State: session.Established, Received: 7},
				{Address: b, State: session.Idle, MaxPrefixes: 100, PrefixLimitExceeded: true, BFD: "Down"},
			}},
			want: []string{
				`tabby_bgp_peer_bfd_up{peer="198.18.0.3"} 0`,
				`tabby_bgp_peer_prefixes{kind="limit",peer="198.18.0.2"} 0`,
				`tabby_bgp_peer_prefixes{kind="limit",peer="198.18.0.3"} 100`,
				`tabby_bgp_peer_prefixes{kind="limit_exceeded",peer="198.18.0.2"} 0`,
				`tabby_bgp_peer_prefixes{kind="limit_exceeded",peer="198.18.0.3"} 1`,
				`tabby_bgp_peer_prefixes{kind="received",peer="198.18.0.2"} 7`,
				`tabby_bgp_peer_prefixes{kind="received",peer="198.18.0.3"} 0`,
				`tabby_bgp_peers{state="Established"} 1`,
				`tabby_bgp_peers{state="Idle"} 1`,
			},
		},
		{
			name: "the last status wins, a removed peer goes",
			sets: [][]bgp.PeerStatus{
				{{Address: a, State: session.Idle}, {Address: b, State: session.Idle, BFD: "Down"}},
				{{Address: a, State: session.Established, Received: 3, BFD: "Up"}},
			},
			want: []string{
				`tabby_bgp_peer_bfd_up{peer="198.18.0.2"} 1`,
				`tabby_bgp_peer_prefixes{kind="limit",peer="198.18.0.2"} 0`,
				`tabby_bgp_peer_prefixes{kind="limit_exceeded",peer="198.18.0.2"} 0`,
				`tabby_bgp_peer_prefixes{kind="received",peer="198.18.0.2"} 3`,
				`tabby_bgp_peers{state="Established"} 1`,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			c := newPeerMetrics()
			reg.MustRegister(c)
			for _, st := range tc.sets {
				c.set(st)
			}
			if diff := cmp.Diff(tc.want, gatherLines(t, reg)); diff != "" {
				t.Errorf("series (-want +got):\n%s", diff)
			}
		})
	}
}

// BenchmarkPeerStatusChange: what a session event costs the metrics on a
// reflector with a thousand clients (the status handed over; a scrape
// builds the series).
func BenchmarkPeerStatusChange(b *testing.B) {
	m := newMetrics()
	st := make([]bgp.PeerStatus, 1000)
	for i := range st {
		st[i] = bgp.PeerStatus{Address: netip.AddrFrom4([4]byte{198, 18, 4 + byte(i>>8), byte(i)}), State: session.Established, Received: 1}
	}
	for b.Loop() {
		m.setPeers(slices.Clone(st))
	}
}

// TestSessionReadGap: a node with few peers reads its sessions at each
// event; a reflector lets them coalesce, at most 50 ms at 1,000 peers.
func TestSessionReadGap(t *testing.T) {
	for _, tc := range []struct {
		peers int
		want  time.Duration
	}{{0, 0}, {2, 0}, {100, 0}, {300, 10 * time.Millisecond}, {1000, 45 * time.Millisecond}} {
		if got := sessionReadGap(tc.peers); got != tc.want {
			t.Errorf("sessionReadGap(%d) = %v, want %v", tc.peers, got, tc.want)
		}
	}
}
