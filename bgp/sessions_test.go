package bgp

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	gobgpapi "github.com/osrg/gobgp/v4/api"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"github.com/tabbynet/tabby/bgp/session"
)

// TestSessionStates: both of GoBGP's spellings of a state translate to the
// same one of ours; Idle and anything unknown are Idle.
func TestSessionStates(t *testing.T) {
	tests := []struct {
		fsm  gobgp.FSMState
		api  gobgpapi.PeerState_SessionState
		want session.State
	}{
		{gobgp.BGP_FSM_IDLE, gobgpapi.PeerState_SESSION_STATE_IDLE, session.Idle},
		{gobgp.BGP_FSM_CONNECT, gobgpapi.PeerState_SESSION_STATE_CONNECT, session.Connect},
		{gobgp.BGP_FSM_ACTIVE, gobgpapi.PeerState_SESSION_STATE_ACTIVE, session.Active},
		{gobgp.BGP_FSM_OPENSENT, gobgpapi.PeerState_SESSION_STATE_OPENSENT, session.OpenSent},
		{gobgp.BGP_FSM_OPENCONFIRM, gobgpapi.PeerState_SESSION_STATE_OPENCONFIRM, session.OpenConfirm},
		{gobgp.BGP_FSM_ESTABLISHED, gobgpapi.PeerState_SESSION_STATE_ESTABLISHED, session.Established},
		{gobgp.FSMState(99), gobgpapi.PeerState_SESSION_STATE_UNSPECIFIED, session.Idle},
	}
	for _, tt := range tests {
		if got := fsmState(tt.fsm); got != tt.want {
			t.Errorf("fsmState(%v) = %v, want %v", tt.fsm, got, tt.want)
		}
		if got := apiState(tt.api); got != tt.want {
			t.Errorf("apiState(%v) = %v, want %v", tt.api, got, tt.want)
		}
	}
}

// A peer's End-of-RIB counts for the session it came on: once that session
// leaves Established, the next one must send its own.
func TestSessionTrackerEORPerSession(t *testing.T) {
	a := netip.MustParseAddr("198.18.0.14")
	tr := newSessionTracker()
	t0 := time.Now()
	tr.observe(a, session.Established, t0, "")
	tr.sawEOR(a)
	tr.observe(a, session.Established, t0, "") // a repeated event keeps it
	if !tr.eor[a] {
		t.Fatal("End-of-RIB lost while the session stayed Established")
	}
	tr.observe(a, session.Idle, t0.Add(time.Second), "graceful restart")
	tr.observe(a, session.Established, t0.Add(2*time.Second), "")
	if tr.eor[a] {
		t.Error("the End-of-RIB of the session before still counts")
	}
}

// nextStuck is the earliest moment a session now opening reaches the
// limit; sessions in other states never make one.
func TestSessionTrackerNextStuck(t *testing.T) {
	a, b, c := netip.MustParseAddr("198.18.0.21"), netip.MustParseAddr("198.18.0.22"), netip.MustParseAddr("198.18.0.23")
	t0 := time.Date(2026, 12, 6, 13, 0, 0, 0, time.UTC)
	tr := newSessionTracker()
	if _, ok := tr.nextStuck(stuckTimeout); ok {
		t.Fatal("no session: a stuck check is due")
	}
	tr.observe(a, session.Established, t0, "")
	tr.observe(b, session.Active, t0, "")
	if _, ok := tr.nextStuck(stuckTimeout); ok {
		t.Fatal("no session opening: a stuck check is due")
	}
	tr.observe(b, session.OpenConfirm, t0.Add(3*time.Second), "")
	tr.observe(c, session.OpenSent, t0.Add(time.Second), "")
	at, ok := tr.nextStuck(stuckTimeout)
	if want := t0.Add(time.Second + stuckTimeout); !ok || !at.Equal(want) {
		t.Errorf("nextStuck = %v, %v; want %v, true", at, ok, want)
	}
	if got := tr.stuck(at.Add(time.Millisecond), stuckTimeout); len(got) != 1 || got[0] != c {
		t.Errorf("stuck just after nextStuck = %v, want [%v]", got, c)
	}
}

// Sessions reports from GoBGP's events what Peers reports from GoBGP's
// peer listing (but the received counts), and SessionsChanged says when
// it changed: a session that comes up, and one that goes down.
func TestSessionsFromEvents(t *testing.T) {
	c := newCluster(t, 9, 2, nil)
	changed := c.nodes[0].sp.SessionsChanged()
	c.configure(t, nil, nil)
	c.advertiseBlocks(t)
	deadline := time.Now().Add(convergeTimeout)
	c.waitAllBlocks(t, deadline)
	waitEstablished(t, c.nodes[0], 1, deadline)

	ignore := cmp.Options{cmpopts.IgnoreFields(PeerStatus{}, "Since", "Received"), cmp.Comparer(func(x, y netip.Addr) bool { return x == y })}
	var got, want []PeerStatus
	for {
		select {
		case <-changed:
		case <-time.After(time.Until(deadline)):
			t.Fatalf("Sessions never matched Peers (-Peers +Sessions):\n%s", cmp.Diff(want, got, ignore))
		}
		got = c.nodes[0].sp.Sessions()
		var err error
		if want, err = c.nodes[0].sp.Peers(context.Background()); err != nil {
			t.Fatal(err)
		}
		if cmp.Equal(want, got, ignore) {
			break
		}
	}
	if len(got) != 1 || got[0].Since.IsZero() || got[0].Received != 0 || !slices.Equal(got[0].Families, []string{"ipv4"}) {
		t.Errorf("Sessions = %+v: want one peer, with a since time, families [ipv4], no counts", got)
	}

	if err := c.nodes[1].sp.Stop(false); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(convergeTimeout)
	for {
		select {
		case <-changed:
		case <-time.After(time.Until(deadline)):
			t.Fatalf("Sessions still %+v after the peer stopped", got)
		}
		got = c.nodes[0].sp.Sessions()
		if len(got) == 1 && got[0].State != session.Established && got[0].Families == nil {
			return
		}
	}
}
