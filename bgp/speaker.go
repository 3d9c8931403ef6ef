package bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	gobgpapi "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/config/oc"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"

	"github.com/tabbynet/tabby/bgp/session"
)

// Timer defaults, tuned for a cluster network where establishment and
// convergence should take seconds, not minutes.
const (
	// DefaultHold is the hold time of a Peer without one: a dead peer is
	// noticed within 9 s (then graceful restart keeps its routes, as stale,
	// for its restart time).
	DefaultHold = 9 * time.Second
	// DefaultKeepalive is the keepalive interval of a Peer without one.
	DefaultKeepalive = 3 * time.Second
	// DefaultRestartTime is the graceful-restart time announced when
	// neither Config nor Peer set one (Calico's default too).
	DefaultRestartTime = 120 * time.Second
	// ConnectRetry is the interval between connection attempts (GoBGP's
	// default is 120 s, which makes a late peer wait minutes).
	ConnectRetry = 2 * time.Second
	// DeferralTime bounds how long a restarting speaker waits for its peers'
	// End-of-RIB before advertising, and how long Routes waits for the
	// first End-of-RIB from every peer before delivering its first set.
	DeferralTime = 10 * time.Second
	// A change to the RIB is turned into a route set once no further
	// change has come for routesQuiet (GoBGP applies one UPDATE as several
	// events), but no later than routesMaxDelay after the first change.
	routesQuiet    = 5 * time.Millisecond
	routesMaxDelay = 50 * time.Millisecond
	// routesResync recomputes the route set even without events.
	routesResync = 10 * time.Second
	// stuckTimeout and stuckCheck: see resetStuckPeers.
	stuckTimeout = 5 * time.Second
	stuckCheck   = time.Second
)

// speaker implements Speaker over an embedded GoBGP server. GoBGP is itself
// safe for concurrent use; mu serialises our reconcile calls and guards our
// view of what is configured. Its fields come in parts, one per concern:
//   - lifecycle: the GoBGP server, its configuration and identity, start
//     and stop (speaker.go);
//   - the configured peers and the sessionTracker that follows their
//     sessions from GoBGP's events (peers.go, sessions.go);
//   - the advertiser: the paths we originate (advertiser.go);
//   - policyState: the import and export policies (policy.go);
//   - ribState: reading GoBGP's RIB and publishing learned routes
//     (speaker.go, routes.go);
//   - bfdState: the BFD watch (bfd.go), under its own lock.
type speaker struct {
	log *slog.Logger

	mu sync.Mutex
	lifecycle
	peers    map[netip.Addr]Peer
	peersSet bool // SetPeers has been called at least once
	sessions sessionTracker
	adv      advertiser
	policyState
	ribState
	bfdState
}

// lifecycle is the speaker's GoBGP server and identity; mu guards it
// (muteGoBGP is atomic).
type lifecycle struct {
	srv       *server.BgpServer
	cfg       Config
	startedAt time.Time
	stopped   bool
	cancel    context.CancelFunc
	done      chan struct{}
	muteGoBGP atomic.Bool
}

// ribState is what the RIB reader and the route publisher share. mu
// guards changed and resyncAll; the channels need no lock.
type ribState struct {
	routes chan []LearnedRoute
	dirty  chan struct{}
	// changed collects the prefixes GoBGP reported in best-path events
	// since routeLoop last read them; resyncAll asks for a full read.
	changed   map[netip.Prefix]bool
	resyncAll bool
	// ribUpdates carries the RIB reader's results to the publisher.
	ribUpdates chan ribUpdate
}

// bfdState: the BFD watch (bfd.go) and the route publisher share these
// under bfdMu, never under mu: SetPeers holds mu across GoBGP management
// calls, which can wait seconds while GoBGP resets a session.
type bfdState struct {
	bfdMu   sync.Mutex
	bfdCfg  map[netip.Addr]BFD    // effective timers of the peers running BFD
	bfdDown map[netip.Addr]bool   // silent, per the watch
	bfdHeld map[netip.Addr]uint64 // back from silence at that generation, see releaseBFDHeld
	bfdGen  uint64
	bfdWake chan struct{}
	// resyncBFD asks the RIB reader for a full read (set by the watch).
	resyncBFD atomic.Bool
}

