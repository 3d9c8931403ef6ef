package bgp

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp/session"
)

// Real GoBGP speakers in one process, each on its own loopback address
// (127.77.<net>.<n>), all on one free port.
//
// Tests that run GoBGP speakers do not call t.Parallel: GoBGP's StartBgp
// writes package-level variables that running servers read (see servers in
// speaker.go), which -race reports when another test's speakers are busy.

// routeWatcher drains a speaker's Routes channel and keeps the latest set.
type routeWatcher struct {
	mu      sync.Mutex
	latest  []LearnedRoute
	history [][]LearnedRoute // every set received, oldest first
	changed chan struct{}    // closed and replaced on every new set
	done    chan struct{}
}

func watchRoutes(ch <-chan []LearnedRoute) *routeWatcher {
	w := &routeWatcher{changed: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for r := range ch {
			w.mu.Lock()
			w.latest = r
			w.history = append(w.history, r)
			close(w.changed)
			w.changed = make(chan struct{})
			w.mu.Unlock()
		}
	}()
	return w
}

// since returns the sets received after the first n.
func (w *routeWatcher) since(n int) [][]LearnedRoute {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.history[min(n, len(w.history)):])
}

func (w *routeWatcher) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.history)
}

func (w *routeWatcher) get() ([]LearnedRoute, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.latest, w.changed
}

// waitFor blocks until cond holds for the latest route set or the deadline
// passes; it returns the last set seen and whether cond held.
func (w *routeWatcher) waitFor(deadline time.Time, cond func([]LearnedRoute) bool) ([]LearnedRoute, bool) {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		r, changed := w.get()
		if cond(r) {
			return r, true
		}
		select {
		case <-changed:
		case <-timer.C:
			r, _ = w.get()
			return r, cond(r)
		}
	}
}

type testNode struct {
	name  string
	addr  netip.Addr
	sp    *speaker
	watch *routeWatcher
}

type cluster struct {
	port  uint16
	nodes []*testNode
	api   []*api.Node
}

