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
// view of what is configured.
type speaker struct {
	log    *slog.Logger
	routes chan []LearnedRoute
	dirty  chan struct{}

	mu        sync.Mutex
	srv       *server.BgpServer
	cfg       Config
	startedAt time.Time
	stopped   bool
	peers     map[netip.Addr]Peer
	peersSet  bool                     // SetPeers has been called at least once
	since     map[netip.Addr]time.Time // last session state change per peer
	eor       map[netip.Addr]bool      // peers that sent End-of-RIB since Start
	info      map[netip.Addr]string    // last disconnect reason per peer

	cancel    context.CancelFunc
	done      chan struct{}
	muteGoBGP atomic.Bool
}

// NewSpeaker returns a Speaker backed by an in-process GoBGP server. log may
// be nil; GoBGP's own messages go to it at Warn level and above.
func NewSpeaker(log *slog.Logger) Speaker {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &speaker{
		log:    log,
		routes: make(chan []LearnedRoute, 1),
		dirty:  make(chan struct{}, 1),
		peers:  map[netip.Addr]Peer{},
		since:  map[netip.Addr]time.Time{},
		eor:    map[netip.Addr]bool{},
		info:   map[netip.Addr]string{},
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
	if cfg.ListenPort == 0 {
		global.ListenPort = gobgp.BGP_PORT
	}
	if err := srv.StartBgp(ctx, &gobgpapi.StartBgpRequest{Global: global}); err != nil {
		srv.Stop()
		return fmt.Errorf("starting BGP: %w", err)
	}
	if err := installThirdPartyNextHop(ctx, srv, cfg.Subnet); err != nil {
		srv.Stop()
		return fmt.Errorf("configuring third-party next hops: %w", err)
	}

	runCtx, cancel := context.WithCancel(context.Background())
	// GoBGP sends a best-path event after every change to the global RIB
	// (also when only a non-best path changed), after the change; its
	// update events come before the RIB changes, so they are not watched.
	err := srv.WatchEvent(runCtx, server.WatchEventMessageCallbacks{
		OnBestPath:   func([]*apiutil.Path, time.Time) { s.markDirty() },
		OnPathEor:    s.onEOR,
		OnPeerUpdate: s.onPeerEvent,
	}, server.WatchBestPath(false), server.WatchEor(false), server.WatchPeer())
	if err != nil {
		cancel()
		srv.Stop()
		return fmt.Errorf("watching BGP events: %w", err)
	}

	s.srv, s.cfg, s.startedAt = srv, cfg, time.Now()
	s.cancel, s.done = cancel, make(chan struct{})
	go s.routeLoop(runCtx)
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
	cancel()
	<-done
	close(s.routes)
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

// Routes implements Speaker.
func (s *speaker) Routes() <-chan []LearnedRoute { return s.routes }

func (s *speaker) markDirty() {
	select {
	case s.dirty <- struct{}{}:
	default:
	}
}

func (s *speaker) onEOR(p *apiutil.Path, _ time.Time) {
	if p == nil || !p.PeerAddress.IsValid() {
		return
	}
	s.mu.Lock()
	s.eor[p.PeerAddress] = true
	s.mu.Unlock()
	s.markDirty()
}

func (s *speaker) onPeerEvent(ev *apiutil.WatchEventMessage_PeerEvent, t time.Time) {
	if ev == nil {
		return
	}
	if ev.Type == apiutil.PEER_EVENT_STATE {
		a := ev.Peer.State.NeighborAddress
		s.mu.Lock()
		s.since[a] = t
		if ev.Peer.State.SessionState == gobgp.BGP_FSM_ESTABLISHED {
			s.info[a] = ""
		} else if info := disconnectInfo(ev); info != "" {
			s.info[a] = info
		}
		s.mu.Unlock()
	}
	s.markDirty()
}

// routeLoop recomputes the learned routes whenever GoBGP reports a change
// (see settle) and periodically, and publishes each new set.
func (s *speaker) routeLoop(ctx context.Context) {
	defer close(s.done)
	var last []LearnedRoute
	published := false
	resync := time.NewTicker(routesResync)
	defer resync.Stop()
	stuck := time.NewTicker(stuckCheck)
	defer stuck.Stop()
	// After a restart (LocalRestarting) the first set waits for every
	// peer's End-of-RIB (or DeferralTime), so that the agent does not
	// flush kernel routes that peers are about to send again.
	gate := time.NewTimer(DeferralTime)
	defer gate.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.dirty:
			if !s.settle(ctx) {
				return
			}
		case <-resync.C:
		case <-gate.C:
		case <-stuck.C:
			s.resetStuckPeers(ctx)
			continue
		}
		routes, err := s.learnedRoutes()
		if err != nil {
			s.log.Warn("listing BGP routes", "err", err)
			continue
		}
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
		if !s.eor[a] {
			return false
		}
	}
	return true
}

// learnedRoutes reads the global RIB and selects the routes to report.
func (s *speaker) learnedRoutes() ([]LearnedRoute, error) {
	s.mu.Lock()
	srv, asn := s.srv, s.cfg.ASN
	self := []netip.Addr{s.cfg.RouterID}
	if s.cfg.ListenAddr.IsValid() {
		self = append(self, s.cfg.ListenAddr)
	}
	for _, p := range s.peers {
		if p.LocalAddress.IsValid() && !slices.Contains(self, p.LocalAddress) {
			self = append(self, p.LocalAddress)
		}
	}
	s.mu.Unlock()

	rib := map[netip.Prefix][]candidate{}
	err := srv.ListPath(apiutil.ListPathRequest{TableType: gobgpapi.TableType_TABLE_TYPE_GLOBAL, Family: gobgp.RF_IPv4_UC},
		func(_ gobgp.NLRI, paths []*apiutil.Path) {
			for _, p := range paths {
				if prefix, c, ok := candidateFromPath(p, asn); ok {
					rib[prefix] = append(rib[prefix], c)
				}
			}
		})
	if err != nil {
		return nil, err
	}
	return selectRoutes(rib, self), nil
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
