package bgp

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
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
// GoBGP) is read twice, senderWindow apart, by sweeps that read every
// session due with one peer listing (senderChecks); a session still up that sent
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
		s.senders.firstLook(ev.Peer.State.NeighborAddress, t.Add(senderSlack), s.sweepSenders)
	}
}

// senderChecks batches the sender checks: the sessions that came up wait
// for their first look, and those looked at once for their second, and a
// sweep looks at every session that is due with one peer listing. One
// listing per session and look, as before, queued two thousand requests
// on GoBGP's main loop when a thousand clients' sessions came up at once
// (docs/scale.md, "Why a first session goes silent during a fill"): the
// loop that also has to send them their tables.
type senderChecks struct {
	mu     sync.Mutex
	first  map[netip.Addr]time.Time // first look due
	second map[netip.Addr]secondLook
	timer  *time.Timer
	// sweepAt is when the timer fires (zero when it is not armed).
	sweepAt time.Time
	// compared counts the second looks taken (for tests).
	compared atomic.Int64
}

// secondLook is a session's first sample and when the second is due.
type secondLook struct {
	before senderSample
	due    time.Time
}

// senderSweepEvery is the least time between two sweeps: the looks of
// sessions that came up within it share one listing. A look a few
// seconds late only delays the re-creation of a dead sender, which its
// peer's hold timer would end much later.
const senderSweepEvery = senderSlack

// firstLook queues a's first look for due and arms the sweep.
func (c *senderChecks) firstLook(a netip.Addr, due time.Time, sweep func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.first == nil {
		c.first, c.second = map[netip.Addr]time.Time{}, map[netip.Addr]secondLook{}
	}
	c.first[a] = due
	delete(c.second, a) // a new session: its earlier first sample is void
	c.armLocked(due, sweep)
}

// armLocked makes the timer fire at due, or at the earlier time it is set
// for, and no sooner than senderSweepEvery after the last sweep started.
func (c *senderChecks) armLocked(due time.Time, sweep func()) {
	if !c.sweepAt.IsZero() && !c.sweepAt.After(due) {
		return
	}
	c.sweepAt = due
	d := time.Until(due)
	if c.timer == nil {
		c.timer = time.AfterFunc(d, sweep)
		return
	}
	c.timer.Reset(d)
}

// take returns the looks due at now (first looks up to senderSweepEvery
// early) and re-arms nothing: the sweep calls done when it has queued the
// second looks.
func (c *senderChecks) take(now time.Time) (first []netip.Addr, second map[netip.Addr]senderSample) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweepAt = time.Time{}
	for a, due := range c.first {
		// First looks due before the next sweep could run are taken now:
		// their slack is only the session's settling.
		if !due.After(now.Add(senderSweepEvery)) {
			first = append(first, a)
			delete(c.first, a)
		}
	}
	for a, l := range c.second {
		if !l.due.After(now) {
			if second == nil {
				second = map[netip.Addr]senderSample{}
			}
			second[a] = l.before
			delete(c.second, a)
		}
	}
	return first, second
}

// done queues the second looks of the sessions looked at first (unless a
// newer session of the peer came up meanwhile) and arms the next sweep,
// senderSweepEvery after start at the soonest.
func (c *senderChecks) done(start time.Time, looked map[netip.Addr]senderSample, sweep func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for a, before := range looked {
		if _, renewed := c.first[a]; !renewed {
			c.second[a] = secondLook{before: before, due: start.Add(senderWindow(before.keepalive))}
		}
	}
	next := time.Time{}
	for _, due := range c.first {
		if next.IsZero() || due.Before(next) {
			next = due
		}
	}
	for _, l := range c.second {
		if next.IsZero() || l.due.Before(next) {
			next = l.due
		}
	}
	if !next.IsZero() {
		c.armLocked(maxTime(next, start.Add(senderSweepEvery)), sweep)
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// sweepSenders takes the looks that are due, samples every session with
// one listing, queues the second looks, and re-creates each session whose
// sender sent nothing between its two.
func (s *speaker) sweepSenders() {
	start := time.Now()
	first, second := s.senders.take(start)
	if len(first) == 0 && len(second) == 0 {
		s.senders.done(start, nil, s.sweepSenders)
		return
	}
	samples, ok := s.sampleSenders()
	looked := map[netip.Addr]senderSample{}
	for _, a := range first {
		if before, found := samples[a]; ok && found && before.up && before.keepalive > 0 {
			looked[a] = before
		}
	}
	s.senders.done(start, looked, s.sweepSenders)
	if !ok {
		return // GoBGP stopped or did not answer: the second looks are lost, as a dead sender's would be
	}
	for a, before := range second {
		s.senders.compared.Add(1)
		if after, found := samples[a]; found && senderStopped(before, after) {
			s.recreateStopped(a, before, after, start)
		}
	}
}

// recreateStopped re-creates a's session, whose sender sent nothing
// between before and after (sampled at asked), unless its state changed
// since the look: on a loaded speaker the look and the lock can be
// seconds apart.
func (s *speaker) recreateStopped(a netip.Addr, before, after senderSample, asked time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	p, known := s.peers[a]
	if s.srv == nil || s.stopped || !known || s.sessions.since[a].After(asked) {
		return
	}
	s.log.Warn("re-creating BGP session whose sender stopped (GoBGP kept the previous session's end in its queue)",
		"peer", a, "established", before.since, "sent", after.sent, "window", senderWindow(before.keepalive))
	if err := s.recreatePeer(ctx, p); err != nil {
		s.log.Warn("re-creating BGP session whose sender stopped", "peer", a, "err", err)
	}
}

// sampleSenders reads every session from one GoBGP peer listing.
func (s *speaker) sampleSenders() (map[netip.Addr]senderSample, bool) {
	return s.listSenders(netip.Addr{})
}

// sampleSender reads a's session from GoBGP's peer listing (one peer).
func (s *speaker) sampleSender(a netip.Addr) (senderSample, bool) {
	m, ok := s.listSenders(a)
	out, found := m[a]
	return out, ok && found
}

// listSenders reads the sessions of GoBGP's peer listing: of peer a, or
// of every peer when a is the zero address.
func (s *speaker) listSenders(a netip.Addr) (map[netip.Addr]senderSample, bool) {
	s.mu.Lock()
	srv, stopped := s.srv, s.stopped
	s.mu.Unlock()
	if srv == nil || stopped {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := &gobgpapi.ListPeerRequest{}
	if a.IsValid() {
		req.Address = a.String()
	}
	out := map[netip.Addr]senderSample{}
	err := srv.ListPeer(ctx, req, func(p *gobgpapi.Peer) {
		addr, err := netip.ParseAddr(p.GetConf().GetNeighborAddress())
		if err != nil {
			return
		}
		var smp senderSample
		smp.up = p.GetState().GetSessionState() == gobgpapi.PeerState_SESSION_STATE_ESTABLISHED
		smp.sent = p.GetState().GetMessages().GetSent().GetTotal()
		if ts := p.GetTimers().GetState(); ts != nil {
			smp.keepalive = time.Duration(ts.GetKeepaliveInterval()) * time.Second
			if ts.GetUptime() != nil {
				smp.since = ts.GetUptime().AsTime()
			}
		}
		out[addr.Unmap()] = smp
	})
	return out, err == nil
}
