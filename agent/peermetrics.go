package agent

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tabbynet/tabby/bgp"
)

// peerMetrics exports the BGP sessions' series (tabby_bgp_peers by state,
// tabby_bgp_peer_prefixes and tabby_bgp_peer_bfd_up per peer) from the last
// status the BGP owner handed over, built when a scrape asks. A status
// change costs a pointer store: gauge vectors reset and refilled on every
// change made a reflector with a thousand clients rebuild ≈ 4,000 series
// per session event (a tenth of its CPU while sessions came and went,
// docs/scale.md "Reflector memory and CPU at rest").
type peerMetrics struct {
	last                   atomic.Pointer[[]bgp.PeerStatus]
	peers, prefixes, bfdUp *prometheus.Desc
}

func newPeerMetrics() *peerMetrics {
	return &peerMetrics{
		peers: prometheus.NewDesc("tabby_bgp_peers", "Configured BGP peers, by session state.", []string{"state"}, nil),
		prefixes: prometheus.NewDesc("tabby_bgp_peer_prefixes",
			"Per BGP peer: prefixes received (before import policy), the max-prefix limit (0: none), and 1 when the session was shut down for exceeding it.",
			[]string{"peer", "kind"}, nil),
		bfdUp: prometheus.NewDesc("tabby_bgp_peer_bfd_up",
			"1 when the BFD session with a BGP peer is up, 0 when BFD is enabled for the peer but not up.", []string{"peer"}, nil),
	}
}

// set makes st the status the next scrape exports. st is read, never
// changed, afterwards: the caller hands it over. Safe for concurrent use.
func (c *peerMetrics) set(st []bgp.PeerStatus) { c.last.Store(&st) }

// Describe implements prometheus.Collector.
func (c *peerMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.peers
	ch <- c.prefixes
	ch <- c.bfdUp
}

// Collect implements prometheus.Collector.
func (c *peerMetrics) Collect(ch chan<- prometheus.Metric) {
	p := c.last.Load()
	if p == nil {
		return
	}
	st := *p
	states := map[string]int{}
	for _, s := range st {
		states[s.State.String()]++
		peer := s.Address.String()
		over := 0.0
		if s.PrefixLimitExceeded {
			over = 1
		}
		ch <- prometheus.MustNewConstMetric(c.prefixes, prometheus.GaugeValue, float64(s.Received), peer, "received")
		ch <- prometheus.MustNewConstMetric(c.prefixes, prometheus.GaugeValue, float64(s.MaxPrefixes), peer, "limit")
		ch <- prometheus.MustNewConstMetric(c.prefixes, prometheus.GaugeValue, over, peer, "limit_exceeded")
		if s.BFD != "" {
			up := 0.0
			if s.BFD == "Up" {
				up = 1
			}
			ch <- prometheus.MustNewConstMetric(c.bfdUp, prometheus.GaugeValue, up, peer)
		}
	}
	for state, n := range states {
		ch <- prometheus.MustNewConstMetric(c.peers, prometheus.GaugeValue, float64(n), state)
	}
}
