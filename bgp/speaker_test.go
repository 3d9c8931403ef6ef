package bgp

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp/session"
)

const convergeTimeout = 20 * time.Second

// TestMeshOfFive: every speaker learns every other's block with the owner as
// next hop, and a withdrawal reaches everyone.
func TestMeshOfFive(t *testing.T) {
	c := newCluster(t, 1, 5, nil)
	c.configure(t, nil, nil)
	c.advertiseBlocks(t)

	deadline := time.Now().Add(convergeTimeout)
	c.waitAllBlocks(t, deadline)

	st := waitEstablished(t, c.nodes[2], 4, deadline)
	for _, p := range st {
		if p.Type != PeerMesh || p.Since.IsZero() || p.Address == c.nodes[2].addr {
			t.Errorf("peer status %+v: want type mesh, a since time, not self", p)
		}
	}

	// Withdraw node 0's block.
	if err := c.nodes[0].sp.SetAdvertisements(context.Background(), AdvertisementsOf(nil)); err != nil {
		t.Fatalf("SetAdvertisements(nil): %v", err)
	}
	deadline = time.Now().Add(convergeTimeout)
	for _, n := range c.nodes[1:] {
		got, ok := n.watch.waitFor(deadline, func(rs []LearnedRoute) bool {
			return lacksRoute(rs, blockOf(0)) && len(rs) == len(c.nodes)-2
		})
		if !ok {
			t.Errorf("%s still routes the withdrawn block:%s", n.name, routesString(got))
		}
	}
}

