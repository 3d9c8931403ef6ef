package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/cni"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// Agent is one node's tabby-agent. Build it with New and run it with Run.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	store  *datastore.Store
	ipam   *ipam.Allocator
	wl     dataplane.Workloads
	routes dataplane.Routes
	// speaker is replaced when the node's BGP identity changes; read it
	// with currentSpeaker.
	speaker    bgp.Speaker
	speakerCfg bgp.Config
	newSpeaker func() bgp.Speaker
	metrics    *metrics
	handler    *cniHandler
	// firewall is Deps.Firewall; policy runs it (nil without a firewall).
	firewall dataplane.Firewall
	policy   *policyController
	// cniFault is Deps.CNIFault.
	cniFault func(step string) error

	nodeAddr netip.Prefix
	started  time.Time

	routingKick chan struct{}
	bgpKick     chan struct{}

	// learnedSyncMu serialises syncs of the BGP routes in the kernel.
	learnedSyncMu sync.Mutex
	mu            sync.Mutex
	learned       []bgp.LearnedRoute
	learnedAny    bool // a speaker has delivered a route set
	converged     bool
	allUpSince    time.Time
	desiredPeers  []bgp.Peer
	advertised    []netip.Prefix
	localBlocks   []netip.Prefix
	workloads     int
	lastRouting   time.Time
	lastBGP       time.Time
	lastStoreOK   time.Time
	cniListening  bool
	missingNodes  map[string]time.Time
	inflight      map[string]time.Time // host interfaces being wired by ADD, and since when
	statusLease   datastore.LeaseID
	peerStatus    []bgp.PeerStatus
}

// Deps are the kernel and BGP implementations the agent drives; tests pass
// fakes, production passes the Linux ones.
type Deps struct {
	Workloads dataplane.Workloads
	Routes    dataplane.Routes
	Speaker   bgp.Speaker
	// Firewall enforces policy; nil leaves the node's packet filter alone.
	Firewall dataplane.Firewall
	// NewSpeaker makes a fresh speaker when this node's BGP identity (AS
	// number, route-reflector cluster ID) changes at run time; nil means
	// such a change needs an agent restart.
	NewSpeaker func() bgp.Speaker
	// CNIFault, for tests, is called after each step of CNI ADD; an error
	// fails ADD there.
	CNIFault func(step string) error
}

// Run starts a production agent and blocks until ctx is done.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid configuration:\n%w", err)
	}
	if err := dataplane.EnsureNodeSysctls(""); err != nil {
		return fmt.Errorf("setting node sysctls: %w", err)
	}
	routes, err := dataplane.NewRoutes("")
	if err != nil {
		return err
	}
	wl, err := dataplane.NewWorkloads("")
	if err != nil {
		return err
	}
	fw, err := dataplane.NewFirewall(dataplane.FirewallConfig{Firewall: cfg.FirewallBackend})
	if err != nil {
		return fmt.Errorf("setting up the firewall: %w", err)
	}
	newSpeaker := func() bgp.Speaker { return bgp.NewSpeaker(log.With("component", "bgp")) }
	a := New(cfg, log, Deps{Workloads: wl, Routes: routes, Speaker: newSpeaker(), NewSpeaker: newSpeaker, Firewall: fw})
	return a.Run(ctx)
}

// New builds an agent over the given dependencies.
func New(cfg Config, log *slog.Logger, d Deps) *Agent {
	a := &Agent{
		cfg:          cfg,
		log:          log,
		wl:           d.Workloads,
		routes:       d.Routes,
		speaker:      d.Speaker,
		newSpeaker:   d.NewSpeaker,
		cniFault:     d.CNIFault,
		firewall:     d.Firewall,
		metrics:      newMetrics(),
		routingKick:  make(chan struct{}, 1),
		bgpKick:      make(chan struct{}, 1),
		missingNodes: map[string]time.Time{},
		inflight:     map[string]time.Time{},
	}
	return a
}

