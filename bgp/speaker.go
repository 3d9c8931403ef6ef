package bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	gobgpapi "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/config/oc"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
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
	// DefaultReflectorHold and DefaultReflectorKeepalive replace them on
	// the sessions between a route reflector and its clients (PeerRR,
	// PeerRRClient): RFC 4271's suggested hold time, GoBGP's default.
	// A reflector with hundreds of clients on a loaded host stalls for
	// seconds at times, and with 9 s its sessions expired by the hundred
	// (docs/scale.md); a reflector passes on the originator's next hop, so
	// a client loses nothing by noticing a silent reflector later (graceful
	// restart keeps its routes stale for the restart time after that
	// anyway). Set BFD on the sessions to notice it in a second.
	DefaultReflectorHold      = 90 * time.Second
	DefaultReflectorKeepalive = 30 * time.Second
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
	// The RIB is read in full, without any event, every routesResyncMin,
	// or every resyncShare times as long as the last full read took when
	// that is longer, or resyncPerPath per path of the RIB when that is
	// longer (at most routesResyncMax): GoBGP's best-path events
	// deliver every change, and session, BFD and End-of-RIB events ask
	// for full reads of their own, so the periodic read is only a repair
	// (see resyncEvery). At 10 s it was the largest part of an idle
	// client's CPU at 1,000 nodes (docs/scale.md).
	routesResyncMin = 2 * time.Minute
	routesResyncMax = 15 * time.Minute
	resyncShare     = 2000
	resyncPerPath   = 300 * time.Millisecond // 400 paths: 2 min; 2,000 (1,000 nodes, two reflectors): 10
	// stuckTimeout: see resetStuckPeers; the check runs stuckSlack after
	// a session opening since then would have reached it.
	stuckTimeout = 5 * time.Second
	stuckSlack   = 100 * time.Millisecond
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
//     (rib.go, routes.go);
//   - bfdState: the BFD watch (bfd.go), under its own lock.
type speaker struct {
	log *slog.Logger

	mu sync.Mutex
	lifecycle
	peers    map[netip.Addr]Peer
	peersSet bool // SetPeers has been called at least once
	sessions sessionTracker
	senders  senderChecks // its own lock
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
	// softResetMu keeps our soft resets in and our RIB reads apart. GoBGP's
	// (v4.8.0, v4.9.0) soft reset in re-imports a session's paths and writes each
	// one's local ID (destination.implicitWithdraw) while ListPath converts
	// the same path objects outside GoBGP's lock (toPathApiUtil reads it):
	// a data race inside GoBGP. Both calls are ours, so the RIB reader
	// holds the read lock across its ListPath and applyPolicy the lock
	// across its ResetPeer calls (each returns once GoBGP has done it).
	softResetMu sync.RWMutex
}

// bfdState: the BFD watch (bfd.go) and the route publisher share these
// under bfdMu, never under mu: SetPeers holds mu across GoBGP management
// calls, which can wait seconds while GoBGP resets a session.
type bfdState struct {
	bfdMu   sync.Mutex
	bfdCfg  map[netip.Addr]BFD  // effective timers of the peers running BFD
	bfdDown map[netip.Addr]bool // silent, per the watch
	// bfdStates are GoBGP's BFD session states as last sampled.
	bfdStates map[netip.Addr]gobgpapi.BfdSessionState
	bfdHeld   map[netip.Addr]uint64 // back from silence at that generation, see releaseBFDHeld
	bfdGen    uint64
	bfdWake   chan struct{}
	// bfdCfgWake wakes the watch after a change of bfdCfg.
	bfdCfgWake chan struct{}
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
	lastInput     *policyInput // what lastPolicy was built from
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
			bfdHeld:    map[netip.Addr]uint64{},
			bfdWake:    make(chan struct{}, 1),
			bfdCfgWake: make(chan struct{}, 1),
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
	if c.ListenAddr6.IsValid() && (!c.ListenAddr6.Is6() || c.ListenAddr6.Is4In6()) {
		errs = append(errs, fmt.Errorf("IPv6 listen address %v is not an IPv6 address", c.ListenAddr6))
	}
	if c.IPv6Only && !c.RouterID6.IsValid() {
		errs = append(errs, errors.New("an IPv6-only speaker needs an IPv6 router address"))
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

// listenAddresses are the addresses BGP listens on (see Config.ListenAddr).
func listenAddresses(cfg Config) []string {
	var out []string
	switch {
	case cfg.ListenAddr.IsValid():
		out = append(out, cfg.ListenAddr.String())
	case !cfg.IPv6Only:
		out = append(out, netip.IPv4Unspecified().String())
	}
	switch {
	case cfg.ListenAddr6.IsValid():
		out = append(out, cfg.ListenAddr6.String())
	case cfg.IPv6Only:
		out = append(out, netip.IPv6Unspecified().String())
	}
	return out
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

	global := &gobgpapi.Global{
		Asn:             cfg.ASN,
		RouterId:        cfg.RouterID.String(),
		ListenPort:      cfg.ListenPort,
		ListenAddresses: listenAddresses(cfg),
	}
	if !cfg.IPv6Only {
		global.Families = append(global.Families, uint32(oc.AfiSafiTypeToIntMap[oc.AFI_SAFI_TYPE_IPV4_UNICAST]))
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
		OnPeerUpdate: s.onPeerEventWatched,
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
	s.senders.stop()
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
// then does not depend on how a peer reads the session's end: GoBGP (v4.8.0,
// v4.9.0) sometimes closes the connection before the peer has read the Cease, and a
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
	var out []gobgp.Family
	if !s.cfg.IPv6Only {
		out = append(out, gobgp.RF_IPv4_UC)
	}
	if s.cfg.RouterID6.IsValid() {
		out = append(out, gobgp.RF_IPv6_UC)
	}
	return out
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
