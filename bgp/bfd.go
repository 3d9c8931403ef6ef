package bgp

import (
	"context"
	"maps"
	"net/netip"
	"time"

	gobgpapi "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/server"
)

// Our own view of the BFD sessions, read without waiting on GoBGP.
//
// GoBGP's BFD peer (v4.8.0; v4.9.0 did not change it), when its detection time expires, first resets
// the BGP session through GoBGP's management channel and only then marks
// itself Down; the reset (and with it every management call: ListPeer,
// the RIB listing) completes only seconds later, once GoBGP's FSM is done
// with the dead connection (5–6 s in the BIRD lab). GoBGP publishes no BFD
// event either. What it does offer without its server loop is
// BgpServer.ListBfdPeer: the BFD peers' states and packet counters, read
// under the BFD server's own lock. The watch samples those every
// bfdProbeEvery and calls a peer silent as soon as its received-packet
// counter has not moved for the detection time (or GoBGP says the session
// is not Up); the route publisher then drops that peer's paths at once.

// bfdProbeEvery is how often the watch samples GoBGP's BFD counters while
// some peer runs BFD; while none does it sleeps until setBFDPeers wakes it.
const bfdProbeEvery = 50 * time.Millisecond

// bfdSample is one peer's BFD session as GoBGP reports it.
type bfdSample struct {
	state gobgpapi.BfdSessionState
	rx    uint64 // BFD packets received
}

// bfdTrack is what the watch remembers of one peer.
type bfdTrack struct {
	up      bool
	rx      uint64
	lastRx  time.Time // when rx was last seen to move (or the session to come up)
	runFrom time.Time // start of the current run of packets, for the packet period
	runRx   uint64
}

// bfdWatch decides which BFD peers are silent from successive samples. It
// is pure (the caller passes the time), so it is tested without clocks.
type bfdWatch struct {
	peers map[netip.Addr]*bfdTrack
}

// detection is how long a peer may stay without a BFD packet: its
// multiplier times its interval, or, when its packets have been arriving
// clearly slower than that (a peer transmitting slower than our interval:
// the negotiated rate is its), times that period plus a quarter for
// jitter, so that such a peer is not called silent before GoBGP's own
// detection would.
func (t *bfdTrack) detection(cfg BFD) time.Duration {
	period := cfg.Interval
	if n := t.rx - t.runRx; n >= 3 {
		if est := t.lastRx.Sub(t.runFrom) / time.Duration(n); est > period*5/4 {
			period = est * 5 / 4
		}
	}
	return time.Duration(cfg.Multiplier) * period
}

// observe takes the samples read at now for the peers running BFD (cfg,
// with effective timers) and returns the peers to treat as down: GoBGP's
// session is not Up, GoBGP has no BFD session for the peer, or no packet
// arrived for the detection time.
func (w *bfdWatch) observe(now time.Time, cfg map[netip.Addr]BFD, samples map[netip.Addr]bfdSample) map[netip.Addr]bool {
	if w.peers == nil {
		w.peers = map[netip.Addr]*bfdTrack{}
	}
	down := map[netip.Addr]bool{}
	for a := range w.peers {
		if _, ok := cfg[a]; !ok {
			delete(w.peers, a)
		}
	}
	for a, c := range cfg {
		s, ok := samples[a]
		t := w.peers[a]
		if !ok || s.state != gobgpapi.BfdSessionState_BFD_SESSION_STATE_UP {
			delete(w.peers, a)
			down[a] = true
			continue
		}
		if t == nil || !t.up {
			// Just came up: the packet that brought it up counts.
			w.peers[a] = &bfdTrack{up: true, rx: s.rx, lastRx: now, runFrom: now, runRx: s.rx}
			continue
		}
		if s.rx != t.rx {
			if s.rx < t.rx { // GoBGP re-created the session
				t.runFrom, t.runRx = now, s.rx
			}
			t.rx, t.lastRx = s.rx, now
			continue
		}
		if now.Sub(t.lastRx) >= t.detection(c) {
			down[a] = true
		}
	}
	return down
}