func kick(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (a *Agent) kickAll() {
	kick(a.routingKick)
	kick(a.bgpKick)
}

// connect opens the datastore, retrying until it answers or ctx ends.
func (a *Agent) connect(ctx context.Context) error {
	if a.cfg.Etcd.Logger == nil {
		a.cfg.Etcd.Logger = a.log.With("component", "datastore")
	}
	for attempt := 0; ; attempt++ {
		s, err := datastore.New(ctx, a.cfg.Etcd)
		if err == nil {
			a.store = s
			return nil
		}
		a.log.Warn("datastore not reachable, retrying", "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("connecting to the datastore: %w", err)
		case <-time.After(backoff(attempt)):
		}
	}
}

func backoff(attempt int) time.Duration {
	d := 250 * time.Millisecond << min(attempt, 4)
	return min(d, 3*time.Second)
}

// Run registers the node and runs every loop until ctx is done. On return
// the BGP speaker has stopped gracefully: peers keep this node's routes for
// the restart time.
func (a *Agent) Run(ctx context.Context) (err error) {
	a.started = time.Now()
	if err := a.connect(ctx); err != nil {
		return err
	}
	defer func() {
		if cerr := a.store.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	a.ipam = ipam.New(a.store, ipam.WithLogger(a.log.With("component", "ipam")))

	addr, err := a.nodeAddress()
	if err != nil {
		return err
	}
	a.nodeAddr = addr
	node, err := a.registerNode(ctx)
	if err != nil {
		return err
	}
	if err := a.ensureDefaultPool(ctx); err != nil {
		return err
	}
	lease, err := a.store.GrantLease(ctx, a.cfg.LeaseTTL)
	if err != nil {
		return fmt.Errorf("granting the node's liveness lease: %w", err)
	}
	if err := a.publishLiveness(ctx, lease); err != nil {
		return err
	}
	a.statusLease = lease

	restarting := a.ownRoutesPresent()
	bcfg, err := a.speakerConfig(ctx, node, restarting)
	if err != nil {
		return err
	}
	a.speakerCfg = bcfg
	if err := a.speaker.Start(ctx, bcfg); err != nil {
		return fmt.Errorf("starting the BGP speaker: %w", err)
	}
	a.log.Info("agent started", "node", a.cfg.NodeName, "address", a.nodeAddr, "asn", bcfg.ASN, "restarting", restarting)

	a.startPolicy()
	a.handler = &cniHandler{
		node:          a.cfg.NodeName,
		store:         a.store,
		ipam:          a.ipam,
		wl:            &trackedWorkloads{Workloads: a.wl, a: a},
		log:           a.log.With("component", "cni"),
		changed:       a.kickAll,
		observe:       a.metrics.observeCNI,
		observeAssign: a.metrics.observeAssign,
		fault:         a.cniFault,
		inflight:      a.inflightDevs,
	}
	if a.policy != nil {
		a.handler.policySync = a.policySync
	}
	srv := cni.NewServer(a.cfg.CNISocket, a.handler, a.log.With("component", "cni-server"))

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		a.setCNIListening(true)
		defer a.setCNIListening(false)
		return srv.Run(gctx)
	})
	g.Go(func() error { return a.serveStatus(gctx) })
	g.Go(func() error { a.watchLoop(gctx); return nil })
	g.Go(func() error { a.routingLoop(gctx); return nil })
	g.Go(func() error { a.bgpLoop(gctx); return nil })
	g.Go(func() error { a.learnedLoop(gctx); return nil })
	g.Go(func() error { a.leaseLoop(gctx, lease); return nil })
	g.Go(func() error { a.statusLoop(gctx); return nil })
	g.Go(func() error { a.policyLoop(gctx); return nil })
	a.kickAll()
	err = g.Wait()
	if serr := a.currentSpeaker().Stop(true); serr != nil {
		err = errors.Join(err, fmt.Errorf("stopping the BGP speaker: %w", serr))
	}
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	a.log.Info("agent stopped", "node", a.cfg.NodeName)
	return err
}

