package bgp

import (
	"context"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"github.com/tabbynet/tabby/bgp/session"
)

// TestStuckSessionReset: a peer that answers OPEN and then never sends
// KEEPALIVE leaves GoBGP in OpenConfirm with no hold timer; the speaker
// re-creates the session after stuckTimeout.
func TestStuckSessionReset(t *testing.T) {
	local, remote := netip.MustParseAddr("127.77.10.1"), netip.MustParseAddr("127.77.10.2")
	l, err := net.Listen("tcp", netip.AddrPortFrom(remote, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	var accepted atomic.Int32
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go silentPeer(conn, remote)
		}
	}()

	sp := startNode(t, "stuck", Config{RouterID: local, ASN: 64512, ListenPort: -1, GracefulRestart: true})
	port := uint16(l.Addr().(*net.TCPAddr).Port)
	if err := sp.sp.SetPeers(context.Background(), []Peer{{Address: remote, ASN: 64512, Type: PeerGlobal, LocalAddress: local, Port: port}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(stuckTimeout + 15*time.Second)
	sawOpenConfirm := false
	for accepted.Load() < 2 || !sawOpenConfirm {
		st, err := sp.sp.Peers(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(st) == 1 && st[0].State == session.OpenConfirm {
			sawOpenConfirm = true
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d connections (saw OpenConfirm: %v) no re-created session: %+v", accepted.Load(), sawOpenConfirm, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// silentPeer sends an OPEN and then only reads.
func silentPeer(conn net.Conn, id netip.Addr) {
	defer conn.Close()
	open, err := gobgp.NewBGPOpenMessage(64512, 9, id, []gobgp.OptionParameterInterface{
		gobgp.NewOptionParameterCapability([]gobgp.ParameterCapabilityInterface{
			gobgp.NewCapMultiProtocol(gobgp.RF_IPv4_UC), gobgp.NewCapFourOctetASNumber(64512),
		}),
	})
	if err != nil {
		return
	}
	b, err := open.Serialize()
	if err != nil {
		return
	}
	if _, err := conn.Write(b); err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, conn)
}