// policyState is the input of the policies and what is installed; mu
// guards it. See SetPolicy and applyPolicy.
type policyState struct {
	pools         []netip.Prefix
	communities   []PrefixCommunities
	aggregates    []Aggregate
	staticExport  []string                     // export policies installed at Start, before the dynamic one
	lastPolicy    *gobgpapi.SetPoliciesRequest // built without name prefix, for comparison
	lastInstalled *gobgpapi.SetPoliciesRequest
	policyGen     int
}

// NewSpeaker returns a Speaker backed by an in-process GoBGP server. log may
// be nil; GoBGP's own messages go to it at Warn level and above.
func NewSpeaker(log *slog.Logger) Speaker {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &speaker{
		log:      log,
		peers:    map[netip.Addr]Peer{},
		sessions: newSessionTracker(),
		adv:      advertiser{originated: map[netip.Prefix]Advertisement{}},
		ribState: ribState{
			routes:     make(chan []LearnedRoute, 1),
			dirty:      make(chan struct{}, 1),
			changed:    map[netip.Prefix]bool{},
			ribUpdates: make(chan ribUpdate),
		},
		bfdState: bfdState{
			bfdHeld: map[netip.Addr]uint64{},
			bfdWake: make(chan struct{}, 1),
		},
	}
}

func (c Config) validate() error {
	var errs []error
	if !c.RouterID.Is4() {
		errs = append(errs, fmt.Errorf("router ID %v is not an IPv4 address", c.RouterID))
	}
	if c.ASN == 0 {
		errs = append(errs, errors.New("ASN must not be 0"))
	}
	if c.RouterID6.IsValid() && (!c.RouterID6.Is6() || c.RouterID6.Is4In6() || !c.RouterID6.IsGlobalUnicast() || c.RouterID6.Zone() != "") {
		errs = append(errs, fmt.Errorf("IPv6 router address %v is not a global IPv6 unicast address", c.RouterID6))
	}
	if c.Subnet6.IsValid() && (!c.RouterID6.IsValid() || !c.Subnet6.Addr().Is6() || c.Subnet6.Addr().Is4In6()) {
		errs = append(errs, fmt.Errorf("IPv6 subnet %v needs an IPv6 router address and must be IPv6", c.Subnet6))
	}
	if c.ListenAddr.IsValid() && !c.ListenAddr.Is4() {
		errs = append(errs, fmt.Errorf("listen address %v is not an IPv4 address", c.ListenAddr))
	}
	if c.ListenPort < -1 || c.ListenPort > 65535 {
		errs = append(errs, fmt.Errorf("listen port %d out of range", c.ListenPort))
	}
	if c.ClusterID != "" {
		if a, err := netip.ParseAddr(c.ClusterID); err != nil || !a.Is4() {
			errs = append(errs, fmt.Errorf("cluster ID %q is not a dotted IPv4 address", c.ClusterID))
		}
	}
	if c.RestartTime < 0 || c.RestartTime > 4095*time.Second {
		errs = append(errs, fmt.Errorf("restart time %v out of range 0..4095s", c.RestartTime))
	}
	if c.APIListen != "" {
		if err := checkLoopback(c.APIListen); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkLoopback accepts host:port where host is a loopback IP or localhost.
func checkLoopback(hostport string) error {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return fmt.Errorf("API listen address %q: %w", hostport, err)
	}
	if host == "localhost" {
		return nil
	}
	a, err := netip.ParseAddr(host)
	if err != nil || !a.IsLoopback() {
		return fmt.Errorf("API listen address %q is not a loopback address", hostport)
	}
	return nil
}

// Start implements Speaker. ctx bounds the start-up only; the speaker runs
// until Stop.
func (s *speaker) Start(ctx context.Context, cfg Config) error {
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("invalid speaker config: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil || s.stopped {
		return errors.New("speaker already started")
	}

	var opts []server.ServerOption
	opts = append(opts, server.LoggerOption(slog.New(minLevel{s.log.Handler(), gobgpLogLevel, &s.muteGoBGP}), nil))
	if cfg.APIListen != "" {
		// GoBGP only logs a failure to listen; find out now instead.
		l, err := net.Listen("tcp", cfg.APIListen)
		if err != nil {
			return fmt.Errorf("checking API listen address: %w", err)
		}
		if err := l.Close(); err != nil {
			return fmt.Errorf("checking API listen address: %w", err)
		}
		opts = append(opts, server.GrpcListenAddress(cfg.APIListen))
	}
	srv := server.NewBgpServer(opts...)
	go srv.Serve()

	listen := cfg.ListenAddr
	if !listen.IsValid() {
		listen = netip.IPv4Unspecified()
	}
	global := &gobgpapi.Global{
		Asn:             cfg.ASN,
		RouterId:        cfg.RouterID.String(),
		ListenPort:      cfg.ListenPort,
		ListenAddresses: []string{listen.String()},
		Families:        []uint32{uint32(oc.AfiSafiTypeToIntMap[oc.AFI_SAFI_TYPE_IPV4_UNICAST])},
	}
	if cfg.RouterID6.IsValid() {
		global.Families = append(global.Families, uint32(oc.AfiSafiTypeToIntMap[oc.AFI_SAFI_TYPE_IPV6_UNICAST]))
	}
	if cfg.ListenPort == 0 {
		global.ListenPort = gobgp.BGP_PORT
	}
	if err := startBgp(ctx, srv, global); err != nil {
		srv.Stop()
		return fmt.Errorf("starting BGP: %w", err)
	}
	s.srv, s.cfg = srv, cfg
	static, err := installExport(ctx, srv, cfg.Subnet, cfg.Subnet6)
	s.staticExport = static
	if err == nil {
		err = s.applyPolicy(ctx, nil)
	}
	if err != nil {
		s.srv = nil
		forgetServer(srv)
		srv.Stop()
		return fmt.Errorf("configuring BGP policy: %w", err)
	}

	runCtx, cancel := context.WithCancel(context.Background())
	// GoBGP sends a best-path event after every change to the global RIB
	// (also when only a non-best path changed), after the change; its
	// update events come before the RIB changes, so they are not watched.
	err = srv.WatchEvent(runCtx, server.WatchEventMessageCallbacks{
		OnBestPath:   s.onBestPath,
		OnPathEor:    s.onEOR,
		OnPeerUpdate: s.onPeerEvent,
	}, server.WatchBestPath(false), server.WatchEor(false), server.WatchPeer())
	if err != nil {
		cancel()
		s.srv = nil
		forgetServer(srv)
		srv.Stop()
		return fmt.Errorf("watching BGP events: %w", err)
	}

	s.srv, s.cfg, s.startedAt = srv, cfg, time.Now()
	s.cancel, s.done = cancel, make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); s.ribLoop(runCtx) }()
	go func() { defer wg.Done(); s.routeLoop(runCtx) }()
	go func() { defer wg.Done(); s.bfdLoop(runCtx, srv) }()
	go func() { wg.Wait(); close(s.done) }()
	return nil
}

