package bgp

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	gobgpapi "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
)

// The RIB reader (ribLoop) and the route publisher (routeLoop): the part of
// the speaker that turns GoBGP's RIB into learned routes (ribState).

// Routes implements Speaker.
func (s *speaker) Routes() <-chan []LearnedRoute { return s.routes }

func (s *speaker) markDirty() {
	select {
	case s.dirty <- struct{}{}:
	default:
	}
}

// onBestPath records which prefixes changed; routeLoop reads only those
// from the RIB (see readRIB). GoBGP also sends an event, without paths,
// when only a non-best path changed (an ECMP member); that one costs a
// full read.
func (s *speaker) onBestPath(paths []*apiutil.Path, _ time.Time) {
	s.mu.Lock()
	if len(paths) == 0 {
		s.resyncAll = true
	}
	for _, p := range paths {
		if p == nil || (p.Family != gobgp.RF_IPv4_UC && p.Family != gobgp.RF_IPv6_UC) {
			continue
		}
		if nlri, ok := p.Nlri.(*gobgp.IPAddrPrefix); ok {
			s.changed[nlri.Prefix.Masked()] = true
		}
	}
	s.mu.Unlock()
	s.markDirty()
}

// ribUpdate is one RIB read: the whole RIB (full) or the paths of the
// prefixes in changed (a prefix missing from rib has none left).
type ribUpdate struct {
	full    bool
	rib     map[netip.Prefix][]candidate
	changed map[netip.Prefix]bool
	self    []netip.Addr // see selfAddrs
	bfdGen  uint64       // the BFD generation when the read began
}

// ribLoop reads GoBGP's RIB: after a change only the prefixes GoBGP
// reported (see onBestPath), after session changes, BFD changes and errors
// the whole table, and hands each result to routeLoop. A speaker at rest
// reads nothing but the rare periodic full read (resyncEvery), the repair
// for an event GoBGP would not have sent. Its reads go through GoBGP's
// server loop and may wait seconds while GoBGP resets a session;
// routeLoop does not wait for them.
func (s *speaker) ribLoop(ctx context.Context) {
	resync := time.NewTimer(routesResyncMin)
	defer resync.Stop()
	// stuck fires when a session in OpenSent or OpenConfirm would reach
	// stuckTimeout (see armStuck); it is stopped otherwise.
	stuck := time.NewTimer(time.Hour)
	stuck.Stop()
	defer stuck.Stop()
	full := true
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return
			case <-s.dirty:
				if !s.settle(ctx) {
					return
				}
			case <-resync.C:
				full = true
			case <-stuck.C:
				s.resetStuckPeers(ctx)
				s.armStuck(stuck)
				continue
			}
		}
		s.armStuck(stuck)
		u, changed := s.takeChanges(full)
		var err error
		began := time.Now()
		switch {
		case u.full:
			u.rib, err = s.readRIB(ctx, nil)
		case len(changed) > 0:
			u.changed = changed
			u.rib, err = s.readRIB(ctx, changed)
		}
		// An update without changes still goes to routeLoop: an
		// End-of-RIB may have completed the initial sync.
		if err != nil {
			s.log.Warn("listing BGP routes", "err", err)
			// Read everything next time: a partial read may have failed
			// after GoBGP forgot which prefixes changed.
			s.mu.Lock()
			s.resyncAll = true
			s.mu.Unlock()
			continue
		}
		if u.full {
			resync.Reset(resyncEvery(time.Since(began), countPaths(u.rib)))
		}
		full = false
		select {
		case <-ctx.Done():
			return
		case s.ribUpdates <- u:
		}
	}
}

// takeChanges starts a RIB read: it takes the prefixes reported changed
// since the last read and whether a full read is due (full, or asked for
// by a session or BFD change).
func (s *speaker) takeChanges(full bool) (ribUpdate, map[netip.Prefix]bool) {
	s.mu.Lock()
	// An empty set stays (no allocation at rest) and is not handed out:
	// onBestPath goes on writing to it.
	var changed map[netip.Prefix]bool
	if len(s.changed) > 0 {
		changed, s.changed = s.changed, map[netip.Prefix]bool{}
	}
	full = full || s.resyncAll || s.resyncBFD.Swap(false)
	s.resyncAll = false
	u := ribUpdate{full: full, self: s.selfAddrs()}
	s.mu.Unlock()
	s.bfdMu.Lock()
	u.bfdGen = s.bfdGen
	s.bfdMu.Unlock()
	return u, changed
}

