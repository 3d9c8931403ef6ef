package bgp

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	gobgpapi "github.com/osrg/gobgp/v4/api"
)

// The BFD watch calls a peer silent from GoBGP's counters alone: it is
// pure, so the test walks it through time by hand.
func TestBFDWatch(t *testing.T) {
	const (
		up   = gobgpapi.BfdSessionState_BFD_SESSION_STATE_UP
		down = gobgpapi.BfdSessionState_BFD_SESSION_STATE_DOWN
	)
	tor, slow, other := a("198.18.0.1"), a("198.18.0.2"), a("198.18.0.3")
	cfg := map[netip.Addr]BFD{
		tor:  {Interval: 300 * time.Millisecond, Multiplier: 3},
		slow: {Interval: 300 * time.Millisecond, Multiplier: 3},
	}
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	type step struct {
		at      time.Time
		cfg     map[netip.Addr]BFD // nil: cfg
		samples map[netip.Addr]bfdSample
		want    []netip.Addr
	}
	steps := []step{
		// GoBGP has no session yet for slow: not Up, so down.
		{at: ms(0), samples: map[netip.Addr]bfdSample{tor: {up, 1}}, want: []netip.Addr{slow}},
		// slow comes up; tor's packets arrive every 300 ms, slow's every second.
		{at: ms(300), samples: map[netip.Addr]bfdSample{tor: {up, 2}, slow: {up, 1}}},
		{at: ms(600), samples: map[netip.Addr]bfdSample{tor: {up, 3}, slow: {up, 1}}},
		{at: ms(900), samples: map[netip.Addr]bfdSample{tor: {up, 4}, slow: {up, 1}}},
		{at: ms(1300), samples: map[netip.Addr]bfdSample{tor: {up, 5}, slow: {up, 2}}},
		{at: ms(2300), samples: map[netip.Addr]bfdSample{tor: {up, 9}, slow: {up, 3}}},
		{at: ms(3300), samples: map[netip.Addr]bfdSample{tor: {up, 12}, slow: {up, 4}}},
		{at: ms(4300), samples: map[netip.Addr]bfdSample{tor: {up, 15}, slow: {up, 5}}},
		// Both go silent at 4300; GoBGP still says Up (its reset of the
		// session is pending). Not yet the detection time for tor.
		{at: ms(5100), samples: map[netip.Addr]bfdSample{tor: {up, 15}, slow: {up, 5}}},
		// 900 ms without a packet: tor is silent. slow, whose packets came
		// every second, is given its multiplier times that period.
		{at: ms(5200), samples: map[netip.Addr]bfdSample{tor: {up, 15}, slow: {up, 5}}, want: []netip.Addr{tor}},
		{at: ms(7000), samples: map[netip.Addr]bfdSample{tor: {up, 15}, slow: {up, 5}}, want: []netip.Addr{tor}},
		{at: ms(8100), samples: map[netip.Addr]bfdSample{tor: {up, 15}, slow: {up, 5}}, want: []netip.Addr{tor, slow}},
		// GoBGP finished its reset: both Down.
		{at: ms(9000), samples: map[netip.Addr]bfdSample{tor: {down, 15}, slow: {down, 5}}, want: []netip.Addr{tor, slow}},
		// tor's session is re-created (counters restart) and comes up.
		{at: ms(9500), samples: map[netip.Addr]bfdSample{tor: {up, 2}, slow: {down, 5}}, want: []netip.Addr{slow}},
		{at: ms(9800), samples: map[netip.Addr]bfdSample{tor: {up, 3}, slow: {down, 5}}, want: []netip.Addr{slow}},
		// slow no longer runs BFD; other does, GoBGP has nothing for it.
		{at: ms(9900), cfg: map[netip.Addr]BFD{tor: cfg[tor], other: cfg[tor]}, samples: map[netip.Addr]bfdSample{tor: {up, 3}}, want: []netip.Addr{other}},
		// A sampler that was late (the watch's goroutine starved) sees the
		// counter moved: not silent.
		{at: ms(15000), cfg: map[netip.Addr]BFD{tor: cfg[tor]}, samples: map[netip.Addr]bfdSample{tor: {up, 4}}},
	}
	var w bfdWatch
	for i, s := range steps {
		c := s.cfg
		if c == nil {
			c = cfg
		}
		got := w.observe(s.at, c, s.samples)
		var gotList []netip.Addr
		for a := range got {
			gotList = append(gotList, a)
		}
		if diff := cmp.Diff(s.want, gotList, cmpopts.EquateEmpty(), cmpopts.SortSlices(netip.Addr.Less), cmpopts.EquateComparable(netip.Addr{})); diff != "" {
			t.Errorf("step %d (t=%v): silent peers (-want +got):\n%s", i, s.at.Sub(t0), diff)
		}
	}
}
