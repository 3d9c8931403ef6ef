package bgp

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	gobgpapi "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp/session"
	"github.com/tabbynet/tabby/internal/testkit"
)

// TestPeerFamilies: a session is configured for the families the node has
// addresses of, and for no other. GoBGP allocates a 2,048-shard Adj-RIB-In
// table per configured family and peer (docs/scale.md, "Reflector memory"),
// so an IPv6 family on a node without IPv6 costs a reflector ≈ 180 KB a
// client for nothing.
func TestPeerFamilies(t *testing.T) {
	v4, v6 := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("fd00:198:18::1")
	for _, tc := range []struct {
		name string
		cfg  Config
		peer netip.Addr
		want []string
	}{
		{"IPv4 only", Config{RouterID: v4}, netip.MustParseAddr("198.18.0.2"), []string{"AFI_IP"}},
		{"dual stack, IPv4 peer", Config{RouterID: v4, RouterID6: v6}, netip.MustParseAddr("198.18.0.2"), []string{"AFI_IP", "AFI_IP6"}},
		{"dual stack, IPv6 peer", Config{RouterID: v4, RouterID6: v6}, netip.MustParseAddr("fd00:198:18::2"), []string{"AFI_IP", "AFI_IP6"}},
		{"IPv6 only", Config{RouterID: netip.MustParseAddr("10.255.0.1"), RouterID6: v6, IPv6Only: true}, netip.MustParseAddr("fd00:198:18::2"), []string{"AFI_IP6"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &speaker{lifecycle: lifecycle{cfg: tc.cfg}}
			ap := s.toAPIPeer(Peer{Address: tc.peer, ASN: api.DefaultASNumber, Type: PeerRRClient, ClusterNode: true, RRClient: true}, false)
			var got []string
			for _, af := range ap.AfiSafis {
				if af.Config.Family.Safi != gobgpapi.Family_SAFI_UNICAST {
					t.Errorf("family %v: not unicast", af.Config.Family)
				}
				got = append(got, af.Config.Family.Afi.String())
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("families (-want +got):\n%s", diff)
			}
		})
	}
}

// BenchmarkReflectorHeapPerPeer: the live heap a route reflector's speaker
// holds per configured client before any session is up (GoBGP's peer, its
// FSM and its Adj-RIB-In tables, and our own records), for an IPv4-only
// and a dual-stack node. The clients have higher addresses than the
// reflector, so the reflector waits for them (passive) and none connects:
// what is measured is the configuration alone.
func BenchmarkReflectorHeapPerPeer(b *testing.B) {
	const peers = 200
	rr := netip.MustParseAddr("127.77.90.1")
	for _, tc := range []struct {
		name string
		v6   netip.Addr
	}{
		{"ipv4", netip.Addr{}},
		{"dual-stack", netip.MustParseAddr("fd00:77:90::1")},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var perPeer float64
			for b.Loop() {
				perPeer = reflectorHeap(b, rr, tc.v6, peers)
			}
			b.ReportMetric(perPeer, "B/peer")
		})
	}
}

// reflectorHeap starts a reflector, configures n clients and returns the
// live heap that added per client.
func reflectorHeap(b *testing.B, rr, rr6 netip.Addr, n int) float64 {
	b.Helper()
	sp := NewSpeaker(testLogger(b)).(*speaker)
	cfg := Config{RouterID: rr, RouterID6: rr6, ASN: api.DefaultASNumber, ListenAddr: rr, ListenPort: -1,
		ClusterID: "244.0.0.1", GracefulRestart: true, RestartTime: 30 * time.Second}
	ctx := context.Background()
	if err := sp.Start(ctx, cfg); err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := sp.Stop(false); err != nil {
			b.Error(err)
		}
	}()
	if err := sp.SetPolicy(ctx, Policy{Pools: []netip.Prefix{testPool}}); err != nil {
		b.Fatal(err)
	}
	before := testkit.HeapAfterGC()
	var peers []Peer
	for i := range n {
		a := netip.AddrFrom4([4]byte{127, 77, 91 + byte(i/250), byte(1 + i%250)})
		peers = append(peers, Peer{Address: a, ASN: api.DefaultASNumber, Type: PeerRRClient, Name: fmt.Sprintf("client%d", i), ClusterNode: true, RRClient: true})
	}
	if err := sp.SetPeers(ctx, peers); err != nil {
		b.Fatal(err)
	}
	after := testkit.HeapAfterGC()
	return float64(int64(after)-int64(before)) / float64(n)
}

