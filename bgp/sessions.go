package bgp

import (
	"net/netip"
	"time"

	gobgpapi "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"github.com/tabbynet/tabby/bgp/session"
)

// sessionTracker is the speaker's record of its sessions, kept from
// GoBGP's peer events so that the stuck-session check and the initial
// sync never have to ask GoBGP (whose management calls can wait seconds
// while it resets a session). The speaker's mu guards it.
type sessionTracker struct {
	state map[netip.Addr]session.State // last state GoBGP reported per peer
	since map[netip.Addr]time.Time     // last session state change per peer
	eor   map[netip.Addr]bool          // peers that sent End-of-RIB since their session came up
	info  map[netip.Addr]string        // last disconnect reason per peer
}

func newSessionTracker() sessionTracker {
	return sessionTracker{
		state: map[netip.Addr]session.State{},
		since: map[netip.Addr]time.Time{},
		eor:   map[netip.Addr]bool{},
		info:  map[netip.Addr]string{},
	}
}

// observe records a state change GoBGP reported at t; info is the
// disconnect reason that came with it, if any. An Established session
// clears the last reason.
func (t *sessionTracker) observe(a netip.Addr, st session.State, at time.Time, info string) {
	t.since[a] = at
	t.state[a] = st
	if st != session.Established {
		delete(t.eor, a) // a new session sends its own End-of-RIB
	}
	switch {
	case st == session.Established:
		t.info[a] = ""
	case info != "":
		t.info[a] = info
	}
}

// created records that a session to a was (re-)created at.
func (t *sessionTracker) created(a netip.Addr, at time.Time) {
	t.since[a] = at
	delete(t.eor, a)
}

// sawEOR records a's End-of-RIB.
func (t *sessionTracker) sawEOR(a netip.Addr) { t.eor[a] = true }

// forget drops everything known about a (its peer was deleted).
func (t *sessionTracker) forget(a netip.Addr) {
	delete(t.state, a)
	delete(t.since, a)
	delete(t.eor, a)
	delete(t.info, a)
}

// stuck lists the peers that have sat in OpenSent or OpenConfirm for
// longer than limit at now.
func (t *sessionTracker) stuck(now time.Time, limit time.Duration) []netip.Addr {
	var out []netip.Addr
	for a, st := range t.state {
		if since, ok := t.since[a]; ok && st.Opening() && now.Sub(since) > limit {
			out = append(out, a)
		}
	}
	return out
}

// sessionStates pairs GoBGP's two spellings of each session state (its
// peer events' and its peer listing's) with ours; any other is Idle.
var sessionStates = []struct {
	fsm   gobgp.FSMState
	api   gobgpapi.PeerState_SessionState
	state session.State
}{
	{gobgp.BGP_FSM_CONNECT, gobgpapi.PeerState_SESSION_STATE_CONNECT, session.Connect},
	{gobgp.BGP_FSM_ACTIVE, gobgpapi.PeerState_SESSION_STATE_ACTIVE, session.Active},
	{gobgp.BGP_FSM_OPENSENT, gobgpapi.PeerState_SESSION_STATE_OPENSENT, session.OpenSent},
	{gobgp.BGP_FSM_OPENCONFIRM, gobgpapi.PeerState_SESSION_STATE_OPENCONFIRM, session.OpenConfirm},
	{gobgp.BGP_FSM_ESTABLISHED, gobgpapi.PeerState_SESSION_STATE_ESTABLISHED, session.Established},
}

// fsmState translates the state of a GoBGP peer event.
func fsmState(st gobgp.FSMState) session.State {
	for _, s := range sessionStates {
		if s.fsm == st {
			return s.state
		}
	}
	return session.Idle
}

// apiState translates the session state of GoBGP's peer listing.
func apiState(st gobgpapi.PeerState_SessionState) session.State {
	for _, s := range sessionStates {
		if s.api == st {
			return s.state
		}
	}
	return session.Idle
}

func (s *speaker) onEOR(p *apiutil.Path, _ time.Time) {
	if p == nil || !p.PeerAddress.IsValid() {
		return
	}
	s.mu.Lock()
	s.sessions.sawEOR(p.PeerAddress)
	s.mu.Unlock()
	s.markDirty()
}

func (s *speaker) onPeerEvent(ev *apiutil.WatchEventMessage_PeerEvent, t time.Time) {
	if ev == nil {
		return
	}
	if ev.Type == apiutil.PEER_EVENT_STATE {
		a := ev.Peer.State.NeighborAddress
		st := fsmState(ev.Peer.State.SessionState)
		var info string
		if st != session.Established {
			info = disconnectInfo(ev)
		}
		s.mu.Lock()
		s.sessions.observe(a, st, t, info)
		// A session that went down may have left its paths behind as
		// stale (see readRIB): read everything again.
		s.resyncAll = true
		s.mu.Unlock()
	}
	s.markDirty()
}