// resyncEvery is the interval of the periodic full RIB read after one
// that took took and found paths paths: routesResyncMin, or longer when a
// read takes more than 1/resyncShare of it, or when the RIB holds more
// than routesResyncMin/resyncPerPath paths (at most routesResyncMax
// apart). The first bound keeps the read's own time a bounded share of the
// speaker's; the second keeps the garbage it leaves (GoBGP copies the
// table for it: ≈ 6 KB a path) from bringing collections of a larger heap
// forward, so that the repair's cost at rest does not grow with the
// cluster (docs/scale.md, "Idle at 1,000").
func resyncEvery(took time.Duration, paths int) time.Duration {
	return min(max(routesResyncMin, took*resyncShare, time.Duration(paths)*resyncPerPath), routesResyncMax)
}

// countPaths is how many paths rib holds.
func countPaths(rib map[netip.Prefix][]candidate) int {
	n := 0
	for _, cs := range rib {
		n += len(cs)
	}
	return n
}

// armStuck sets t to fire when the next session still opening would have
// been opening for stuckTimeout, and stops it when none is opening: an
// idle speaker wakes for nothing.
func (s *speaker) armStuck(t *time.Timer) {
	s.mu.Lock()
	at, ok := s.sessions.nextStuck(stuckTimeout)
	s.mu.Unlock()
	t.Stop()
	if ok {
		// A little after the deadline: stuck() wants strictly longer.
		t.Reset(max(time.Until(at), 0) + stuckSlack)
	}
}

// routeLoop keeps the candidate paths of every prefix (rib) from ribLoop's
// reads, leaves out the paths of BFD peers the watch found silent
// (bfdSkip), and publishes each new route set. It never waits on GoBGP:
// a BFD peer's routes go as soon as the watch sees it silent. A read that
// changed no prefix's paths (the periodic full read of a RIB at rest)
// costs a comparison, not a new selection.
func (s *speaker) routeLoop(ctx context.Context) {
	var last []LearnedRoute
	published, haveRIB := false, false
	rib := map[netip.Prefix][]candidate{}
	var self []netip.Addr
	// After a restart (LocalRestarting) the first set waits for every
	// peer's End-of-RIB (or DeferralTime), so that the agent does not
	// flush kernel routes that peers are about to send again.
	gate := time.NewTimer(DeferralTime)
	defer gate.Stop()
	for {
		changed := true
		select {
		case <-ctx.Done():
			return
		case u := <-s.ribUpdates:
			changed = !slices.Equal(self, u.self)
			self, haveRIB = u.self, true
			if u.full && s.releaseBFDHeld(u.bfdGen) { // bfdSkip changed
				changed = true
			}
			if mergeRIB(rib, u) {
				changed = true
			}
		case <-s.bfdWake:
		case <-gate.C:
		}
		if !haveRIB || (published && !changed) {
			continue
		}
		routes := selectRoutes(rib, self, s.bfdSkip())
		if !published && !s.initialSyncDone() {
			continue
		}
		if published && equalRoutes(last, routes) {
			continue
		}
		last, published = routes, true
		s.log.Debug("publishing learned routes", "routes", len(routes))
		// Latest wins: replace an unread set rather than block.
		select {
		case <-s.routes:
		default:
		}
		s.routes <- routes
	}
}

// mergeRIB applies one read to rib: a full read replaces it, a partial
// one replaces the paths of the prefixes it covers (a prefix it covers
// but did not find has none left). It reports whether any prefix's paths
// changed.
func mergeRIB(rib map[netip.Prefix][]candidate, u ribUpdate) bool {
	changed := false
	set := func(p netip.Prefix, c []candidate, ok bool) {
		old, had := rib[p]
		switch {
		case !ok && had:
			delete(rib, p)
			changed = true
		case ok && (!had || !slices.Equal(old, c)):
			rib[p] = c
			changed = true
		}
	}
	if !u.full {
		for p := range u.changed {
			c, ok := u.rib[p]
			set(p, c, ok)
		}
		return changed
	}
	for p := range rib {
		if _, ok := u.rib[p]; !ok {
			set(p, nil, false)
		}
	}
	for p, c := range u.rib {
		set(p, c, true)
	}
	return changed
}

