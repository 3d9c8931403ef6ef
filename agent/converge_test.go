package agent

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/agent/routetable"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/bgp/session"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/syncer/syncertest"
)

func newTestBGPOwner(t *testing.T, sp bgp.Speaker, routes dataplane.Routes) *bgpOwner {
	t.Helper()
	v := startView(t, syncertest.Static{})
	b := newBGPOwner("node1", netip.MustParsePrefix("198.18.0.11/24"), v, routetable.New(routes, 0), sp, nil, 30*time.Second, newMetrics(), testLogger())
	return b
}

// Every peer Established is not enough to call BGP converged after a
// restart: until the speaker delivered its first route set (it waits for
// the peers' End-of-RIB), the agent's learned set is empty and a converged
// sync would flush every learned route from the kernel.
func TestNotConvergedBeforeFirstRouteSet(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sp := newFakeSpeaker()
	b := newTestBGPOwner(t, sp, fake.NewRoutes())
	peer := bgp.Peer{Address: netip.MustParseAddr("198.18.0.12"), ASN: 64512, Type: bgp.PeerMesh}
	if err := sp.SetPeers(ctx, []bgp.Peer{peer}); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	b.started, b.lastPass, b.desiredPeers = now, now, []bgp.Peer{peer}
	b.allUpSince = now.Add(-time.Minute) // the session has long been up

	if b.updatePeerStatus(sp) {
		t.Fatal("converged before the speaker delivered any learned routes")
	}
	if err := b.ready(); err != nil {
		t.Errorf("not ready with its one cluster peer established: %v", err)
	}

	sp.learn([]bgp.LearnedRoute{{Prefix: netip.MustParsePrefix("10.244.1.0/26"), NextHops: []netip.Addr{peer.Address}}})
	done := make(chan struct{})
	go func() { defer close(done); b.learnedLoop(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b.mu.Lock()
		converged := b.converged
		b.mu.Unlock()
		if converged {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("not converged after the first route set with every peer up")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestSyncLearnedKeepsStaleUntilConverged(t *testing.T) {
	stale := dataplane.Route{Dst: netip.MustParsePrefix("10.244.9.0/26"), Gateways: []netip.Addr{netip.MustParseAddr("198.18.0.19")}, Proto: dataplane.RouteProtoBGP}
	foreign := dataplane.Route{Dst: netip.MustParsePrefix("192.0.2.0/24"), Gateways: []netip.Addr{netip.MustParseAddr("198.18.0.1")}, Proto: 4}
	routes := fake.NewRoutes(stale, foreign)
	b := newTestBGPOwner(t, newFakeSpeaker(), routes)
	b.learned = []bgp.LearnedRoute{
		{Prefix: netip.MustParsePrefix("10.244.1.0/26"), NextHops: []netip.Addr{netip.MustParseAddr("198.18.0.13"), netip.MustParseAddr("198.18.0.12")}},
		{Prefix: netip.MustParsePrefix("10.244.2.0/26"), NextHops: []netip.Addr{netip.MustParseAddr("198.18.0.11")}}, // via ourselves: dropped
	}
	if _, err := b.syncLearned(); err != nil {
		t.Fatal(err)
	}
	got := routes.String()
	for _, want := range []string{"10.244.1.0/26", "nexthop via 198.18.0.12", "nexthop via 198.18.0.13", "10.244.9.0/26", "192.0.2.0/24"} {
		if !strings.Contains(got, want) {
			t.Errorf("before convergence, routes lack %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "10.244.2.0/26") {
		t.Errorf("a route via this node itself was installed:\n%s", got)
	}
	b.converged = true
	if _, err := b.syncLearned(); err != nil {
		t.Fatal(err)
	}
	got = routes.String()
	if strings.Contains(got, "10.244.9.0/26") {
		t.Errorf("stale learned route kept after convergence:\n%s", got)
	}
	if !strings.Contains(got, "192.0.2.0/24") {
		t.Errorf("a foreign route was touched:\n%s", got)
	}
}

// A node is ready with one cluster peer up although another is down (a
// rolling update restarts one agent at a time), unready with none up, and
// unready before its first pass (no desired peers is not "none configured").
func TestReadyWithOneClusterPeer(t *testing.T) {
	sp := newFakeSpeaker()
	b := newTestBGPOwner(t, sp, fake.NewRoutes())
	if err := b.ready(); err == nil {
		t.Error("ready before the first pass computed the desired peers")
	}
	b.lastPass = time.Now()
	up, down := netip.MustParseAddr("198.18.0.12"), netip.MustParseAddr("198.18.0.13")
	tor := netip.MustParseAddr("198.18.0.1")
	b.desiredPeers = []bgp.Peer{{Address: up, Type: bgp.PeerMesh}, {Address: down, Type: bgp.PeerMesh}, {Address: tor, Type: bgp.PeerGlobal}}
	b.peerStatus = []bgp.PeerStatus{{Address: up, State: session.Established}, {Address: down, State: session.Active}, {Address: tor, State: session.Active}}
	if err := b.ready(); err != nil {
		t.Errorf("one of two cluster peers up: %v", err)
	}
	b.peerStatus[0].State = session.Idle
	b.peerStatus[2].State = session.Established // a ToR alone does not reach the cluster
	if err := b.ready(); err == nil {
		t.Error("ready with no cluster peer established")
	}
	b.desiredPeers = nil
	if err := b.ready(); err != nil {
		t.Errorf("ready must not wait for peers when none is configured: %v", err)
	}
}
