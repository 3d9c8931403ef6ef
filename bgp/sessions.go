package bgp

import (
	"fmt"
	"net/netip"
	"slices"
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
	// families the established session carries, from its OPENs
	families map[netip.Addr][]string
	pfxLimit map[netip.Addr]bool // shut down for exceeding max-prefix
	// order caches the configured peers' addresses, sorted, for Sessions
	// (sortedPeerAddrs): sorting a reflector's thousand statuses on every
	// read was half of its cost. nil when s.peers' keys changed since.
	order []netip.Addr
	// changed is signalled (coalesced) after each of the above changes.
	changed chan struct{}
}

func newSessionTracker() sessionTracker {
	return sessionTracker{
		state: map[netip.Addr]session.State{},
		since: map[netip.Addr]time.Time{},
		eor:   map[netip.Addr]bool{},
		info:  map[netip.Addr]string{},

		families: map[netip.Addr][]string{},
		pfxLimit: map[netip.Addr]bool{},
		changed:  make(chan struct{}, 1),
	}
}

// notify signals changed without blocking.
func (t *sessionTracker) notify() {
	select {
	case t.changed <- struct{}{}:
	default:
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
	if st != session.Established {
		delete(t.families, a)
	}
	t.notify()
}

// created records that a session to a was (re-)created at.
func (t *sessionTracker) created(a netip.Addr, at time.Time) {
	t.since[a] = at
	delete(t.eor, a)
	t.notify()
}

// sawEOR records a's End-of-RIB.
func (t *sessionTracker) sawEOR(a netip.Addr) {
	if !t.eor[a] {
		t.eor[a] = true
		t.notify()
	}
}

// forget drops everything known about a (its peer was deleted).
func (t *sessionTracker) forget(a netip.Addr) {
	delete(t.state, a)
	delete(t.since, a)
	delete(t.eor, a)
	delete(t.info, a)
	delete(t.families, a)
	delete(t.pfxLimit, a)
	t.notify()
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

// nextStuck is when the earliest session now opening will have been
// opening for limit; ok is false when none is opening.
func (t *sessionTracker) nextStuck(limit time.Duration) (at time.Time, ok bool) {
	for a, st := range t.state {
		since, known := t.since[a]
		if !known || !st.Opening() {
			continue
		}
		if d := since.Add(limit); !ok || d.Before(at) {
			at, ok = d, true
		}
	}
	return at, ok
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
		prev, pfx := s.sessions.state[a], s.sessions.pfxLimit[a]
		s.sessions.observe(a, st, t, info)
		s.sessions.pfxLimit[a] = ev.Peer.State.AdminState == gobgpapi.PeerState_ADMIN_STATE_PFX_CT
		if st == session.Established {
			s.sessions.families[a] = capFamilies(ev.Peer.State.LocalCap, ev.Peer.State.RemoteCap)
		}
		p := s.peers[a]
		if fullReadAfter(prev, st, p.BFD != nil || maxPrefixes(p) > 0 || pfx != s.sessions.pfxLimit[a]) {
			s.resyncAll = true
		}
		s.mu.Unlock()
	}
	s.markDirty()
}

// fullReadAfter reports whether a session's change from prev to next
// needs the whole RIB read again: a session that was or becomes
// Established may have left its paths behind as stale, or replaced them
// (see readRIB), and the paths of a peer with a prefix limit or BFD
// (limitable) count or not by its state (limitedPeers). The steps of a
// session that is not up (Idle, Connect, Active, OpenSent, OpenConfirm)
// change no path: a reflector whose clients retry read its whole RIB for
// each of their attempts' steps, a tenth of its CPU in such a rest at
// 1,000 clients (docs/scale.md, "Reflector memory and CPU at rest").
func fullReadAfter(prev, next session.State, limitable bool) bool {
	return limitable || prev == session.Established || next == session.Established
}

// capFamilies lists the unicast families both sides announced in their
// OPEN (multiprotocol capabilities), as negotiatedFamilies does from
// GoBGP's peer listing.
func capFamilies(local, remote []gobgp.ParameterCapabilityInterface) []string {
	announced := func(caps []gobgp.ParameterCapabilityInterface) map[string]bool {
		m := map[string]bool{}
		for _, c := range caps {
			if mp, ok := c.(*gobgp.CapMultiProtocol); ok {
				switch mp.CapValue {
				case gobgp.RF_IPv4_UC:
					m["ipv4"] = true
				case gobgp.RF_IPv6_UC:
					m["ipv6"] = true
				}
			}
		}
		return m
	}
	return bothFamilies(announced(local), announced(remote))
}

// SessionsChanged implements Speaker.
func (s *speaker) SessionsChanged() <-chan struct{} { return s.sessions.changed }

// Sessions implements Speaker: the configured peers' sessions as followed
// from GoBGP's events (onPeerEvent, onEOR) and the BFD watch; it asks
// GoBGP nothing, so it neither waits on a session reset nor makes GoBGP
// count Adj-RIB-Ins (see Peers).
func (s *speaker) Sessions() []PeerStatus {
	s.mu.Lock()
	order := s.sortedPeerAddrs()
	out := make([]PeerStatus, 0, len(order))
	for _, a := range order {
		st := PeerStatus{Address: a, State: session.Idle, Since: s.sessions.since[a]}
		if known, ok := s.sessions.state[a]; ok {
			st.State = known
		}
		st.PrefixLimitExceeded = s.sessions.pfxLimit[a]
		if st.State == session.Established {
			st.Families = slices.Clone(s.sessions.families[a])
		}
		out = append(out, st)
	}
	s.annotate(out)
	s.mu.Unlock()
	s.bfdMu.Lock()
	for i := range out {
		st := &out[i]
		if _, runs := s.bfdCfg[st.Address]; !runs {
			continue
		}
		st.BFD = "Down"
		if known, ok := s.bfdStates[st.Address]; ok && !s.bfdDown[st.Address] {
			st.BFD = bfdStateName(known)
		}
	}
	s.bfdMu.Unlock()
	return out
}

// sortedPeerAddrs returns the configured peers' addresses in order, sorted
// once per change of s.peers' keys (putPeer and dropPeer clear the cache).
// Called with s.mu held; read-only for the caller.
func (s *speaker) sortedPeerAddrs() []netip.Addr {
	if s.sessions.order != nil {
		return s.sessions.order
	}
	order := make([]netip.Addr, 0, len(s.peers))
	for a := range s.peers {
		order = append(order, a)
	}
	slices.SortFunc(order, netip.Addr.Compare)
	s.sessions.order = order
	return order
}

// annotate adds to sessions what our own configuration and the session
// tracker know: type, prefix limit, syncing, reason. Called with s.mu held.
func (s *speaker) annotate(out []PeerStatus) {
	for i := range out {
		st := &out[i]
		peer := s.peers[st.Address]
		st.Syncing = st.State == session.Established && !s.sessions.eor[st.Address]
		st.Type = peer.Type
		if t, ok := s.sessions.since[st.Address]; ok && t.After(st.Since) {
			st.Since = t
		}
		st.MaxPrefixes = maxPrefixes(peer)
		if st.BFD == "" && peer.BFD != nil {
			st.BFD = "Down"
		}
		st.Info = s.sessions.info[st.Address]
		if st.PrefixLimitExceeded && st.Info == "" {
			st.Info = fmt.Sprintf("max-prefix limit %d exceeded", st.MaxPrefixes)
		}
	}
}
