package bgp

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/internal/testkit"
)

// TestSimSessionAdvertisesToRealSpeaker: a simulated node (the higher
// address, so the one that connects) opens a session with a real speaker,
// announces two blocks and withdraws one; the speaker learns
// them with the node's address as next hop, then forgets the withdrawn one.
func TestSimSessionAdvertisesToRealSpeaker(t *testing.T) {
	rr := netip.MustParseAddr("127.77.90.1")
	simAddr := netip.MustParseAddr("127.77.90.2")
	port := freePort(t, []netip.Addr{rr, simAddr})
	n := startNode(t, "rr", Config{RouterID: rr, ASN: api.DefaultASNumber, ListenAddr: rr, ListenPort: int32(port),
		ClusterID: "244.0.0.1", GracefulRestart: true})
	// Bounded: a GoBGP that never answers fails the test here, by name,
	// instead of hanging the package (one unexplained hang, session 14).
	setCtx, setCancel := context.WithTimeout(context.Background(), time.Minute)
	defer setCancel()
	if err := n.sp.SetPeers(setCtx, []Peer{{Address: simAddr, ASN: api.DefaultASNumber, Type: PeerMesh,
		ClusterNode: true, Port: port, LocalAddress: rr}}); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s, runErr := establishSim(ctx, t, simAddr, netip.AddrPortFrom(rr, port))
	defer func() {
		cancel()
		if err := <-runErr; err != nil && !errors.Is(err, net.ErrClosed) {
			t.Logf("sim session ended: %v", err)
		}
	}()
	b1, b2 := netip.MustParsePrefix("10.244.7.0/26"), netip.MustParsePrefix("10.244.7.64/26")
	if err := s.Announce([]netip.Prefix{b1, b2}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	if rs, ok := n.watch.waitFor(deadline, func(rs []LearnedRoute) bool {
		return hasRoute(rs, b1, simAddr) && hasRoute(rs, b2, simAddr)
	}); !ok {
		t.Fatalf("speaker did not learn both blocks via %s: %s", simAddr, routesString(rs))
	}
	if err := s.Withdraw([]netip.Prefix{b2}); err != nil {
		t.Fatal(err)
	}
	if rs, ok := n.watch.waitFor(deadline, func(rs []LearnedRoute) bool {
		return hasRoute(rs, b1, simAddr) && lacksRoute(rs, b2)
	}); !ok {
		t.Fatalf("speaker kept the withdrawn block: %s", routesString(rs))
	}
}

// establishSim connects a simulated node from local to the speaker and
// runs its session until it is established, again (as a speaker's connect
// retry would) while the speaker refuses the connection or closes it
// before its OPEN: GoBGP accepts and drops a connection whose peer is still
// Idle, which under load lasts past SetPeers. A NOTIFICATION other than a
// cease (a configuration the speaker refuses) fails at once, as does ctx
// ending. The session runs until ctx ends; its Run's result arrives on
// runErr.
func establishSim(ctx context.Context, t *testing.T, local netip.Addr, to netip.AddrPort) (s *SimSession, runErr chan error) {
	t.Helper()
	const within = time.Minute
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(local, 0)), Timeout: 10 * time.Second}
	deadline := time.Now().Add(within)
	var last error
	for attempt := 1; time.Now().Before(deadline); attempt++ {
		if attempt > 1 {
			time.Sleep(200 * time.Millisecond)
		}
		if ctx.Err() != nil {
			t.Fatalf("session not established: %v (attempt %d, last: %v)", ctx.Err(), attempt, last)
		}
		conn, err := d.DialContext(ctx, "tcp", to.String())
		if err != nil {
			last = err
			continue
		}
		s = NewSimSession(conn, SimConfig{ASN: api.DefaultASNumber, RouterID: local, HoldTime: 9 * time.Second})
		runErr = make(chan error, 1)
		go func() { runErr <- s.Run(ctx) }()
		select {
		case <-s.Established():
			return s, runErr
		case err := <-runErr:
			last = err
			if d := (*SimDrop)(nil); errors.As(err, &d) && d.Code != 0 && d.Code != 6 {
				t.Fatalf("session refused with a NOTIFICATION: %v", err)
			}
			t.Logf("attempt %d: session ended before established: %v", attempt, err)
		case <-time.After(time.Until(deadline)):
			conn.Close() // ends Run
			t.Fatalf("session not established in %s (attempt %d)", within, attempt)
		}
	}
	t.Fatalf("session not established in %s: %v", within, last)
	return nil, nil
}

// announced reads the prefixes an UPDATE announces, not those it
// withdraws; a body that does not parse gives none.
func TestSimAnnounced(t *testing.T) {
	b1, b2, gone := netip.MustParsePrefix("10.244.7.0/26"), netip.MustParsePrefix("10.244.9.64/26"), netip.MustParsePrefix("10.244.1.0/26")
	msg, err := simUpdate(t, []netip.Prefix{gone}, []netip.Prefix{b1, b2}).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	body := msg[gobgp.BGP_HEADER_LENGTH:]
	if diff := cmp.Diff([]netip.Prefix{b1, b2}, announced(body), cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
		t.Errorf("announced (-want +got):\n%s", diff)
	}
	if got := announced(body[:len(body)-3]); len(got) != 0 {
		t.Errorf("announced(truncated) = %v, want none", got)
	}
}