// settle waits for a burst of RIB changes to end (see routesQuiet). It
// returns false when ctx is done.
func (s *speaker) settle(ctx context.Context) bool {
	quiet := time.NewTimer(routesQuiet)
	defer quiet.Stop()
	limit := time.NewTimer(routesMaxDelay)
	defer limit.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-s.dirty:
			quiet.Reset(routesQuiet)
		case <-quiet.C:
			return true
		case <-limit.C:
			return true
		}
	}
}

func (s *speaker) initialSyncDone() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.cfg.LocalRestarting || time.Since(s.startedAt) >= DeferralTime {
		return true
	}
	if !s.peersSet {
		return false
	}
	for a := range s.peers {
		if !s.sessions.eor[a] {
			return false
		}
	}
	return true
}

// selfAddrs lists our own addresses: paths with one of them as next hop
// are never learned routes. Called with s.mu held.
func (s *speaker) selfAddrs() []netip.Addr {
	self := []netip.Addr{s.cfg.RouterID}
	if s.cfg.RouterID6.IsValid() {
		self = append(self, s.cfg.RouterID6)
	}
	if s.cfg.ListenAddr.IsValid() {
		self = append(self, s.cfg.ListenAddr)
	}
	for _, p := range s.peers {
		if p.LocalAddress.IsValid() && !slices.Contains(self, p.LocalAddress) {
			self = append(self, p.LocalAddress)
		}
	}
	return self
}

// learnedRoutes reads the whole global RIB and selects the routes to
// report. Tests use it to look at the RIB directly.
func (s *speaker) learnedRoutes() ([]LearnedRoute, error) {
	rib, err := s.readRIB(context.Background(), nil)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	self := s.selfAddrs()
	s.mu.Unlock()
	return selectRoutes(rib, self, nil), nil
}

// readRIB returns the candidate paths of the given prefixes (all prefixes
// when only is nil) from GoBGP's global RIB.
//
// GoBGP races here (v4.8.0 and v4.9.0; osrg/gobgp PR #3658 is in neither): ListPath
// converts the paths after its table snapshot, outside GoBGP's lock, and
// reads each path's stale flag, which a session going down under graceful
// restart writes from another goroutine (table.Path.MarkStale). We cannot
// take GoBGP's lock, so we keep the exposure small and ordered instead:
//   - after a change we read only the prefixes GoBGP reported changing
//     (onBestPath), not the whole table; the full read runs only at start,
//     at the periodic resync and after errors;
//   - right after each read we pass a no-op management call through
//     GoBGP's server loop (GetBgp): it takes GoBGP's write lock, which
//     waits for every session goroutine holding the read lock and is
//     taken before any later one, so our reads happen before every later
//     stale-flag write. Only a session going down at the very instant of a
//     read can still overlap it (a one-byte flag, no torn values);
//     upstream's fix makes the flag atomic.
//
// Our own soft resets in (applyPolicy) race with ListPath the same way (a
// path's local ID); those we do keep apart, under softResetMu.
//
// SetAdvertisements no longer reads the RIB at all (see advertiser).
func (s *speaker) readRIB(ctx context.Context, only map[netip.Prefix]bool) (map[netip.Prefix][]candidate, error) {
	s.mu.Lock()
	srv, asn := s.srv, s.cfg.ASN
	bfdPeers := map[netip.Addr]bool{}
	for a, p := range s.peers {
		if p.BFD != nil {
			bfdPeers[a] = true
		}
	}
	mayLimit := limitCandidates(s.peers)
	s.mu.Unlock()
	var reqs []apiutil.ListPathRequest
	for _, f := range s.families() {
		req := apiutil.ListPathRequest{TableType: gobgpapi.TableType_TABLE_TYPE_GLOBAL, Family: f}
		if only != nil {
			for p := range only {
				if p.Addr().Is4() == (f == gobgp.RF_IPv4_UC) {
					req.Prefixes = append(req.Prefixes, &apiutil.LookupPrefix{Prefix: p.String(), LookupOption: apiutil.LOOKUP_EXACT})
				}
			}
			if len(req.Prefixes) == 0 {
				continue // an empty list would read the whole table
			}
		}
		reqs = append(reqs, req)
	}
	// GoBGP (v4.8.0 and v4.9.0) keeps the paths of a session it closed itself as
	// graceful-restart stale when the connection's read fails before the
	// reason is accounted (fsm.go takes a read failure for a peer
	// restart): a peer shut down for exceeding its max-prefix limit, or
	// one whose BFD session detected a dead path, would keep its routes for
	// the restart time. Their paths never count: a flooding peer's routes
	// go at once, and with BFD a lost session withdraws its routes at once
	// (BFD is there to fail over fast; graceful restart does not hold
	// them, see docs/bgp.md).
	limited, err := limitedPeers(ctx, srv, bfdPeers, mayLimit)
	if err != nil {
		return nil, err
	}
	rib := map[netip.Prefix][]candidate{}
	// ListPath reads the route-selection variables that another server's
	// StartBgp writes (see servers).
	servers.RLock()
	s.softResetMu.RLock()
	for _, req := range reqs {
		err = srv.ListPath(req, func(_ gobgp.NLRI, paths []*apiutil.Path) {
			for _, p := range paths {
				if limited[p.PeerAddress] {
					continue
				}
				if prefix, c, ok := candidateFromPath(p, asn); ok && (only == nil || only[prefix]) {
					rib[prefix] = append(rib[prefix], c)
				}
			}
		})
		if err != nil {
			break
		}
	}
	s.softResetMu.RUnlock()
	servers.RUnlock()
	// The barrier described above; run it whatever ListPath returned.
	if _, berr := srv.GetBgp(ctx, &gobgpapi.GetBgpRequest{}); berr != nil && err == nil {
		err = fmt.Errorf("synchronising with the BGP server: %w", berr)
	}
	if err != nil {
		return nil, err
	}
	return rib, nil
}

