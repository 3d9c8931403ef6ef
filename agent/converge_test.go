package agent

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/dataplane/fake"
)

// Every peer Established is not enough to call BGP converged after a
// restart: until the speaker delivered its first route set (it waits for
// the peers' End-of-RIB), the agent's learned set is empty and a converged
// sync would flush every learned route from the kernel.
func TestNotConvergedBeforeFirstRouteSet(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sp := newFakeSpeaker()
	cfg := Default()
	cfg.NodeName = "node1"
	a := New(cfg, testLogger(), Deps{Speaker: sp, Routes: fake.NewRoutes()})
	peer := bgp.Peer{Address: netip.MustParseAddr("198.18.0.12"), ASN: 64512}
	if err := sp.SetPeers(ctx, []bgp.Peer{peer}); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	a.started, a.lastBGP, a.desiredPeers = now, now, []bgp.Peer{peer}
	a.allUpSince = now.Add(-time.Minute) // the session has long been up

	a.updatePeerStatus(ctx)
	a.mu.Lock()
	converged := a.converged
	a.mu.Unlock()
	if converged {
		t.Fatal("converged before the speaker delivered any learned routes")
	}

	sp.learn([]bgp.LearnedRoute{{Prefix: netip.MustParsePrefix("10.244.1.0/26"), NextHops: []netip.Addr{peer.Address}}})
	done := make(chan struct{})
	go func() { defer close(done); a.learnedLoop(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		a.mu.Lock()
		converged = a.converged
		a.mu.Unlock()
		if converged {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("not converged after the first route set with every peer up")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
