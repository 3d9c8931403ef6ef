package e2e

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
)

// TestHostilePodCannotSpeakForItsNode replays issue 26's attack in a
// dual-stack 2-node lab: node1's agent is stopped (a rolling update, a
// crash), and its pod sends a real BGP OPEN as node1 (AS 64512, router ID
// node1's address) to node2's port 179.
//
//  1. With Tabby's defaults the SYN is dropped on node1 (the node guard), in
//     both families, to node2 and to node1 itself; the same pod reaches an
//     ordinary port of node2 with its own address (no masquerade to a
//     cluster node).
//  2. With node1's guard removed (nftables: Tabby's whole table; iptables:
//     the guard's jump), the pod's connection to node2's
//     port 179 from its own address is taken (the control). With a
//     Calico-style natOutgoing masquerade put in by hand (what the issue
//     found), the pod's
//     connection to node2's ordinary port arrives from node1's address: it
//     speaks as node1. Its OPEN to node2's port 179 still gets no answer:
//     the mesh is authenticated, and node2's kernel drops the unsigned SYN.
//
// Throughout, node2 never has the session to node1 Established; once
// node1's agent is back, it is. Once per firewall backend.
func TestHostilePodCannotSpeakForItsNode(t *testing.T) {
	for _, b := range []struct{ backend, lab string }{{"nftables", "ngatk"}, {"iptables", "ngatki"}} {
		t.Run(b.backend, func(t *testing.T) { testHostilePod(t, b.backend, b.lab) })
	}
}

