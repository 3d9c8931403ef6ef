package bgp

import (
	"context"
	"net/netip"
	"time"

	gobgpapi "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

// A session whose GoBGP sender is dead (docs/scale.md, "Session drops").
//
// GoBGP (v4.8.0 and v4.9.0 alike) keeps one outgoing queue per peer for
// all its sessions (fsm.outgoingCh, made once in newFSM). When a session ends, its
// established handler pushes the reason onto that queue to stop the
// session's sender (fsm.go, established: `h.outgoing.In() <- err`); a
// sender that has already stopped — its write failed first ("failed to
// send"), or the queue held such a reason already — never takes it, and
// the server's drain on the next state change (server.go,
// drainChannel(peer.fsm.outgoingCh.Out())) takes only what the queue's
// pump goroutine has ready, at most an item or two on a loaded host. The
// next session's sender then finds the old reason in the queue and stops
// at once: the session is Established on both sides, the reflector's
// table is never sent, and no KEEPALIVE goes out, so the peer's hold
// timer ends the session a hold time later, which pushes another reason,
// and so on for every later session of that peer. In the 1,000-node
// harness runs, real clients logged "hold timer expired" on their
// reflector sessions exactly 90 s after every re-establishment, and
// hundreds of simulated nodes cycled so through the "rest".
//
// Only a new FSM has an empty queue, so the speaker watches the messages
// GoBGP sends on each session that comes up: their count (never reset by
// GoBGP) is read twice, senderWindow apart; a session still up that sent
// nothing in between, not even a KEEPALIVE, is re-created (DeletePeer and
// AddPeer, as for a stuck session). A live sender writes at least one
// KEEPALIVE per keepalive interval.

// senderSlack is how long after a session comes up its first count is
// read, and what senderWindow adds to a keepalive interval.
const senderSlack = 5 * time.Second

// senderSample is what GoBGP's peer listing says of one session.
type senderSample struct {
	up        bool
	since     time.Time // the session's uptime start
	sent      uint64    // messages sent to the peer, all sessions
	keepalive time.Duration
}

// senderWindow is how long a session's sender may send nothing before
// it counts as dead: two keepalive intervals, and the slack beyond one at
// least (a sender blocked on a slow reader still gets that long).
func senderWindow(keepalive time.Duration) time.Duration {
	return max(2*keepalive, keepalive+senderSlack)
}

// senderStopped reports whether the same session was up at both samples
// and nothing was sent in between.
func senderStopped(before, after senderSample) bool {
	return before.up && after.up && before.since.Equal(after.since) && before.keepalive > 0 && after.sent == before.sent
}

// onPeerEventWatched is onPeerEvent, and the sender check of every
// session that comes up.
func (s *speaker) onPeerEventWatched(ev *apiutil.WatchEventMessage_PeerEvent, t time.Time) {
	s.onPeerEvent(ev, t)
	if ev != nil && ev.Type == apiutil.PEER_EVENT_STATE && ev.Peer.State.SessionState == gobgp.BGP_FSM_ESTABLISHED {
		a := ev.Peer.State.NeighborAddress
		time.AfterFunc(senderSlack, func() { s.checkSender(a) })
	}
}

// checkSender samples a's session now and again senderWindow later, and
// re-creates it if its sender sent nothing in between.
func (s *speaker) checkSender(a netip.Addr) {
	before, ok := s.sampleSender(a)
	if !ok || !before.up || before.keepalive <= 0 {
		return
	}
	time.AfterFunc(senderWindow(before.keepalive), func() {
		asked := time.Now()
		after, ok := s.sampleSender(a)
		if !ok || !senderStopped(before, after) {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s.mu.Lock()
		defer s.mu.Unlock()
		p, known := s.peers[a]
		// A state change since the second look (the session went down,
		// and maybe a new one came up) leaves the new session alone: on a
		// loaded speaker the look and the lock can be seconds apart.
		if s.srv == nil || s.stopped || !known || s.sessions.since[a].After(asked) {
			return
		}
		s.log.Warn("re-creating BGP session whose sender stopped (GoBGP kept the previous session's end in its queue)",
			"peer", a, "established", before.since, "sent", after.sent, "window", senderWindow(before.keepalive))
		if err := s.recreatePeer(ctx, p); err != nil {
			s.log.Warn("re-creating BGP session whose sender stopped", "peer", a, "err", err)
		}
	})
}

// sampleSender reads a's session from GoBGP's peer listing (one peer).
func (s *speaker) sampleSender(a netip.Addr) (senderSample, bool) {
	s.mu.Lock()
	srv, stopped := s.srv, s.stopped
	s.mu.Unlock()
	if srv == nil || stopped {
		return senderSample{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out senderSample
	found := false
	err := srv.ListPeer(ctx, &gobgpapi.ListPeerRequest{Address: a.String()}, func(p *gobgpapi.Peer) {
		found = true
		out.up = p.GetState().GetSessionState() == gobgpapi.PeerState_SESSION_STATE_ESTABLISHED
		out.sent = p.GetState().GetMessages().GetSent().GetTotal()
		if ts := p.GetTimers().GetState(); ts != nil {
			out.keepalive = time.Duration(ts.GetKeepaliveInterval()) * time.Second
			if ts.GetUptime() != nil {
				out.since = ts.GetUptime().AsTime()
			}
		}
	})
	return out, err == nil && found
}