// testLogger logs to stderr when BGP_TEST_LOG is set; BGP_TEST_LOG=debug
// includes GoBGP's debug messages.
func testLogger(tb testing.TB) *slog.Logger {
	switch os.Getenv("BGP_TEST_LOG") {
	case "":
		return nil
	case "debug":
		gobgpLogLevel = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", tb.Name())
}

// freePort finds a port that every address can listen on.
func freePort(tb testing.TB, addrs []netip.Addr) uint16 {
	tb.Helper()
	for range 100 {
		port := uint16(20000 + rand.IntN(40000))
		ok := true
		var ls []net.Listener
		for _, a := range addrs {
			l, err := net.Listen("tcp", netip.AddrPortFrom(a, port).String())
			if err != nil {
				ok = false
				break
			}
			ls = append(ls, l)
		}
		for _, l := range ls {
			_ = l.Close()
		}
		if ok {
			return port
		}
	}
	tb.Fatal("no free port on the test loopback addresses")
	return 0
}

// newCluster starts n speakers on 127.77.<net>.1..n. mutate may adjust each
// node resource (labels, reflector cluster IDs) before the speakers start.
func newCluster(tb testing.TB, net byte, n int, mutate func(i int, node *api.Node)) *cluster {
	tb.Helper()
	c := &cluster{}
	var addrs []netip.Addr
	for i := range n {
		addrs = append(addrs, netip.AddrFrom4([4]byte{127, 77, net, byte(i + 1)}))
	}
	c.port = freePort(tb, addrs)
	for i, a := range addrs {
		name := fmt.Sprintf("node%02d", i)
		apiNode := node(name, a.String()+"/32")
		if mutate != nil {
			mutate(i, apiNode)
		}
		c.api = append(c.api, apiNode)
		cfg := Config{
			RouterID: a, ASN: api.DefaultASNumber, ListenAddr: a, ListenPort: int32(c.port),
			ClusterID: apiNode.Spec.BGP.RouteReflectorClusterID, GracefulRestart: true, RestartTime: 30 * time.Second,
		}
		c.nodes = append(c.nodes, startNode(tb, name, cfg))
	}
	return c
}

// testPool is the IP pool of every test speaker (SetPolicy).
var testPool = netip.MustParsePrefix("10.244.0.0/16")

// startNode starts a speaker and stops it when the test ends.
func startNode(tb testing.TB, name string, cfg Config) *testNode {
	tb.Helper()
	log := testLogger(tb)
	if log != nil {
		log = log.With("node", cfg.RouterID.String())
	}
	sp := NewSpeaker(log).(*speaker)
	if err := sp.Start(context.Background(), cfg); err != nil {
		tb.Fatalf("starting %s: %v", name, err)
	}
	if err := sp.SetPolicy(context.Background(), Policy{Pools: []netip.Prefix{testPool}}); err != nil {
		tb.Fatalf("SetPolicy on %s: %v", name, err)
	}
	tn := &testNode{name: name, addr: cfg.RouterID, sp: sp, watch: watchRoutes(sp.Routes())}
	q := quiescerOf(tb)
	q.add(tn)
	tb.Cleanup(func() {
		q.quiesce(tb)
		if err := sp.Stop(false); err != nil {
			tb.Errorf("stopping %s: %v", name, err)
		}
		<-tn.watch.done
	})
	return tn
}

// configure gives every node the peers DesiredPeers computes for it.
func (c *cluster) configure(tb testing.TB, cfg *api.BGPConfiguration, peers []*api.BGPPeer) {
	tb.Helper()
	port := c.port
	if cfg == nil {
		cfg = &api.BGPConfiguration{}
	}
	cfg.Spec.ListenPort = &port
	for _, n := range c.nodes {
		if err := n.sp.SetPeers(context.Background(), DesiredPeers(n.name, c.api, cfg, peers, nil)); err != nil {
			tb.Fatalf("SetPeers on %s: %v", n.name, err)
		}
	}
}

// blockOf is node i's test block, 10.244.i.0/26.
func blockOf(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 26)
}

func (c *cluster) advertiseBlocks(tb testing.TB) {
	tb.Helper()
	for i, n := range c.nodes {
		if err := n.sp.SetAdvertisements(context.Background(), AdvertisementsOf([]netip.Prefix{blockOf(i)})); err != nil {
			tb.Fatalf("SetAdvertisements on %s: %v", n.name, err)
		}
	}
}

// waitAllBlocks waits until every node routes every other node's block via
// its owner, and nothing else; it fails the test at the deadline.
func (c *cluster) waitAllBlocks(tb testing.TB, deadline time.Time) {
	tb.Helper()
	for i, n := range c.nodes {
		got, ok := n.watch.waitFor(deadline, func(rs []LearnedRoute) bool {
			if len(rs) != len(c.nodes)-1 {
				return false
			}
			for j, o := range c.nodes {
				if j != i && !hasRoute(rs, blockOf(j), o.addr) {
					return false
				}
			}
			return true
		})
		if !ok {
			tb.Fatalf("%s did not learn the other %d blocks; has:%s%s", n.name, len(c.nodes)-1, routesString(got), peersString(n))
		}
	}
}

// routesString renders a route set like `ip route` would, for messages.
func routesString(rs []LearnedRoute) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "\n  %v via %v", r.Prefix, r.NextHops)
	}
	if b.Len() == 0 {
		return " (none)"
	}
	return b.String()
}

// hasRoute reports whether rs routes prefix via exactly hops.
func hasRoute(rs []LearnedRoute, prefix netip.Prefix, hops ...netip.Addr) bool {
	for _, r := range rs {
		if r.Prefix == prefix {
			return slices.Equal(r.NextHops, hops)
		}
	}
	return false
}