// listEach is the most peers limitedPeers asks GoBGP about one by one;
// with more it lists them all at once.
const listEach = 16

// limitedPeers returns the peers among candidates whose paths must not
// count (see readRIB): shut down for exceeding their max-prefix limit, or
// running BFD (bfdPeers, our configuration) without both sessions up. Only
// a peer with a prefix limit or BFD can be one, so candidates lists just
// those, and a speaker without any (a reflector's cluster clients) asks
// GoBGP nothing. GoBGP's ListPeer is a management call: it holds the
// server's write lock, which stops every session's UPDATE handling, while it
// counts each listed peer's Adj-RIB-In (2,048 table shards a peer, locked
// one by one). Listing all peers on every RIB read took 17 % of a
// reflector's CPU with 300 clients (docs/scale.md).
func limitedPeers(ctx context.Context, srv *server.BgpServer, bfdPeers map[netip.Addr]bool, candidates []netip.Addr) (map[netip.Addr]bool, error) {
	limited := map[netip.Addr]bool{}
	check := func(p *gobgpapi.Peer) {
		if p.Conf == nil || p.State == nil {
			return
		}
		a, err := netip.ParseAddr(p.Conf.NeighborAddress)
		if err != nil {
			return
		}
		pfx := p.State.AdminState == gobgpapi.PeerState_ADMIN_STATE_PFX_CT
		// GoBGP's answer omits the BFD settings of a session it reset:
		// our own configuration says whether the peer runs BFD. The BGP
		// session outlives a dead path by seconds (GoBGP's reset waits on
		// the dead connection), the BFD session does not.
		bfdDown := (bfdPeers[a] || p.GetBfd().GetEnabled()) &&
			(p.State.SessionState != gobgpapi.PeerState_SESSION_STATE_ESTABLISHED ||
				p.State.GetBfdState().GetSessionState() != gobgpapi.BfdSessionState_BFD_SESSION_STATE_UP)
		if pfx || bfdDown {
			limited[a] = true
		}
	}
	for _, req := range peerListRequests(candidates) {
		if err := srv.ListPeer(ctx, req, check); err != nil {
			return nil, fmt.Errorf("listing BGP peers: %w", err)
		}
	}
	return limited, nil
}

// limitCandidates are the peers whose paths a RIB read may have to leave
// out (see limitedPeers): those with a prefix limit or BFD, sorted.
func limitCandidates(peers map[netip.Addr]Peer) []netip.Addr {
	var out []netip.Addr
	for a, p := range peers {
		if p.BFD != nil || maxPrefixes(p) > 0 {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// peerListRequests are the ListPeer calls that cover candidates: none for
// none, one per peer for a few, one for all of them beyond listEach.
func peerListRequests(candidates []netip.Addr) []*gobgpapi.ListPeerRequest {
	if len(candidates) > listEach {
		return []*gobgpapi.ListPeerRequest{{}}
	}
	var reqs []*gobgpapi.ListPeerRequest
	for _, a := range candidates {
		reqs = append(reqs, &gobgpapi.ListPeerRequest{Address: a.String()})
	}
	return reqs
}
