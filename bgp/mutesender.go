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
// loop that also has to send them their tables. One sweep runs at a time,
// and sweeps start at least senderSweepEvery apart.
type senderChecks struct {
	mu     sync.Mutex
	first  map[netip.Addr]firstLook
	second map[netip.Addr]secondLook
	// latest is the generation of each peer's latest session: a look
	// taken of an older one is dropped.
	latest map[netip.Addr]uint64
	gen    uint64
	timer  *time.Timer
	// sweepAt is when the timer fires (zero when it is not armed);
	// running says a sweep is listing, lastStart when the last began.
	sweepAt, lastStart time.Time
	running, stopped   bool
	// compared counts the second looks taken (for tests).
	compared atomic.Int64
}

type firstLook struct {
	due time.Time
	gen uint64
}

// secondLook is a session's first sample and when the second is due.
type secondLook struct {
	before senderSample
	due    time.Time
	gen    uint64
}

// senderSweepEvery is the least time between two sweeps' starts: the
// looks of sessions that came up within it share one listing. A look a
// few seconds late only delays the re-creation of a dead sender, which its
// peer's hold timer would end much later.
const senderSweepEvery = senderSlack

// firstLook queues the first look of a's new session for due and arms the
// sweep.
func (c *senderChecks) firstLook(a netip.Addr, due time.Time, sweep func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.first == nil {
		c.first, c.second, c.latest = map[netip.Addr]firstLook{}, map[netip.Addr]secondLook{}, map[netip.Addr]uint64{}
	}
	c.gen++
	c.latest[a] = c.gen
	c.first[a] = firstLook{due: due, gen: c.gen}
	delete(c.second, a) // its earlier session's first sample is void
	c.armLocked(due, sweep)
}

// armLocked makes the timer fire at due, or at the earlier time it is set
// for, and not sooner than senderSweepEvery after the last sweep began;
// while a sweep runs, its done arms the next.
func (c *senderChecks) armLocked(due time.Time, sweep func()) {
	if c.stopped || c.running {
		return
	}
	due = maxTime(due, c.lastStart.Add(senderSweepEvery))
	if !c.sweepAt.IsZero() && !c.sweepAt.After(due) {
		return
	}
	c.sweepAt = due
	if c.timer == nil {
		c.timer = time.AfterFunc(time.Until(due), sweep)
		return
	}
	c.timer.Reset(time.Until(due))
}

// take starts a sweep at now and returns the looks due (first looks up to
// senderSweepEvery early: their slack is only the session's settling);
// the sweep calls done when it has sampled.
func (c *senderChecks) take(now time.Time) (first map[netip.Addr]uint64, second map[netip.Addr]secondLook) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweepAt, c.lastStart, c.running = time.Time{}, now, true
	first, second = map[netip.Addr]uint64{}, map[netip.Addr]secondLook{}
	for a, l := range c.first {
		if !l.due.After(now.Add(senderSweepEvery)) {
			first[a] = l.gen
			delete(c.first, a)
		}
	}
	for a, l := range c.second {
		if !l.due.After(now) {
			second[a] = l
			delete(c.second, a)
		}
	}
	return first, second
}

// done ends a sweep: it queues the second looks of the sessions looked at
// first, a window after they were sampled (unless a newer session of the
// peer came up meanwhile), and arms the next sweep.
func (c *senderChecks) done(sampled time.Time, looked map[netip.Addr]secondLook, sweep func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.running = false
	for a, l := range looked {
		if c.latest[a] == l.gen {
			l.due = sampled.Add(senderWindow(l.before.keepalive))
			c.second[a] = l
		}
	}
	next := time.Time{}
	earlier := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for _, l := range c.first {
		earlier(l.due)
	}
	for _, l := range c.second {
		earlier(l.due)
	}
	if !next.IsZero() {
		c.armLocked(next, sweep)
	}
}

// stop ends the checks: no sweep is armed again.
func (c *senderChecks) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	if c.timer != nil {
		c.timer.Stop()
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
	asked := time.Now()
	first, second := s.senders.take(asked)
	var samples map[netip.Addr]senderSample
	ok := true
	if len(first)+len(second) > 0 {
		samples, ok = s.sampleSenders()
	}
	sampled := time.Now()
	looked := map[netip.Addr]secondLook{}
	for a, gen := range first {
		if before, found := samples[a]; found && before.up && before.keepalive > 0 {
			looked[a] = secondLook{before: before, gen: gen}
		}
	}
	s.senders.done(sampled, looked, s.sweepSenders)
	if !ok {
		return // GoBGP stopped or did not answer: the second looks are lost, as a dead sender's would be
	}
	for a, l := range second {
		s.senders.compared.Add(1)
		if after, found := samples[a]; found && senderStopped(l.before, after) {
			s.recreateStopped(a, l.before, after, asked)
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
