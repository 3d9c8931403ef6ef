package agent

import (
	"context"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/bgp/session"
	"github.com/tabbynet/tabby/dataplane/fake"
)

// The session tracker calls BGP converged once every desired peer has
// been Established for convergeHold with a route set delivered, or once
// settle has passed, and not again after that.
func TestSessionTrackerConverges(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a, c := netip.MustParseAddr("198.18.0.12"), netip.MustParseAddr("198.18.0.13")
	status := func(sa, sc session.State) []bgp.PeerStatus {
		return []bgp.PeerStatus{{Address: a, State: sa}, {Address: c, State: sc}}
	}
	s := bgpSessions{started: t0, settle: time.Minute, desiredPeers: []bgp.Peer{{Address: a, Type: bgp.PeerMesh}, {Address: c, Type: bgp.PeerGlobal}}}
	steps := []struct {
		at         time.Duration
		st         []bgp.PeerStatus
		learnedAny bool
		want       bool
	}{
		{0, status(session.Established, session.Active), true, false},
		{time.Second, status(session.Established, session.Established), false, false},     // all up from here
		{5 * time.Second, status(session.Established, session.Established), false, false}, // no route set yet
		{6 * time.Second, status(session.Established, session.OpenConfirm), true, false},  // one went down
		{7 * time.Second, status(session.Established, session.Established), true, false},  // up again, hold restarts
		{7*time.Second + convergeHold, status(session.Established, session.Established), true, true},
		{time.Hour, status(session.Idle, session.Idle), true, false}, // converged stays
	}
	for i, st := range steps {
		if got := s.observe(st.st, t0.Add(st.at), true, st.learnedAny); got != st.want {
			t.Errorf("step %d (%v): converged now = %v, want %v", i, st.at, got, st.want)
		}
	}
	if !s.converged {
		t.Error("not converged at the end")
	}

	late := bgpSessions{started: t0, settle: time.Minute, desiredPeers: []bgp.Peer{{Address: a, Type: bgp.PeerMesh}}}
	if late.observe(status(session.Active, session.Active), t0.Add(59*time.Second), true, false) {
		t.Error("converged before settle with its peer down")
	}
	if !late.observe(status(session.Active, session.Active), t0.Add(time.Minute), true, false) {
		t.Error("not converged once settle passed")
	}
	if err := late.readiness(true); err == nil {
		t.Error("ready with its one cluster peer Active")
	}
	if err := s.readiness(false); err == nil {
		t.Error("ready before the first pass")
	}
}

// A cluster peer whose session is back but that has not sent End-of-RIB
// (a restarted agent sends its routes only after its own deferral) keeps
// BGP from converging, so the stale learned routes it is about to send
// again stay in the kernel (TestRollingRestart lost pings to the restarted
// node's pods when they went early). An external peer's End-of-RIB is not
// waited for.
func TestSessionTrackerWaitsForRestartedPeersEndOfRIB(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a, c := netip.MustParseAddr("198.18.0.14"), netip.MustParseAddr("198.18.0.1")
	status := func(syncingA bool) []bgp.PeerStatus {
		return []bgp.PeerStatus{{Address: a, State: session.Established, Syncing: syncingA}, {Address: c, State: session.Established, Syncing: true}}
	}
	s := bgpSessions{started: t0, settle: time.Minute, desiredPeers: []bgp.Peer{{Address: a, Type: bgp.PeerMesh}, {Address: c, Type: bgp.PeerGlobal}}}
	steps := []struct {
		at      time.Duration
		syncing bool
		want    bool
	}{
		{0, true, false},
		{convergeHold, true, false},
		{10 * time.Second, true, false}, // still no End-of-RIB from a
		{11 * time.Second, false, false},
		{11*time.Second + convergeHold, false, true},
	}
	for i, st := range steps {
		if got := s.observe(status(st.syncing), t0.Add(st.at), true, true); got != st.want {
			t.Errorf("step %d (%v): converged now = %v, want %v", i, st.at, got, st.want)
		}
	}
	if err := s.readiness(true); err != nil {
		t.Errorf("not ready with its cluster peer Established: %v", err)
	}
}