func testHostilePod(t *testing.T, backend, name string) {
	l := upLab(t, lab.Options{Name: name, Nodes: 2, PodsPerNode: 1, DualStack: true, AgentArgs: []string{"--firewall-backend", backend}})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	st := l.State()
	n1, n2 := st.Nodes[0], st.Nodes[1]
	pod := "n1p1"
	podNS := netnsPath(t, l, pod)
	var podIPs []netip.Addr
	for _, p := range st.Pods {
		if p.Name == pod {
			for _, ip := range p.IPs {
				podIPs = append(podIPs, ip.Addr())
			}
		}
	}
	if len(podIPs) != 2 {
		t.Fatalf("pod %s has addresses %v, want one of each family", pod, podIPs)
	}
	// An ordinary TCP service on node2, answering with the source address
	// it sees.
	for _, a := range []netip.Addr{n2.IP.Addr(), n2.IP6.Addr()} {
		serveWhoAmIIn(t, netnsPath(t, l, n2.Name), netip.AddrPortFrom(a, 1790))
	}

	requireMeshAuthenticated(ctx, t, l)
	if err := l.StopAgent(ctx, n1.Name, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := waitPeerDown(ctx, l, []string{n1.Name, n2.Name}, n1.Name, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	watch := watchSessionTo(ctx, l, n2.Name, n1.IP.Addr())

	open := bgpOpen(64512, n1.IP.Addr())
	// 1. Defaults.
	for _, dst := range []netip.Addr{n2.IP.Addr(), n2.IP6.Addr(), n1.IP.Addr(), n1.IP6.Addr()} {
		r := sendOpenFrom(t, podNS, netip.AddrPortFrom(dst, 179), open)
		t.Logf("guarded: %s -> %s:179: %s", pod, dst, r)
		if r.connected {
			t.Errorf("guarded: the pod's TCP connection to %s:179 was accepted (%s), want its SYN dropped", dst, r)
		}
	}
	for i, dst := range []netip.Addr{n2.IP.Addr(), n2.IP6.Addr()} {
		got := whoAmIFrom(t, podNS, netip.AddrPortFrom(dst, 1790))
		t.Logf("guarded: %s -> %s:1790 seen from %q", pod, dst, got)
		if got != podIPs[i].String() {
			t.Errorf("guarded: node2 saw the pod's connection to %s:1790 from %q, want the pod's own %s", dst, got, podIPs[i])
		}
	}

	// 2. No Tabby rules on node1, and natOutgoing masquerading everything
	// that leaves for outside the pool, node addresses included.
	nft := func(args ...string) {
		t.Helper()
		if out, err := l.Exec(ctx, n1.Name, append([]string{"nft"}, args...)...); err != nil {
			t.Fatalf("nft %s on %s: %v\n%s", strings.Join(args, " "), n1.Name, err, out)
		}
	}
	removeGuard(ctx, t, l, n1.Name, backend)
	// The control: from the pod's own address, which node2 has no key for,
	// node2's port 179 takes the TCP connection (GoBGP then drops a
	// stranger): what refuses node1's address below is its key.
	if r := sendOpenFrom(t, podNS, netip.AddrPortFrom(n2.IP.Addr(), 179), open); !r.connected {
		t.Errorf("unguarded, not masqueraded: the pod's connection to node2:179 failed (%s); the MD5 check below would prove nothing", r)
	} else {
		t.Logf("unguarded, from the pod's own address: %s:179: %s", n2.IP.Addr(), r)
	}
	nft("add", "table", "ip", "ngatk-hostile")
	nft("add", "chain", "ip", "ngatk-hostile", "post", "{ type nat hook postrouting priority srcnat; }")
	nft("add", "rule", "ip", "ngatk-hostile", "post", "ip", "saddr", lab.PodPool, "ip", "daddr", "!=", lab.PodPool, "masquerade")
	if got := whoAmIFrom(t, podNS, netip.AddrPortFrom(n2.IP.Addr(), 1790)); got != n1.IP.Addr().String() {
		t.Fatalf("masqueraded by hand: node2 saw the pod from %q, want node1's %s (the attack's precondition)", got, n1.IP.Addr())
	} else {
		t.Logf("unguarded: %s -> %s:1790 seen from %s: the pod speaks as node1", pod, n2.IP.Addr(), got)
	}
	r := sendOpenFrom(t, podNS, netip.AddrPortFrom(n2.IP.Addr(), 179), open)
	t.Logf("unguarded, mesh authenticated: OPEN as node1 to %s:179: %s", n2.IP.Addr(), r)
	if r.connected {
		t.Errorf("an unsigned connection from node1's address to node2's BGP port was accepted (%s), want it refused by TCP-MD5", r)
	}
	nft("delete", "table", "ip", "ngatk-hostile")

	if est := watch.stop(); len(est) > 0 {
		t.Errorf("node2 had its session to node1 Established while node1's agent was down: %v", est)
	}
	if err := l.StartAgent(ctx, n1.Name); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 90*time.Second)
	defer wcancel()
	if err := l.WaitEstablished(wctx); err != nil {
		t.Fatalf("node1's own agent back: %v", err)
	}
	pingMatrix(t, l)
}

// bgpOpen is a BGP OPEN message (RFC 4271 4.2) of a 2-byte AS, hold time
// 90 s and no optional parameters.
func bgpOpen(asn uint16, routerID netip.Addr) []byte {
	m := make([]byte, 29)
	for i := range 16 {
		m[i] = 0xff
	}
	binary.BigEndian.PutUint16(m[16:], 29)
	m[18] = 1 // OPEN
	m[19] = 4 // version
	binary.BigEndian.PutUint16(m[20:], asn)
	binary.BigEndian.PutUint16(m[22:], 90)
	id := routerID.As4()
	copy(m[24:28], id[:])
	return m
}

// openResult is what became of one OPEN.
type openResult struct {
	connected bool
	answer    string // the message type that came back, or how the connection ended
	err       error
}

func (r openResult) String() string {
	if !r.connected {
		return fmt.Sprintf("no TCP connection (%v)", r.err)
	}
	return "connected, " + r.answer
}

// sendOpenFrom connects from the namespace at nsPath to dst and sends open.
func sendOpenFrom(t *testing.T, nsPath string, dst netip.AddrPort, open []byte) openResult {
	t.Helper()
	var r openResult
	if err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", dst.String(), 3*time.Second)
		if err != nil {
			r.err = err
			return nil
		}
		defer c.Close()
		r.connected = true
		if _, err := c.Write(open); err != nil {
			r.answer = "write failed: " + err.Error()
			return nil
		}
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		hdr := make([]byte, 19)
		if _, err := io.ReadFull(c, hdr); err != nil {
			r.answer = "no BGP answer: " + err.Error()
			return nil
		}
		r.answer = fmt.Sprintf("BGP message type %d answered", hdr[18])
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return r
}

// serveWhoAmIIn answers every connection to addr in the namespace at
// nsPath with the source address it came from, until the test ends.
func serveWhoAmIIn(t *testing.T, nsPath string, addr netip.AddrPort) {
	t.Helper()
	var l net.Listener
	if err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", addr.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			ap, _ := netip.ParseAddrPort(c.RemoteAddr().String())
			_, _ = c.Write([]byte(ap.Addr().Unmap().String() + "\n"))
			_ = c.Close()
		}
	}()
}

