package bgp

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
	"unsafe"

	gobgpapi "github.com/osrg/gobgp/v4/api"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp/session"
)

// md5Supported reports whether the kernel accepts a TCP MD5 key on a
// loopback socket.
func md5Supported(t *testing.T, local, remote netip.Addr) error {
	l, err := net.Listen("tcp", netip.AddrPortFrom(local, 0).String())
	if err != nil {
		return err
	}
	defer l.Close()
	raw, err := l.(*net.TCPListener).SyscallConn()
	if err != nil {
		return err
	}
	sig := unix.TCPMD5Sig{Keylen: 4}
	copy(sig.Key[:], "test")
	*(*unix.RawSockaddrInet4)(unsafe.Pointer(&sig.Addr)) = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: remote.As4()}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptTCPMD5Sig(int(fd), unix.IPPROTO_TCP, unix.TCP_MD5SIG, &sig)
	}); err != nil {
		return err
	}
	return serr
}

// TestMD5: a session with matching TCP MD5 passwords establishes, one with
// different passwords does not, and no status ever shows a password.
func TestMD5(t *testing.T) {
	c := newCluster(t, 6, 4, nil)
	if err := md5Supported(t, c.nodes[0].addr, c.nodes[1].addr); err != nil {
		t.Skipf("kernel refuses TCP MD5 on loopback: %v", err)
	}
	peer := func(from, to *testNode, password string) []Peer {
		return []Peer{{Address: to.addr, ASN: api.DefaultASNumber, Type: PeerGlobal, Password: password, Port: c.port, LocalAddress: from.addr, ClusterNode: true}}
	}
	set := func(n *testNode, peers []Peer) {
		if err := n.sp.SetPeers(context.Background(), peers); err != nil {
			t.Fatalf("SetPeers on %s: %v", n.name, err)
		}
	}
	good1, good2, bad1, bad2 := c.nodes[0], c.nodes[1], c.nodes[2], c.nodes[3]
	set(good1, peer(good1, good2, "s3cret-pw"))
	set(good2, peer(good2, good1, "s3cret-pw"))
	set(bad1, peer(bad1, bad2, "right-pw"))
	set(bad2, peer(bad2, bad1, "wrong-pw"))

	st := waitEstablished(t, good1, 1, time.Now().Add(convergeTimeout))
	// The mismatched pair had the same time plus a few connect retries.
	window := time.Now().Add(3 * ConnectRetry / 2)
	for time.Now().Before(window) {
		for _, n := range []*testNode{bad1, bad2} {
			bs, err := n.sp.Peers(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(bs) != 1 || bs[0].State == session.Established || bs[0].State == session.OpenConfirm {
				t.Fatalf("%s with a mismatched MD5 password: %+v", n.name, bs)
			}
			st = append(st, bs...)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, s := range st {
		text := fmt.Sprintf("%+v", s)
		if strings.Contains(text, "-pw") {
			t.Errorf("peer status shows a password: %s", text)
		}
	}
}

// TestPeerChanges: SetPeers re-creates a session whose settings change,
// keeps an unchanged one, and deletes one no longer desired.
func TestPeerChanges(t *testing.T) {
	c := newCluster(t, 8, 3, nil)
	c.configure(t, nil, nil)
	c.advertiseBlocks(t)
	n0 := c.nodes[0]
	deadline := time.Now().Add(convergeTimeout)
	st := waitEstablished(t, n0, 2, deadline)
	up := map[netip.Addr]time.Time{}
	for _, p := range st {
		up[p.Address] = p.Since
	}

	cfg := &api.BGPConfiguration{}
	cfg.Spec.ListenPort = &c.port
	peers := DesiredPeers(n0.name, c.api, cfg, nil, nil)
	// Same peers again: nothing changes.
	if err := n0.sp.SetPeers(context.Background(), peers); err != nil {
		t.Fatal(err)
	}
	// Change node02's restart time (needs a new session), drop node01.
	peers = peers[1:]
	peers[0].RestartTime = 40 * time.Second
	if err := n0.sp.SetPeers(context.Background(), peers); err != nil {
		t.Fatal(err)
	}
	if got, ok := n0.watch.waitFor(deadline, func(rs []LearnedRoute) bool {
		return len(rs) == 1 && hasRoute(rs, blockOf(2), c.nodes[2].addr)
	}); !ok {
		t.Fatalf("after removing node01, node00 routes:%s", routesString(got))
	}
	st = waitEstablished(t, n0, 1, deadline)
	if st[0].Address != c.nodes[2].addr || !st[0].Since.After(up[c.nodes[2].addr]) {
		t.Errorf("session to node02 not re-created: before %v, now %+v", up[c.nodes[2].addr], st[0])
	}
}

// TestAPIListen: the gRPC API answers on loopback.
func TestAPIListen(t *testing.T) {
	addr := netip.MustParseAddr("127.77.7.1")
	port := freePort(t, []netip.Addr{addr})
	hostport := netip.AddrPortFrom(addr, port).String()
	sp := NewSpeaker(nil)
	if err := sp.Start(context.Background(), Config{RouterID: addr, ASN: 65010, ListenPort: -1, APIListen: hostport}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sp.Stop(false); err != nil {
			t.Error(err)
		}
	})
	conn, err := grpc.NewClient(hostport, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rsp, err := gobgpapi.NewGoBgpServiceClient(conn).GetBgp(ctx, &gobgpapi.GetBgpRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("GetBgp over the API: %v", err)
	}
	if rsp.Global.RouterId != addr.String() || rsp.Global.Asn != 65010 {
		t.Errorf("API reports %v, want router ID %v ASN 65010", rsp.Global, addr)
	}
}