// GoBGP's counting peer listing runs soon after a change that may have
// changed the counts (a session event, a new learned route set), every
// 30 s otherwise, and less often with many peers: each listing holds
// GoBGP's write lock for a time that grows with the peers. Session states
// do not wait for it (Sessions).
func TestPrefixCountsDue(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 13, 0, 0, 0, time.UTC)
	tests := []struct {
		name     string
		after    time.Duration
		peers    int
		sessions bool   // a session event since the last count
		sets     uint64 // route sets delivered (1 at the last count)
		want     bool
	}{
		{"at rest", 29 * time.Second, 2, false, 1, false},
		{"at rest, countEvery later", 30 * time.Second, 2, false, 1, true},
		{"session event, too soon", time.Second, 2, true, 1, false},
		{"session event", 2 * time.Second, 2, true, 1, true},
		{"new route set", 2 * time.Second, 2, false, 2, true},
		{"new route set, 1,000 peers, too soon", 5 * time.Second, 1000, false, 2, false},
		{"new route set, 1,000 peers", 10 * time.Second, 1000, false, 2, true},
		{"at rest, 1,000 peers", 59 * time.Second, 1000, false, 1, false},
		{"at rest, 1,000 peers, countEvery later", 60 * time.Second, 1000, false, 1, true},
	}
	for _, tt := range tests {
		var c prefixCounts
		c.counted(t0, 1)
		c.sessionsChanged = tt.sessions
		if got := c.due(t0.Add(tt.after), tt.peers, tt.sets); got != tt.want {
			t.Errorf("%s: due = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// The status API and a metrics scrape have the received prefixes counted
// again (GoBGP's counting peer listing), unless the last count is recent:
// what they show is at most countSoon old, and scrapes in a burst cost one
// listing.
func TestRefreshCountsOnRequest(t *testing.T) {
	ctx := context.Background()
	sp := newFakeSpeaker()
	b := newTestBGPOwner(t, sp, fake.NewRoutes())
	peer := bgp.Peer{Address: netip.MustParseAddr("198.18.0.12"), ASN: 64512, Type: bgp.PeerRRClient}
	if err := sp.SetPeers(ctx, []bgp.Peer{peer}); err != nil {
		t.Fatal(err)
	}
	b.desiredPeers = []bgp.Peer{peer}
	received := func() uint32 {
		b.mu.Lock()
		defer b.mu.Unlock()
		if len(b.peerStatus) != 1 {
			t.Fatalf("status %+v, want one peer", b.peerStatus)
		}
		return b.peerStatus[0].Received
	}
	b.updatePeerStatus(sp) // from the session events: no count
	sp.mu.Lock()
	sp.received = 7
	sp.mu.Unlock()
	b.refreshCounts(ctx)
	if got := received(); got != 7 || sp.lists != 1 {
		t.Errorf("after a request: received %d after %d listings, want 7 after 1", got, sp.lists)
	}
	sp.mu.Lock()
	sp.received = 9
	sp.mu.Unlock()
	b.refreshCounts(ctx)
	b.updatePeerStatus(sp) // an event in between keeps the count
	if got := received(); got != 7 || sp.lists != 1 {
		t.Errorf("a second request at once: received %d after %d listings, want 7 after 1", got, sp.lists)
	}
	b.mu.Lock()
	b.counts.at = b.counts.at.Add(-countSoon(1))
	b.mu.Unlock()
	b.refreshCounts(ctx)
	if got := received(); got != 9 || sp.lists != 2 {
		t.Errorf("a request countSoon later: received %d after %d listings, want 9 after 2", got, sp.lists)
	}
}

// equalPeerStatus compares every field of bgp.PeerStatus: a field it
// missed would leave the metrics behind a change of that field alone.
func TestEqualPeerStatusEveryField(t *testing.T) {
	base := bgp.PeerStatus{Address: netip.MustParseAddr("198.18.0.12")}
	if !equalPeerStatus(base, base) {
		t.Fatal("a status differs from itself")
	}
	changed := map[string]func(*bgp.PeerStatus){
		"Address":             func(p *bgp.PeerStatus) { p.Address = netip.MustParseAddr("198.18.0.13") },
		"Type":                func(p *bgp.PeerStatus) { p.Type = bgp.PeerRR },
		"State":               func(p *bgp.PeerStatus) { p.State = session.Established },
		"Since":               func(p *bgp.PeerStatus) { p.Since = time.Unix(1, 0) },
		"Info":                func(p *bgp.PeerStatus) { p.Info = "x" },
		"PrefixLimitExceeded": func(p *bgp.PeerStatus) { p.PrefixLimitExceeded = true },
		"Received":            func(p *bgp.PeerStatus) { p.Received = 1 },
		"MaxPrefixes":         func(p *bgp.PeerStatus) { p.MaxPrefixes = 1 },
		"BFD":                 func(p *bgp.PeerStatus) { p.BFD = "Up" },
		"Families":            func(p *bgp.PeerStatus) { p.Families = []string{"ipv4"} },
		"Syncing":             func(p *bgp.PeerStatus) { p.Syncing = true },
	}
	typ := reflect.TypeOf(base)
	for i := range typ.NumField() {
		name := typ.Field(i).Name
		change, ok := changed[name]
		if !ok {
			t.Errorf("PeerStatus.%s: no case here; add it and compare it in equalPeerStatus", name)
			continue
		}
		other := base
		change(&other)
		if equalPeerStatus(base, other) {
			t.Errorf("equalPeerStatus ignores PeerStatus.%s", name)
		}
	}
}