// whoAmIFrom connects from the namespace at nsPath to a serveWhoAmIIn
// server and returns the address it saw, "" when the connection failed.
func whoAmIFrom(t *testing.T, nsPath string, dst netip.AddrPort) string {
	t.Helper()
	got := ""
	if err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", dst.String(), 3*time.Second)
		if err != nil {
			return nil
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		b, _ := io.ReadAll(c)
		got = strings.TrimSpace(string(b))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// sessionWatch records every time node's session to peer was seen
// Established.
type sessionWatch struct {
	done   chan struct{}
	result chan []string
}

func watchSessionTo(ctx context.Context, l *lab.Lab, node string, peer netip.Addr) *sessionWatch {
	w := &sessionWatch{done: make(chan struct{}), result: make(chan []string, 1)}
	go func() {
		var seen []string
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			if s, err := l.NodeStatus(ctx, node); err == nil {
				for _, p := range s.Peers {
					if p.Address == peer.String() && p.State == "Established" {
						seen = append(seen, time.Now().Format(time.StampMilli))
					}
				}
			}
			select {
			case <-w.done:
				w.result <- seen
				return
			case <-ctx.Done():
				w.result <- seen
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

func (w *sessionWatch) stop() []string {
	close(w.done)
	return <-w.result
}

// requireMeshAuthenticated fails the test unless the cluster has its mesh
// key and every node's established BGP connections carry a TCP-MD5 key
// (ss -e shows a socket's md5keys).
func requireMeshAuthenticated(ctx context.Context, t *testing.T, l *lab.Lab) {
	t.Helper()
	if _, err := l.Store().GetKV(ctx, datastore.BGPMeshKeyKey); err != nil {
		t.Fatalf("the cluster's mesh key: %v", err)
	}
	for _, n := range l.State().Nodes {
		out, err := l.Exec(ctx, n.Name, "ss", "-tniHe", "state", "established", "( sport = :179 or dport = :179 )")
		if err != nil {
			t.Fatalf("ss on %s: %v\n%s", n.Name, err, out)
		}
		// Each socket is two lines: addresses, then its info (which ends
		// with the key: not logged).
		conns := strings.Count(string(out), ":179 ")
		keyed := strings.Count(string(out), "md5keys:")
		t.Logf("%s: %d established BGP connections, %d with a TCP-MD5 key", n.Name, conns, keyed)
		if conns == 0 || keyed != conns {
			t.Errorf("%s: %d established BGP connections, %d with a TCP-MD5 key; want all keyed", n.Name, conns, keyed)
		}
	}
}

// TestMeshKeyRotationInLab rotates the cluster's mesh key (what `tabbyctl
// bgp rotate-mesh-key` does) in a 3-node lab while every node's pod pings
// the next node's pod every 50 ms: every agent's view sees the new key,
// every BGP connection carries it (and none the old one) within 30 s, and
// no ping is lost while each session is re-created: the agents hold their
// learned routes until BGP converged again (docs/bgp.md, "Rotation").
func TestMeshKeyRotationInLab(t *testing.T) {
	l := upLab(t, lab.Options{Name: "ngrot", Nodes: 3, PodsPerNode: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	old, err := l.Store().GetKV(ctx, datastore.BGPMeshKeyKey)
	if err != nil {
		t.Fatal(err)
	}
	oldKey, err := datastore.DecodeBGPMeshKey(old.Value)
	if err != nil {
		t.Fatal(err)
	}
	requireMeshAuthenticated(ctx, t, l)
	nodes := l.State().Nodes
	var pingers []*seqPinger
	for i := range nodes {
		pingers = append(pingers, startSeqPinger(t, l, fmt.Sprintf("n%dp1", i+1), fmt.Sprintf("n%dp1", (i+1)%len(nodes)+1)))
	}
	time.Sleep(time.Second)
	newKey, err := l.Store().SetBGPMeshKey(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	keyed := func() error {
		for _, n := range nodes {
			out, err := l.Exec(ctx, n.Name, "ss", "-tniHe", "state", "established", "( sport = :179 or dport = :179 )")
			if err != nil {
				return fmt.Errorf("ss on %s: %v", n.Name, err)
			}
			s := string(out)
			conns, withNew := strings.Count(s, ":179 "), strings.Count(s, newKey.Key)
			if conns != len(nodes)-1 || withNew != conns || strings.Contains(s, oldKey.Key) {
				return fmt.Errorf("%s: %d established BGP connections, %d with the new key, old key present: %v", n.Name, conns, withNew, strings.Contains(s, oldKey.Key))
			}
		}
		return nil
	}
	took := testkit.Eventually(t, 30*time.Second, "every BGP connection on the new key", keyed)
	t.Logf("rotation: every session carries the new key %v after it was stored", took.Round(10*time.Millisecond))
	wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
	defer wcancel()
	if err := l.WaitRoutes(wctx); err != nil {
		t.Error(err)
	}
	time.Sleep(2 * time.Second)
	for _, p := range pingers {
		sent, lost := p.stop()
		t.Logf("%s -> %s during the rotation: %d pings sent, %d lost", p.from, p.to, sent, len(lost))
		if sent < 50 {
			t.Errorf("%s -> %s: only %d pings sent", p.from, p.to, sent)
		}
		if len(lost) > 0 {
			t.Errorf("%s -> %s: %d of %d pings lost during the rotation (icmp_seq %v), want 0: the learned routes are held", p.from, p.to, len(lost), sent, lost)
		}
	}
}

// removeGuard takes the node guard out of node's firewall behind its
// stopped agent's back: with nftables Tabby's whole table, with iptables
// the guard's jump, the first rule of tabby-FORWARD, in whichever iptables
// the agent used.
func removeGuard(ctx context.Context, t *testing.T, l *lab.Lab, node, backend string) {
	t.Helper()
	if backend == "nftables" {
		if out, err := l.Exec(ctx, node, "nft", "delete", "table", "inet", "tabby"); err != nil {
			t.Fatalf("deleting Tabby's nftables table on %s: %v\n%s", node, err, out)
		}
		return
	}
	for _, bin := range []string{"iptables-nft", "iptables-legacy"} {
		out, err := l.Exec(ctx, node, bin, "-S", "tabby-FORWARD")
		if err != nil || !strings.Contains(string(out), "-j tabby-node-guard") {
			continue
		}
		first := strings.Split(strings.TrimSpace(string(out)), "\n")[1] // after "-N tabby-FORWARD"
		if !strings.Contains(first, "-j tabby-node-guard") {
			t.Fatalf("the first rule of tabby-FORWARD on %s is %q, not the guard's jump", node, first)
		}
		if out, err := l.Exec(ctx, node, bin, "-D", "tabby-FORWARD", "1"); err != nil {
			t.Fatalf("deleting the guard's jump on %s: %v\n%s", node, err, out)
		}
		return
	}
	t.Fatalf("no iptables tabby-FORWARD with the guard's jump on %s", node)
}
