package bgp

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"github.com/tabbynet/tabby/api"
)

// fakePeer plays a reflector's side of a simulated session on a pipe.
type fakePeer struct {
	t    *testing.T
	conn net.Conn
}

func (p fakePeer) write(ms ...*gobgp.BGPMessage) {
	for _, m := range ms {
		b, err := m.Serialize()
		if err != nil {
			p.t.Error(err)
			return
		}
		if _, err := p.conn.Write(b); err != nil {
			return // the session ended first: its drop says why
		}
	}
}

func (p fakePeer) open(hold uint16) *gobgp.BGPMessage {
	m, err := gobgp.NewBGPOpenMessage(uint16(api.DefaultASNumber), hold, netip.MustParseAddr("198.18.0.11"), nil)
	if err != nil {
		p.t.Fatal(err)
	}
	return m
}

// drain reads what the simulated node sends.
func (p fakePeer) drain() {
	go func() {
		b := make([]byte, 4096)
		for {
			if _, err := p.conn.Read(b); err != nil {
				return
			}
		}
	}()
}

// TestSimDropCauses: each way a session ends is told apart — which side,
// how, and whether it had been established.
func TestSimDropCauses(t *testing.T) {
	type want struct {
		Side, Cause   string
		Code, Subcode uint8
		Established   bool
	}
	tests := []struct {
		name string
		peer func(p fakePeer)
		want want
	}{{
		name: "peer sends a cease after establishing",
		peer: func(p fakePeer) {
			p.drain()
			p.write(p.open(90), gobgp.NewBGPKeepAliveMessage(), gobgp.NewBGPNotificationMessage(6, 3, nil))
		},
		want: want{Side: SimSidePeer, Cause: SimNotification, Code: 6, Subcode: 3, Established: true},
	}, {
		name: "peer closes while opening",
		peer: func(p fakePeer) {
			p.drain()
			p.write(p.open(90))
			p.conn.Close()
		},
		want: want{Side: SimSidePeer, Cause: SimPeerClosed},
	}, {
		name: "peer closes after establishing",
		peer: func(p fakePeer) {
			p.drain()
			p.write(p.open(90), gobgp.NewBGPKeepAliveMessage())
			p.conn.Close()
		},
		want: want{Side: SimSidePeer, Cause: SimPeerClosed, Established: true},
	}, {
		name: "peer goes silent: the simulated node's hold timer",
		peer: func(p fakePeer) {
			p.drain()
			p.write(p.open(3), gobgp.NewBGPKeepAliveMessage())
		},
		want: want{Side: SimSideLocal, Cause: SimHoldExpired, Established: true},
	}, {
		name: "peer stops reading: a keepalive write fails",
		peer: func(p fakePeer) {
			go func() { // reads the OPEN and the first KEEPALIVE only
				b := make([]byte, 512)
				n := 0
				for n < 29+19 { // an OPEN without options, a KEEPALIVE
					k, err := p.conn.Read(b[n:])
					if err != nil {
						return
					}
					n += k
				}
			}()
			p.write(p.open(3), gobgp.NewBGPKeepAliveMessage())
			for range 20 { // keeps sending, so its own silence is not the cause
				time.Sleep(300 * time.Millisecond)
				p.write(gobgp.NewBGPKeepAliveMessage())
			}
		},
		want: want{Side: SimSideLocal, Cause: SimWriteFailed, Established: true},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			here, there := net.Pipe()
			defer there.Close()
			s := NewSimSession(here, SimConfig{ASN: api.DefaultASNumber, RouterID: netip.MustParseAddr("198.18.4.2"), HoldTime: 3 * time.Second})
			go tt.peer(fakePeer{t: t, conn: there})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := s.Run(ctx)
			var d *SimDrop
			if !errors.As(err, &d) {
				t.Fatalf("Run = %v, want a *SimDrop", err)
			}
			got := want{Side: d.Side, Cause: d.Cause, Code: d.Code, Subcode: d.Subcode, Established: d.Established > 0}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("drop %v (-want +got):\n%s", d, diff)
			}
		})
	}
}

// TestSimSessionEndsWithItsContext: a session its context ends is no
// drop.
func TestSimSessionEndsWithItsContext(t *testing.T) {
	here, there := net.Pipe()
	defer there.Close()
	p := fakePeer{t: t, conn: there}
	p.drain()
	s := NewSimSession(here, SimConfig{ASN: api.DefaultASNumber, RouterID: netip.MustParseAddr("198.18.4.2")})
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- s.Run(ctx) }()
	p.write(p.open(90), gobgp.NewBGPKeepAliveMessage(), gobgp.NewBGPKeepAliveMessage())
	<-s.Established()
	cancel()
	if err := <-runErr; !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v, want context.Canceled", err)
	}
	if s.EstablishedAt().IsZero() {
		t.Error("EstablishedAt is zero after establishing")
	}
}

// TestSimDropFromRealSpeaker: a real speaker that deletes the simulated
// node's peer ends the session (GoBGP v4.9.0, as v4.8.0, closes the connection
// without a NOTIFICATION), and the drop says the peer did.
func TestSimDropFromRealSpeaker(t *testing.T) {
	ctx := context.Background()
	n, _, runErr := simSessionUp(ctx, t, netip.MustParseAddr("127.77.91.1"), netip.MustParseAddr("127.77.91.2"), Peer{Type: PeerMesh})
	if err := n.sp.SetPeers(ctx, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-runErr:
		var d *SimDrop
		if !errors.As(err, &d) || d.Side != SimSidePeer || (d.Cause != SimPeerClosed && d.Code != 6) || d.Established == 0 {
			t.Errorf("Run = %v, want a drop by the peer (closed, or a cease) after establishing", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("session still up 60s after its peer was deleted")
	}
}

// simSessionUp starts a real speaker at rr (a reflector with a cluster
// ID) with one peer at simAddr (peer's type and client flag; the rest
// filled in) and a SimSession from simAddr to it, and waits until the
// session is established. The session runs until ctx ends; its Run's
// result arrives on runErr.
func simSessionUp(ctx context.Context, t *testing.T, rr, simAddr netip.Addr, peer Peer) (n *testNode, s *SimSession, runErr chan error) {
	t.Helper()
	port := freePort(t, []netip.Addr{rr, simAddr})
	n = startNode(t, "rr", Config{RouterID: rr, ASN: api.DefaultASNumber, ListenAddr: rr, ListenPort: int32(port),
		ClusterID: "244.0.0.1", GracefulRestart: true})
	peer.Address, peer.ASN, peer.ClusterNode, peer.Port, peer.LocalAddress = simAddr, api.DefaultASNumber, true, port, rr
	if err := n.sp.SetPeers(ctx, []Peer{peer}); err != nil {
		t.Fatal(err)
	}
	s, runErr = establishSim(ctx, t, simAddr, netip.AddrPortFrom(rr, port))
	return n, s, runErr
}