// bfdLoop samples GoBGP's BFD sessions (see the comment at the top) and
// publishes which peers are silent. A change of that set wakes the route
// publisher at once and asks the RIB reader for a full read; so does any
// change of GoBGP's own BFD states (readRIB then drops the peers GoBGP
// has reset).
func (s *speaker) bfdLoop(ctx context.Context, srv *server.BgpServer) {
	t := time.NewTicker(bfdProbeEvery)
	defer t.Stop()
	var w bfdWatch
	var lastStates map[netip.Addr]gobgpapi.BfdSessionState
	for idle := false; ; {
		if idle {
			t.Stop()
			select {
			case <-ctx.Done():
				return
			case <-s.bfdCfgWake:
			}
			t.Reset(bfdProbeEvery)
		} else {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-s.bfdCfgWake:
			}
		}
		s.bfdMu.Lock()
		cfg := maps.Clone(s.bfdCfg)
		s.bfdMu.Unlock()
		// Without BFD peers this pass settles their absence (a peer that
		// just stopped running BFD is no longer silent), then the loop
		// sleeps until the configuration changes.
		idle = len(cfg) == 0
		samples := map[netip.Addr]bfdSample{}
		states := map[netip.Addr]gobgpapi.BfdSessionState{}
		if len(cfg) > 0 {
			srv.ListBfdPeer(ctx, func(addr string, st *gobgpapi.BfdPeerState) {
				a, err := netip.ParseAddr(addr)
				if err != nil || st == nil {
					return
				}
				samples[a] = bfdSample{state: st.SessionState, rx: st.GetBfdAsync().GetReceivedPackets()}
				states[a] = st.SessionState
			})
		}
		down := w.observe(time.Now(), cfg, samples)
		resync := !maps.Equal(states, lastStates)
		lastStates = states

		s.bfdMu.Lock()
		s.bfdStates = states
		changed := !maps.Equal(down, s.bfdDown)
		if changed {
			for a := range s.bfdDown {
				if !down[a] {
					// Back: its paths count again only after a RIB read
					// that began after now (the cached ones may be from
					// before GoBGP reset the session).
					s.bfdGen++
					s.bfdHeld[a] = s.bfdGen
				}
			}
			for a := range down {
				if !s.bfdDown[a] {
					s.log.Info("BFD peer silent; withdrawing its routes", "peer", a)
				}
			}
			s.bfdDown = down
		}
		s.bfdMu.Unlock()
		if changed {
			select {
			case s.bfdWake <- struct{}{}:
			default:
			}
		}
		if changed || resync {
			s.resyncBFD.Store(true)
			s.markDirty()
			s.sessions.notify() // Sessions reports the BFD states
		}
	}
}

// setBFDPeers records which peers run BFD, with their effective timers.
func (s *speaker) setBFDPeers(peers map[netip.Addr]Peer) {
	cfg := map[netip.Addr]BFD{}
	for a, p := range peers {
		if p.BFD != nil {
			cfg[a] = bfdTimers(p)
		}
	}
	s.bfdMu.Lock()
	defer s.bfdMu.Unlock()
	s.bfdCfg = cfg
	for a := range s.bfdHeld {
		if _, ok := cfg[a]; !ok {
			delete(s.bfdHeld, a)
		}
	}
	select {
	case s.bfdCfgWake <- struct{}{}:
	default:
	}
}

// bfdSkip returns the peers whose paths the publisher leaves out: silent
// ones and ones back from silence that no RIB read has confirmed yet.
func (s *speaker) bfdSkip() map[netip.Addr]bool {
	s.bfdMu.Lock()
	defer s.bfdMu.Unlock()
	if len(s.bfdDown) == 0 && len(s.bfdHeld) == 0 {
		return nil
	}
	skip := map[netip.Addr]bool{}
	for a := range s.bfdDown {
		skip[a] = true
	}
	for a := range s.bfdHeld {
		skip[a] = true
	}
	return skip
}

// releaseBFDHeld ends the hold of peers that came back before a full RIB
// read that started at generation gen; it reports whether it ended any.
func (s *speaker) releaseBFDHeld(gen uint64) bool {
	s.bfdMu.Lock()
	defer s.bfdMu.Unlock()
	released := false
	for a, g := range s.bfdHeld {
		if g <= gen {
			delete(s.bfdHeld, a)
			released = true
		}
	}
	return released
}