// A simulated node counts the UPDATEs its peer sends and hands the
// prefixes they announce to OnUpdate (the harness's observer).
func TestSimSessionCountsUpdates(t *testing.T) {
	got := make(chan []netip.Prefix, 4)
	s, peer := startSimPeer(t, SimConfig{OnUpdate: func(ps []netip.Prefix) { got <- ps }})
	block := netip.MustParsePrefix("10.244.7.0/26")
	sendUpdates(t, peer, simUpdate(t, nil, []netip.Prefix{block}), simUpdate(t, []netip.Prefix{block}, nil))
	select {
	case ps := <-got:
		if len(ps) != 1 || ps[0] != block {
			t.Errorf("OnUpdate got %v, want [%v]", ps, block)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no UPDATE reached OnUpdate")
	}
	testkit.Eventually(t, 10*time.Second, "both UPDATEs (an announcement and a withdrawal) counted", testkit.Cond(func() bool { return s.Updates() == 2 }))
	select {
	case ps := <-got:
		t.Errorf("OnUpdate got %v for a withdrawal", ps)
	default:
	}
	if s.Held() != 0 {
		t.Errorf("Held() = %d without Track, want 0", s.Held())
	}
}

// With Track a session holds what the peer announced and did not
// withdraw since, of the prefixes Track takes: a prefix announced twice
// counts once, a withdrawal in the same UPDATE as announcements applies
// too.
func TestSimSessionTracksHeld(t *testing.T) {
	other := netip.MustParsePrefix("10.244.200.0/26") // not one Track takes: not counted
	s, peer := startSimPeer(t, SimConfig{Track: func(p netip.Prefix) bool { return p != other }})
	b1, b2, b3 := netip.MustParsePrefix("10.244.7.0/26"), netip.MustParsePrefix("10.244.9.64/26"), netip.MustParsePrefix("10.244.1.0/26")
	sendUpdates(t, peer, simUpdate(t, nil, []netip.Prefix{b1, other, b2}))
	testkit.Eventually(t, 10*time.Second, "two prefixes held", testkit.Cond(func() bool { return s.Held() == 2 }))
	sendUpdates(t, peer, simUpdate(t, []netip.Prefix{b1}, []netip.Prefix{b3}), simUpdate(t, nil, []netip.Prefix{b2}))
	testkit.Eventually(t, 10*time.Second, "b2 and b3 held after b1's withdrawal and b2 again", testkit.Cond(func() bool { return s.Updates() == 3 }))
	if got := s.Held(); got != 2 {
		t.Errorf("Held() = %d, want 2 (b2, b3)", got)
	}
	if got := s.Lacks([]netip.Prefix{b1, b2, b3}, 3); !slices.Equal(got, []netip.Prefix{b1}) {
		t.Errorf("Lacks(b1, b2, b3) = %v, want [b1 %v]", got, b1)
	}
	if got := s.Lacks([]netip.Prefix{b1, other, b2}, 1); !slices.Equal(got, []netip.Prefix{b1}) {
		t.Errorf("Lacks(b1, other, b2) at most 1 = %v, want [b1 %v]", got, b1)
	}
	sendUpdates(t, peer, simUpdate(t, []netip.Prefix{b2, b3}, nil))
	testkit.Eventually(t, 10*time.Second, "nothing held after both are withdrawn", testkit.Cond(func() bool { return s.Held() == 0 }))
}

// startSimPeer runs a simulated node's session (cfg's ASN and router ID
// filled in) on a pipe, and plays the peer up to established: OPEN and
// KEEPALIVE. The session ends with the test.
func startSimPeer(t *testing.T, cfg SimConfig) (*SimSession, net.Conn) {
	t.Helper()
	here, peer := net.Pipe()
	cfg.ASN, cfg.RouterID = api.DefaultASNumber, netip.MustParseAddr("198.18.4.2")
	s := NewSimSession(here, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-runErr })
	go io.Copy(io.Discard, peer) // what the simulated node sends
	open, err := gobgp.NewBGPOpenMessage(uint16(api.DefaultASNumber), 90, netip.MustParseAddr("198.18.0.11"), nil)
	if err != nil {
		t.Fatal(err)
	}
	sendUpdates(t, peer, open, gobgp.NewBGPKeepAliveMessage())
	return s, peer
}

// simUpdate is an UPDATE withdrawing out and announcing in.
func simUpdate(t *testing.T, out, in []netip.Prefix) *gobgp.BGPMessage {
	t.Helper()
	withdrawn, err := simNLRI(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(in) == 0 {
		return gobgp.NewBGPUpdateMessage(withdrawn, nil, nil)
	}
	nlri, err := simNLRI(in)
	if err != nil {
		t.Fatal(err)
	}
	nh, err := gobgp.NewPathAttributeNextHop(netip.MustParseAddr("198.18.4.9"))
	if err != nil {
		t.Fatal(err)
	}
	attrs := []gobgp.PathAttributeInterface{gobgp.NewPathAttributeOrigin(gobgp.BGP_ORIGIN_ATTR_TYPE_IGP), gobgp.NewPathAttributeAsPath(nil), nh}
	return gobgp.NewBGPUpdateMessage(withdrawn, attrs, nlri)
}

// sendUpdates writes the peer's messages.
func sendUpdates(t *testing.T, peer net.Conn, ms ...*gobgp.BGPMessage) {
	t.Helper()
	for _, m := range ms {
		b, err := m.Serialize()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Write(b); err != nil {
			t.Fatal(err)
		}
	}
}