func (a *Agent) nodeAddress() (netip.Prefix, error) {
	if a.cfg.NodeIP != "" {
		p, err := netip.ParsePrefix(a.cfg.NodeIP)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("node ip %q: %w", a.cfg.NodeIP, err)
		}
		return p, nil
	}
	p, err := Autodetect(a.cfg.AutodetectMethod)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("autodetecting the node address: %w", err)
	}
	a.log.Info("autodetected node address", "address", p, "method", a.cfg.AutodetectMethod)
	return p, nil
}

// ownRoutesPresent tells a restart from a first start: our blackhole routes
// survive in the kernel when only the agent went away.
func (a *Agent) ownRoutesPresent() bool {
	rs, err := a.routes.List(dataplane.RouteProtoWorkload)
	if err != nil {
		return false
	}
	for _, r := range rs {
		if r.Type == dataplane.RouteBlackhole {
			return true
		}
	}
	return false
}

func (a *Agent) speakerConfig(ctx context.Context, node *api.Node, restarting bool) (bgp.Config, error) {
	bc, err := a.bgpConfiguration(ctx)
	if err != nil {
		return bgp.Config{}, err
	}
	asn, clusterID := node.EffectiveASN(bc), node.RouteReflectorClusterID()
	port := int32(api.DefaultListenPort)
	if bc.Spec.ListenPort != nil {
		port = int32(*bc.Spec.ListenPort)
	}
	restart := 120 * time.Second
	if bc.Spec.NodeMeshMaxRestartTime != nil {
		restart = bc.Spec.NodeMeshMaxRestartTime.Duration
	}
	return bgp.Config{
		RouterID:        a.nodeAddr.Addr(),
		Subnet:          a.nodeAddr.Masked(),
		ASN:             asn,
		ListenAddr:      a.nodeAddr.Addr(),
		ListenPort:      port,
		ClusterID:       clusterID,
		GracefulRestart: true,
		RestartTime:     restart,
		LocalRestarting: restarting,
		APIListen:       a.cfg.GoBGPAPI,
	}, nil
}

func (a *Agent) bgpConfiguration(ctx context.Context) (*api.BGPConfiguration, error) {
	obj, err := a.store.Get(ctx, api.KindBGPConfiguration, "", api.SingletonName)
	if errors.Is(err, datastore.ErrNotFound) {
		bc := &api.BGPConfiguration{Metadata: api.ObjectMeta{Name: api.SingletonName}}
		bc.SetDefaults()
		return bc, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading BGPConfiguration: %w", err)
	}
	bc := obj.(*api.BGPConfiguration)
	bc.SetDefaults()
	return bc, nil
}

func (a *Agent) setCNIListening(v bool) {
	a.mu.Lock()
	a.cniListening = v
	a.mu.Unlock()
}

// trackedWorkloads marks host interfaces as being wired while ADD runs, so
// that a concurrent routing pass keeps their routes although their endpoint
// is not stored yet.
type trackedWorkloads struct {
	dataplane.Workloads
	a *Agent
}

func (t *trackedWorkloads) Setup(ctx context.Context, s dataplane.WorkloadSpec) (dataplane.WorkloadStatus, error) {
	t.a.mu.Lock()
	t.a.inflight[s.HostIfName] = time.Now()
	t.a.mu.Unlock()
	return t.Workloads.Setup(ctx, s)
}

// inflightWindow is how long a freshly wired interface's routes are kept
// without an endpoint; ADD stores the endpoint well within it.
const inflightWindow = 30 * time.Second

// inflightDevs returns the host interfaces wired within inflightWindow.
func (a *Agent) inflightDevs() map[string]bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string]bool{}
	for dev, at := range a.inflight {
		if time.Since(at) > inflightWindow {
			delete(a.inflight, dev)
			continue
		}
		out[dev] = true
	}
	return out
}