// BenchmarkSessions1000: reading a reflector's thousand sessions
// (statusLoop does it after each coalesced session event).
func BenchmarkSessions1000(b *testing.B) {
	s := NewSpeaker(nil).(*speaker)
	now := time.Now()
	for i := range 1000 {
		a := netip.AddrFrom4([4]byte{198, 18, 4 + byte(i>>8), byte(i)})
		s.putPeer(Peer{Address: a, ASN: api.DefaultASNumber, Type: PeerRRClient, ClusterNode: true, RRClient: true})
		s.sessions.observe(a, session.Established, now, "")
		s.sessions.families[a] = []string{"ipv4"}
	}
	for b.Loop() {
		if len(s.Sessions()) != 1000 {
			b.Fatal("sessions lost")
		}
	}
}

// TestSessionsOrderFollowsPeers: Sessions lists the configured peers in
// address order, also after peers are added and removed (its cached order
// is checked against the peers on every read).
func TestSessionsOrderFollowsPeers(t *testing.T) {
	s := NewSpeaker(nil).(*speaker)
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, 4, byte(i)}) }
	list := func() []netip.Addr {
		var out []netip.Addr
		for _, st := range s.Sessions() {
			out = append(out, st.Address)
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		add, del []int
		want     []int
	}{
		{name: "three", add: []int{30, 10, 20}, want: []int{10, 20, 30}},
		{name: "one more", add: []int{15}, want: []int{10, 15, 20, 30}},
		{name: "one replaced, same count", add: []int{5}, del: []int{30}, want: []int{5, 10, 15, 20}},
		{name: "all gone", del: []int{5, 10, 15, 20}},
	} {
		for _, i := range tc.add {
			s.putPeer(Peer{Address: addr(i)})
		}
		for _, i := range tc.del {
			s.dropPeer(addr(i))
		}
		var want []netip.Addr
		for _, i := range tc.want {
			want = append(want, addr(i))
		}
		if diff := cmp.Diff(want, list(), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
			t.Errorf("%s: sessions (-want +got):\n%s", tc.name, diff)
		}
	}
}

// TestPeerEventsReadRIB: a session's steps while it is not up read no
// path; leaving or reaching Established does, and any step of a peer
// whose paths count by its state (prefix limit, BFD) does.
func TestPeerEventsReadRIB(t *testing.T) {
	client := netip.MustParseAddr("198.18.4.1")
	external := netip.MustParseAddr("198.18.0.1")
	s := NewSpeaker(nil).(*speaker)
	s.putPeer(Peer{Address: client, Type: PeerRRClient, ClusterNode: true, RRClient: true})
	s.putPeer(Peer{Address: external, Type: PeerGlobal}) // the default prefix limit
	steps := []struct {
		peer netip.Addr
		to   gobgp.FSMState
		want bool
	}{
		{client, gobgp.BGP_FSM_ACTIVE, false},
		{client, gobgp.BGP_FSM_OPENSENT, false},
		{client, gobgp.BGP_FSM_OPENCONFIRM, false},
		{client, gobgp.BGP_FSM_ESTABLISHED, true},
		{client, gobgp.BGP_FSM_IDLE, true},
		{client, gobgp.BGP_FSM_ACTIVE, false},
		{client, gobgp.BGP_FSM_IDLE, false},
		{external, gobgp.BGP_FSM_ACTIVE, true},
	}
	for i, st := range steps {
		s.resyncAll = false
		ev := &apiutil.WatchEventMessage_PeerEvent{Type: apiutil.PEER_EVENT_STATE,
			Peer: apiutil.Peer{State: apiutil.PeerState{NeighborAddress: st.peer, SessionState: st.to}}}
		s.onPeerEvent(ev, time.Now())
		if s.resyncAll != st.want {
			t.Errorf("step %d, %v to %v: full read %v, want %v", i, st.peer, st.to, s.resyncAll, st.want)
		}
	}
}