// Stop implements Speaker.
func (s *speaker) Stop(graceful bool) error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	srv, cancel, done := s.srv, s.cancel, s.done
	s.mu.Unlock()
	if srv == nil {
		close(s.routes)
		return nil
	}
	if !graceful {
		s.withdrawAll(srv)
	}
	cancel()
	<-done
	close(s.routes)
	forgetServer(srv)
	// With AllowGracefulRestart, GoBGP closes the sessions of peers that
	// negotiated graceful restart without a NOTIFICATION; they see the TCP
	// session drop and keep our routes as stale for the restart time.
	err := srv.StopBgp(context.Background(), &gobgpapi.StopBgpRequest{AllowGracefulRestart: graceful})
	// Stop also shuts down the gRPC API and BFD; its own StopBgp call then
	// finds the server stopped, which it only logs.
	s.muteGoBGP.Store(true)
	srv.Stop()
	if err != nil {
		return fmt.Errorf("stopping BGP: %w", err)
	}
	return nil
}

// hardStopWait bounds how long a hard stop waits for its withdrawals to
// leave.
const hardStopWait = 3 * time.Second

// withdrawAll withdraws every path this speaker originated and waits,
// bounded, until no established peer's Adj-RIB-Out holds one. A hard stop
// then does not depend on how a peer reads the session's end: GoBGP v4.8.0
// sometimes closes the connection before the peer has read the Cease, and a
// peer that negotiated graceful restart then keeps our routes as stale for
// the restart time.
func (s *speaker) withdrawAll(srv *server.BgpServer) {
	s.mu.Lock()
	var del []*apiutil.Path
	for _, a := range s.adv.originated {
		if path, err := s.localPath(a, true); err == nil {
			del = append(del, path)
		}
	}
	s.mu.Unlock()
	if len(del) == 0 {
		return
	}
	if err := srv.DeletePath(apiutil.DeletePathRequest{Paths: del}); err != nil {
		s.log.Warn("hard stop: withdrawing our paths", "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), hardStopWait)
	defer cancel()
	for {
		pending := 0
		var peers []string
		_ = srv.ListPeer(ctx, &gobgpapi.ListPeerRequest{}, func(p *gobgpapi.Peer) {
			if p.Conf != nil && p.State != nil && p.State.SessionState == gobgpapi.PeerState_SESSION_STATE_ESTABLISHED {
				peers = append(peers, p.Conf.NeighborAddress)
			}
		})
		for _, peer := range peers {
			for _, f := range s.families() {
				_ = srv.ListPath(apiutil.ListPathRequest{TableType: gobgpapi.TableType_TABLE_TYPE_ADJ_OUT, Name: peer, Family: f},
					func(_ gobgp.NLRI, paths []*apiutil.Path) {
						for _, p := range paths {
							if p != nil && !p.Withdrawal {
								pending++
							}
						}
					})
			}
		}
		if pending == 0 {
			return
		}
		select {
		case <-ctx.Done():
			s.log.Warn("hard stop: withdrawals still queued", "paths", pending)
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

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
// reported (see onBestPath), periodically and after session changes the
// whole table, and hands each result to routeLoop. Its reads go through
// GoBGP's server loop and may wait seconds while GoBGP resets a session;
// routeLoop does not wait for them.
func (s *speaker) ribLoop(ctx context.Context) {
	resync := time.NewTicker(routesResync)
	defer resync.Stop()
	stuck := time.NewTicker(stuckCheck)
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
				continue
			}
		}
		s.mu.Lock()
		changed := s.changed
		s.changed = map[netip.Prefix]bool{}
		full = full || s.resyncAll || s.resyncBFD.Swap(false)
		s.resyncAll = false
		u := ribUpdate{full: full, self: s.selfAddrs()}
		s.mu.Unlock()
		s.bfdMu.Lock()
		u.bfdGen = s.bfdGen
		s.bfdMu.Unlock()
		var err error
		switch {
		case full:
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
		full = false
		select {
		case <-ctx.Done():
			return
		case s.ribUpdates <- u:
		}
	}
}

// routeLoop keeps the candidate paths of every prefix (rib) from ribLoop's
// reads, leaves out the paths of BFD peers the watch found silent
// (bfdSkip), and publishes each new route set. It never waits on GoBGP:
// a BFD peer's routes go as soon as the watch sees it silent.
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
		select {
		case <-ctx.Done():
			return
		case u := <-s.ribUpdates:
			self, haveRIB = u.self, true
			if u.full {
				rib = u.rib
				s.releaseBFDHeld(u.bfdGen)
			} else {
				for p := range u.changed {
					if c, ok := u.rib[p]; ok {
						rib[p] = c
					} else {
						delete(rib, p)
					}
				}
			}
		case <-s.bfdWake:
		case <-gate.C:
		}
		if !haveRIB {
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
// GoBGP v4.8.0 races here (osrg/gobgp PR #3658, not released): ListPath
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
	// GoBGP v4.8.0 keeps the paths of a session it closed itself as
	// graceful-restart stale when the connection's read fails before the
	// reason is accounted (fsm.go takes a read failure for a peer
	// restart): a peer shut down for exceeding its max-prefix limit, or
	// one whose BFD session detected a dead path, would keep its routes for
	// the restart time. Their paths never count: a flooding peer's routes
	// go at once, and with BFD a lost session withdraws its routes at once
	// (BFD is there to fail over fast; graceful restart does not hold
	// them, see docs/bgp.md).
	limited := map[netip.Addr]bool{}
	if err := srv.ListPeer(ctx, &gobgpapi.ListPeerRequest{}, func(p *gobgpapi.Peer) {
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
	}); err != nil {
		return nil, fmt.Errorf("listing BGP peers: %w", err)
	}
	rib := map[netip.Prefix][]candidate{}
	// ListPath reads the route-selection variables that another server's
	// StartBgp writes (see servers).
	var err error
	servers.RLock()
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

// servers lists the GoBGP servers running in this process.
//
// GoBGP's StartBgp writes package-level variables (the route-selection
// options and the multipath switch) that the session goroutines of every
// server in the process read while they process updates. With one speaker
// per process (the agent) that is harmless; with several (tests, a lab in
// one process) it is a data race. startBgp serialises starts and passes a
// no-op management call through every other running server before and
// after the write: GoBGP runs management calls under its server-wide lock,
// which orders them with every session goroutine's work (see readRIB).
// ListPath reads the same variables outside GoBGP's lock, so readRIB holds
// the read lock around it.
var servers struct {
	sync.RWMutex
	running map[*server.BgpServer]bool
}

func startBgp(ctx context.Context, srv *server.BgpServer, global *gobgpapi.Global) error {
	servers.Lock()
	defer servers.Unlock()
	barrier := func() {
		for other := range servers.running {
			// A stopped server fails the call; there is nothing to order.
			_, _ = other.GetBgp(ctx, &gobgpapi.GetBgpRequest{})
		}
	}
	barrier()
	if err := srv.StartBgp(ctx, &gobgpapi.StartBgpRequest{Global: global}); err != nil {
		return err
	}
	barrier()
	if servers.running == nil {
		servers.running = map[*server.BgpServer]bool{}
	}
	servers.running[srv] = true
	return nil
}

// families are the address families the speaker carries.
func (s *speaker) families() []gobgp.Family {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg.RouterID6.IsValid() {
		return []gobgp.Family{gobgp.RF_IPv4_UC, gobgp.RF_IPv6_UC}
	}
	return []gobgp.Family{gobgp.RF_IPv4_UC}
}

func forgetServer(srv *server.BgpServer) {
	servers.Lock()
	delete(servers.running, srv)
	servers.Unlock()
}

// gobgpLogLevel is the least severe GoBGP message passed on to our logger.
var gobgpLogLevel = slog.LevelWarn

// minLevel drops records below a level before they reach the handler; it
// keeps GoBGP's chatty Info logs out of ours.
// Setting mute drops everything: after our own StopBgp, GoBGP's Stop logs
// a spurious error about the server being stopped already.
type minLevel struct {
	slog.Handler
	min  slog.Level
	mute *atomic.Bool
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && !h.mute.Load() && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(attrs), h.min, h.mute}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.min, h.mute}
}