func lacksRoute(rs []LearnedRoute, prefix netip.Prefix) bool {
	return !slices.ContainsFunc(rs, func(r LearnedRoute) bool { return r.Prefix == prefix })
}

// waitEstablished waits until node n has exactly want peers, all Established.
func waitEstablished(tb testing.TB, n *testNode, want int, deadline time.Time) []PeerStatus {
	tb.Helper()
	var last []PeerStatus
	for {
		st, err := n.sp.Peers(context.Background())
		if err != nil {
			tb.Fatalf("Peers on %s: %v", n.name, err)
		}
		last = st
		ok := len(st) == want
		for _, p := range st {
			ok = ok && p.State == session.Established
		}
		if ok {
			return st
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: peers not all established by the deadline: %+v", n.name, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// peersString renders a node's peer statuses for failure messages.
func peersString(n *testNode) string {
	st, err := n.sp.Peers(context.Background())
	if err != nil {
		return " peers: " + err.Error()
	}
	var b strings.Builder
	for _, p := range st {
		fmt.Fprintf(&b, "\n  peer %v %s %s since %s info %q", p.Address, p.Type, p.State, p.Since.Format(time.StampMilli), p.Info)
	}
	return b.String()
}

// skipStaleRaceUnderDetector skips a test that takes a graceful-restart
// session down when the race detector is on: GoBGP (v4.9.0 as v4.8.0) writes a path's
// stale flag (MarkStale, on the session's goroutine) while its WatchEvent
// goroutine reads it to convert the path for our best-path watch — a race
// inside GoBGP that Tabby cannot lock out (fixed upstream in osrg/gobgp PR
// #3658, in neither release). make test runs these tests again without
// -race (scripts/test-tiers.sh), so they still run every time.
func skipStaleRaceUnderDetector(t *testing.T) {
	t.Helper()
	if raceDetector {
		t.Skip("skipped under -race: GoBGP v4.9.0 (as v4.8.0) races on a path's stale flag when a graceful-restart session goes down (osrg/gobgp PR #3658); runs without -race in make test")
	}
}

// quiescer empties a test's speakers before the first of them stops. GoBGP
// v4.8.0 and v4.9.0 race when one of a server's sessions goes down while it handles
// an UPDATE from another (server.go writes the first peer's config in
// handleFSMMessage while propagateUpdateToNeighbors reads it, unlocked): a
// test's speakers stopping one after another, each stop making the others
// withdraw its routes, trip it under -race. With every advertisement
// withdrawn and every RIB empty first, sessions go down with no UPDATE in
// flight.
type quiescer struct {
	mu    sync.Mutex
	nodes []*testNode
	done  bool
}

var quiescers sync.Map // testing.TB → *quiescer

func quiescerOf(tb testing.TB) *quiescer {
	q, loaded := quiescers.LoadOrStore(tb, &quiescer{})
	if !loaded {
		tb.Cleanup(func() { quiescers.Delete(tb) })
	}
	return q.(*quiescer)
}

func (q *quiescer) add(n *testNode) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.nodes = append(q.nodes, n)
}

// quiesce withdraws every node's advertisements and waits, bounded, until
// no node has learned routes left; only the first call does anything.
func (q *quiescer) quiesce(tb testing.TB) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.done {
		return
	}
	q.done = true
	for _, n := range q.nodes {
		_ = n.sp.SetAdvertisements(context.Background(), AdvertisementsOf(nil)) // a node the test stopped says so; nothing to withdraw
	}
	// Bounded: routes a graceful stop left stale stay for the restart
	// time, and that is the test's business.
	deadline := time.Now().Add(5 * time.Second)
	for _, n := range q.nodes {
		select {
		case <-n.watch.done: // stopped by the test
			continue
		default:
		}
		n.watch.waitFor(deadline, func(rs []LearnedRoute) bool { return len(rs) == 0 })
	}
}