// TestRouteReflectors: with the mesh off, six clients peer only with two
// reflectors and still learn every block.
func TestRouteReflectors(t *testing.T) {
	c := newCluster(t, 2, 8, func(i int, n *api.Node) {
		if i < 2 {
			n.Spec.BGP.RouteReflectorClusterID = "1.1.1.1"
			n.Metadata.Labels = map[string]string{"role": "rr"}
		}
	})
	c.configure(t, meshOff(), []*api.BGPPeer{
		bgpPeer("to-rr", api.BGPPeerSpec{NodeSelector: &api.LabelSelector{}, PeerSelector: sel("role", "rr")}),
		bgpPeer("rr-to-all", api.BGPPeerSpec{NodeSelector: sel("role", "rr"), PeerSelector: &api.LabelSelector{}}),
	})
	c.advertiseBlocks(t)

	deadline := time.Now().Add(convergeTimeout)
	c.waitAllBlocks(t, deadline)
	for _, n := range c.nodes[2:] {
		st, err := n.sp.Peers(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(st) != 2 || st[0].Address != c.nodes[0].addr || st[1].Address != c.nodes[1].addr {
			t.Errorf("client %s peers with %+v, want only the two reflectors", n.name, st)
		}
		for _, p := range st {
			if p.Type != PeerRR {
				t.Errorf("client %s: peer %v has type %q, want rr", n.name, p.Address, p.Type)
			}
		}
	}
	st := waitEstablished(t, c.nodes[0], 7, deadline)
	clients := 0
	for _, p := range st {
		if p.Type == PeerRRClient {
			clients++
		}
	}
	if clients != 6 {
		t.Errorf("reflector has %d rr-client peers, want 6: %+v", clients, st)
	}
}

// TestECMP: two speakers advertise the same prefix; the third routes it via
// both, and via the survivor once one withdraws.
func TestECMP(t *testing.T) {
	c := newCluster(t, 3, 3, nil)
	c.configure(t, nil, nil)
	anycast := netip.MustParsePrefix("10.244.99.0/26")
	for _, n := range c.nodes[:2] {
		if err := n.sp.SetAdvertisements(context.Background(), AdvertisementsOf([]netip.Prefix{anycast})); err != nil {
			t.Fatal(err)
		}
	}
	a, b, obs := c.nodes[0], c.nodes[1], c.nodes[2]
	deadline := time.Now().Add(convergeTimeout)
	if got, ok := obs.watch.waitFor(deadline, func(rs []LearnedRoute) bool {
		return len(rs) == 1 && hasRoute(rs, anycast, a.addr, b.addr)
	}); !ok {
		t.Fatalf("observer routes:%s\nwant %v via both %v and %v", routesString(got), anycast, a.addr, b.addr)
	}
	// The originators route their own prefix locally, not via each other.
	waitEstablished(t, a, 2, deadline)
	if rs, err := a.sp.learnedRoutes(); err != nil || len(rs) != 0 {
		t.Errorf("originator learned routes %s (err %v), want none", routesString(rs), err)
	}

	if err := a.sp.SetAdvertisements(context.Background(), AdvertisementsOf(nil)); err != nil {
		t.Fatal(err)
	}
	if got, ok := obs.watch.waitFor(time.Now().Add(convergeTimeout), func(rs []LearnedRoute) bool {
		return len(rs) == 1 && hasRoute(rs, anycast, b.addr)
	}); !ok {
		t.Fatalf("after withdrawal observer routes:%s\nwant %v via %v only", routesString(got), anycast, b.addr)
	}
	if got, ok := a.watch.waitFor(time.Now().Add(convergeTimeout), func(rs []LearnedRoute) bool {
		return len(rs) == 1 && hasRoute(rs, anycast, b.addr)
	}); !ok {
		t.Fatalf("after withdrawal former originator routes:%s\nwant %v via %v", routesString(got), anycast, b.addr)
	}
}

// TestStop: a graceful stop leaves the route at the peer (stale, graceful
// restart); a hard stop withdraws it.
func TestStop(t *testing.T) {
	for _, tc := range []struct {
		name     string
		net      byte
		graceful bool
	}{{"graceful", 4, true}, {"hard", 5, false}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.graceful {
				skipStaleRaceUnderDetector(t)
			}
			c := newCluster(t, tc.net, 2, nil)
			c.configure(t, nil, nil)
			c.advertiseBlocks(t)
			leaver, stayer := c.nodes[0], c.nodes[1]
			deadline := time.Now().Add(convergeTimeout)
			if got, ok := stayer.watch.waitFor(deadline, func(rs []LearnedRoute) bool {
				return hasRoute(rs, blockOf(0), leaver.addr)
			}); !ok {
				t.Fatalf("route not learned before stop:%s", routesString(got))
			}
			if err := leaver.sp.Stop(tc.graceful); err != nil {
				t.Fatalf("Stop(%v): %v", tc.graceful, err)
			}
			// Wait until the stayer has noticed the session is gone.
			for {
				st, err := stayer.sp.Peers(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if len(st) == 1 && st[0].State != session.Established {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("session still up after peer stopped: %+v", st)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if tc.graceful {
				rs, err := stayer.sp.learnedRoutes()
				if err != nil {
					t.Fatal(err)
				}
				if !hasRoute(rs, blockOf(0), leaver.addr) {
					t.Errorf("after graceful stop the peer dropped the route; has:%s", routesString(rs))
				}
				return
			}
			if got, ok := stayer.watch.waitFor(time.Now().Add(convergeTimeout), func(rs []LearnedRoute) bool {
				return lacksRoute(rs, blockOf(0))
			}); !ok {
				t.Errorf("after hard stop the peer kept the route:%s", routesString(got))
			}
		})
	}
}

func TestSpeakerConfigErrors(t *testing.T) {
	good := Config{RouterID: netip.MustParseAddr("127.77.9.1"), ASN: 64512, ListenPort: -1}
	tests := []struct {
		name string
		mod  func(*Config)
	}{
		{"non-loopback API", func(c *Config) { c.APIListen = "0.0.0.0:50051" }},
		{"API without port", func(c *Config) { c.APIListen = "127.0.0.1" }},
		{"no router ID", func(c *Config) { c.RouterID = netip.Addr{} }},
		{"zero ASN", func(c *Config) { c.ASN = 0 }},
		{"bad cluster ID", func(c *Config) { c.ClusterID = "rr-1" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good
			tt.mod(&cfg)
			sp := NewSpeaker(nil)
			if err := sp.Start(context.Background(), cfg); err == nil {
				_ = sp.Stop(false)
				t.Fatalf("Start accepted %+v", cfg)
			}
			if err := sp.Stop(false); err != nil {
				t.Errorf("Stop after failed Start: %v", err)
			}
		})
	}

	sp := NewSpeaker(nil)
	if err := sp.SetPeers(context.Background(), nil); err == nil {
		t.Error("SetPeers before Start succeeded")
	}
	if err := sp.Start(context.Background(), good); err != nil {
		t.Fatalf("Start without listening: %v", err)
	}
	if err := sp.Start(context.Background(), good); err == nil {
		t.Error("second Start succeeded")
	}
	for _, p := range []Peer{
		{Address: netip.MustParseAddr("127.77.9.2")},
		{Address: good.RouterID, ASN: 64512},
		{Address: netip.MustParseAddr("::1"), ASN: 64512},
	} {
		if err := sp.SetPeers(context.Background(), []Peer{p}); err == nil {
			t.Errorf("SetPeers accepted %+v", p)
		}
	}
	if err := sp.SetAdvertisements(context.Background(), AdvertisementsOf([]netip.Prefix{netip.MustParsePrefix("fd00::/64")})); err == nil {
		t.Error("SetAdvertisements accepted an IPv6 prefix")
	}
	if st, err := sp.Peers(context.Background()); err != nil || len(st) != 0 {
		t.Errorf("Peers after rejected SetPeers = %+v, %v; want none", st, err)
	}
	if err := sp.Stop(true); err != nil {
		t.Errorf("Stop: %v", err)
	}
	// Stop closes Routes before it returns; a route set published before
	// Stop may still be buffered ahead of the close (the channel holds
	// one).
	for i := 0; ; i++ {
		select {
		case _, open := <-sp.Routes():
			if !open {
				return
			}
			if i > 0 {
				t.Fatal("Routes held more than the one buffered set after Stop")
			}
		default:
			t.Fatal("Routes channel open after Stop")
		}
	}
}

// waitSessionDown waits until n's only peer is no longer Established.
func waitSessionDown(t *testing.T, n *testNode, deadline time.Time) {
	t.Helper()
	for {
		st, err := n.sp.Peers(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(st) == 1 && st[0].State != session.Established {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: session still up: %+v", n.name, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestGracefulRestart: a speaker stops gracefully and comes back with
// LocalRestarting; its peer routes its block throughout. Stopped for good,
// the block goes once the announced restart time has passed.
func TestGracefulRestart(t *testing.T) {
	skipStaleRaceUnderDetector(t)
	c := newCluster(t, 9, 2, nil)
	c.configure(t, nil, nil)
	c.advertiseBlocks(t)
	n0, n1 := c.nodes[0], c.nodes[1]
	deadline := time.Now().Add(convergeTimeout)
	if got, ok := n1.watch.waitFor(deadline, func(rs []LearnedRoute) bool { return hasRoute(rs, blockOf(0), n0.addr) }); !ok {
		t.Fatalf("block not learned:%s", routesString(got))
	}
	mark := n1.watch.count()
	if err := n0.sp.Stop(true); err != nil {
		t.Fatal(err)
	}
	waitSessionDown(t, n1, deadline)

	cfg := n0.sp.cfg
	cfg.LocalRestarting = true
	cfg.RestartTime = 3 * time.Second
	again := startNode(t, n0.name+"-again", cfg)
	cfg0 := &api.BGPConfiguration{}
	cfg0.Spec.ListenPort = &c.port
	if err := again.sp.SetPeers(context.Background(), DesiredPeers(n0.name, c.api, cfg0, nil, nil)); err != nil {
		t.Fatal(err)
	}
	if err := again.sp.SetAdvertisements(context.Background(), AdvertisementsOf([]netip.Prefix{blockOf(0)})); err != nil {
		t.Fatal(err)
	}
	if got, ok := again.watch.waitFor(deadline, func(rs []LearnedRoute) bool { return hasRoute(rs, blockOf(1), n1.addr) }); !ok {
		t.Fatalf("restarted speaker routes:%s%s", routesString(got), peersString(again))
	}
	waitEstablished(t, n1, 1, deadline)
	for _, rs := range n1.watch.since(mark) {
		if !hasRoute(rs, blockOf(0), n0.addr) {
			t.Errorf("during the restart the peer published a set without the block:%s", routesString(rs))
		}
	}

	// Gone for good: the stale route lasts the announced restart time.
	if err := again.sp.Stop(true); err != nil {
		t.Fatal(err)
	}
	waitSessionDown(t, n1, time.Now().Add(convergeTimeout))
	down := time.Now()
	if rs, err := n1.sp.learnedRoutes(); err != nil || !hasRoute(rs, blockOf(0), n0.addr) {
		t.Fatalf("route dropped at once after a graceful stop (err %v):%s", err, routesString(rs))
	}
	if got, ok := n1.watch.waitFor(time.Now().Add(convergeTimeout), func(rs []LearnedRoute) bool { return lacksRoute(rs, blockOf(0)) }); !ok {
		t.Fatalf("stale route kept past the restart time:%s", routesString(got))
	}
	if held := time.Since(down); held < 2*time.Second {
		t.Errorf("stale route held only %v, want about the 3 s restart time", held)
	}
}
