package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"

	"github.com/tabbynet/tabby/agent/attach"
	"github.com/tabbynet/tabby/agent/routetable"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/cni"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/flowlog"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/syncer"
)

// Agent is one node's tabby-agent. Build it with New and run it with Run.
// It is wiring: each part of the node's state has one owner with its own
// lock and goroutine (routes, BGP, policy, node GC, status), all fed by the
// cluster view.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	deps    Deps
	metrics *metrics

	// Set up by Run before any goroutine starts; read-only afterwards.
	store  *datastore.Store
	ipam   *ipam.Allocator
	view   *syncer.Syncer
	routes *routeOwner
	bgp    *bgpOwner
	policy *policyOwner // nil without a firewall
	flows  *flowOwner   // nil with flow logs off
	gc     *nodeGC
	tunnel *tunnelOwner // nil without Deps.VXLAN
	// reflectors elects route reflectors (routeReflectorMode Auto).
	reflectors *reflectorElector
	handler    *cniHandler
	nodeAddr   netip.Prefix
	// nodeAddr6 is the node's IPv6 underlay address; invalid when it has
	// none.
	nodeAddr6 netip.Prefix
	started   time.Time
	lease     *leaseHolder
	// wired is closed when every field above is set (tests wait for it).
	wired chan struct{}

	cniListening atomic.Bool
	// panicked is the first panic of a CNI step (attach.Runner.Panicked):
	// the agent is no longer live (liveness), so that the kubelet restarts
	// it and it re-reads what the panic may have left half-changed.
	panicked atomic.Pointer[string]
	// probes rate-limits POST /policy/probe (probe.go).
	probes *rate.Limiter
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
	// VXLAN makes the node's VXLAN tunnels; nil leaves VXLAN pools'
	// traffic on the native path (docs/vxlan.md).
	VXLAN dataplane.VXLAN
	// CNIFault, for tests, is called with the step's name after each step
	// of a CNI request's plan (docs/agent.md); an error fails the step there.
	CNIFault func(step string) error
	// EndpointApart, for benchmarks, writes an ADD's endpoint in a
	// transaction of its own after the address, as before the endpoint
	// rode on the assignment's (docs/agent.md).
	EndpointApart bool
	// WatchLinks, when set, reports interfaces appearing on the node
	// (dataplane.WatchLinks), so that a host endpoint waiting for its
	// interface is reported policed at once rather than at the resync.
	WatchLinks func(ctx context.Context) (<-chan string, error)
	// FlowSources read the kernel for flow logs (used when
	// Config.FlowLog.Mode is not off).
	FlowSources FlowSources
	// Prober sends `explain packet --live`'s probe from a pod on this node
	// (dataplane.Probe); nil refuses probes (POST /policy/probe).
	Prober func(ctx context.Context, spec dataplane.ProbeSpec) (dataplane.ProbeResult, error)
	// MD5KeyRoom makes room on the node for keys TCP-MD5 keys on the BGP
	// listener (dataplane.EnsureMD5KeyRoom); nil leaves the node alone.
	MD5KeyRoom func(keys int) error
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
	fw, err := dataplane.NewFirewall(dataplane.FirewallConfig{Firewall: string(cfg.FirewallBackend), FlowLog: dataplane.FlowLogRules{
		Deny: cfg.FlowLog.Mode.Denies(), Allow: cfg.FlowLog.Mode.Allows(), Group: cfg.FlowLog.Group}, Log: log.With("component", "firewall")})
	if err != nil {
		return fmt.Errorf("setting up the firewall: %w", err)
	}
	vx, err := dataplane.NewVXLAN("")
	if err != nil {
		return err
	}
	newSpeaker := func() bgp.Speaker { return bgp.NewSpeaker(log.With("component", "bgp")) }
	a := New(cfg, log, Deps{Workloads: wl, Routes: routes, Speaker: newSpeaker(), NewSpeaker: newSpeaker, Firewall: fw, VXLAN: vx, Prober: dataplane.Probe,
		WatchLinks:  func(ctx context.Context) (<-chan string, error) { return dataplane.WatchLinks(ctx, "") },
		MD5KeyRoom:  func(keys int) error { _, err := dataplane.EnsureMD5KeyRoom("", keys); return err },
		FlowSources: FlowSources{NFLOG: dataplane.ListenNFLOG, Conntrack: dataplane.ListenConntrack, Accounting: dataplane.EnableConntrackAccounting}})
	return a.Run(ctx)
}

// New builds an agent over the given dependencies.
func New(cfg Config, log *slog.Logger, d Deps) *Agent {
	return &Agent{cfg: cfg, log: log, deps: d, metrics: newMetrics(), wired: make(chan struct{}),
		probes: rate.NewLimiter(probeRate, probeBurst)}
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

// Run registers the node, builds the cluster view and runs every owner
// until ctx is done. On return the BGP speaker has stopped gracefully
// (peers keep this node's routes for the restart time) and the node's
// liveness and status records are gone.
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
	a.metrics.watchIPAM(a.ipam)

	if err := a.nodeAddresses(); err != nil {
		return err
	}
	node, err := a.registerNode(ctx)
	if err != nil {
		return err
	}
	if err := a.ensureDefaultPool(ctx); err != nil {
		return err
	}
	if err := a.ensureMeshKey(ctx); err != nil {
		return err
	}
	a.syncBlockSummaries(ctx)
	a.lease = &leaseHolder{store: a.store, ttl: a.cfg.LeaseTTL, log: a.log, publish: a.publishLiveness}
	if err := a.lease.grant(ctx); err != nil {
		return err
	}
	defer a.lease.revoke(ctx)

	// The view: everything below reads the cluster from it. It runs in the
	// agent's errgroup, so its error ends the agent; a return before the
	// group's Wait below stops it and waits for it.
	a.view = syncer.New(a.store, a.log.With("component", "view"))
	a.view.CompactRemote(a.cfg.NodeName)
	rctx, stop := context.WithCancel(ctx)
	g, gctx := errgroup.WithContext(rctx)
	defer func() { stop(); _ = g.Wait() }()
	g.Go(func() error { return a.view.Run(gctx) })
	if err := a.view.WaitSynced(gctx); err != nil {
		stop()
		if verr := g.Wait(); verr != nil && !errors.Is(verr, context.Canceled) {
			err = verr
		}
		return fmt.Errorf("listing the cluster: %w", err)
	}
	a.metrics.watchStore(a.store, a.view)
	a.claimFirstBlock(ctx)

	if err := a.startBGP(ctx, node); err != nil {
		return err
	}
	a.wireOwners(gctx)
	srv := cni.NewServer(a.cfg.CNISocket, a.handler, a.log.With("component", "cni-server"))
	close(a.wired)

	err = a.runLoops(g, gctx, srv)
	a.log.Info("agent stopped", "node", a.cfg.NodeName)
	return err
}

// startBGP builds the route and BGP owners and starts the speaker, told
// whether this is a restart (own routes still in the kernel: peers keep
// this node's routes while it comes back).
func (a *Agent) startBGP(ctx context.Context, node *api.Node) error {
	restarting := a.ownRoutesPresent()
	bcfg := speakerConfig(node, a.nodeAddr, a.nodeAddr6, a.view.BGPConfiguration(), restarting, addrPortOrEmpty(a.cfg.GoBGPAPI))
	bcfg.RouterID = routerID(a.cfg, node, a.nodeAddr)
	a.routes = newRouteOwner(a.cfg.NodeName, a.view, a.newRouteTable(), a.log.With("component", "routes"))
	a.bgp = newBGPOwner(a.cfg.NodeName, a.nodeAddr, a.view, a.routes.table, a.deps.Speaker, a.deps.NewSpeaker,
		a.cfg.BGPSettleTime, a.metrics, a.log.With("component", "bgp"))
	a.bgp.nodeAddr6 = a.nodeAddr6
	a.bgp.md5Room = a.deps.MD5KeyRoom
	a.bgp.routerIDFor = func(n *api.Node) netip.Addr { return routerID(a.cfg, n, a.nodeAddr) }
	a.reflectors = newReflectorElector(a.cfg.NodeName, a.store, a.view, a.log.With("component", "reflectors"), a.bgp.wake)
	a.bgp.reflectors = a.reflectors.current
	a.bgp.readyFor, a.bgp.isLive = a.reflectors.readyReflectors, a.reflectors.isLive
	a.bgp.publish = func(ctx context.Context) error { return a.publishLiveness(ctx, a.lease.current()) }
	// Learned routes are held until BGP converged only to protect those an
	// earlier run left in the kernel; with none there, a withdrawal (a
	// peer lost right after the start) reaches the kernel at once.
	if learned, err := a.deps.Routes.List(dataplane.RouteProtoBGP); err == nil && len(learned) == 0 {
		a.bgp.converged = true
	}
	if err := a.bgp.start(ctx, bcfg); err != nil {
		return fmt.Errorf("starting the BGP speaker: %w", err)
	}
	a.log.Info("agent started", "node", a.cfg.NodeName, "address", a.nodeAddr, "address6", a.nodeAddr6, "router_id", bcfg.RouterID, "asn", bcfg.ASN, "restarting", restarting)
	return nil
}

// wireOwners builds the owners that follow the BGP speaker: node GC, the
// VXLAN tunnel, policy (and flow logs) and the CNI handler that uses them.
func (a *Agent) wireOwners(gctx context.Context) {
	a.gc = newNodeGC(a.view, a.store, a.ipam, a.cfg.NodeGCGrace, a.log.With("component", "nodegc"))
	if a.cfg.NodeGCMaxPerPass > 0 { // Run validates; New does not
		a.gc.maxPerPass = a.cfg.NodeGCMaxPerPass
	}
	if a.deps.VXLAN != nil {
		a.tunnel = newTunnelOwner(a.cfg.NodeName, a.nodeAddr, a.nodeAddr6, a.view, a.store, a.ipam, a.deps.VXLAN, a.routes.table, a.log.With("component", "tunnel"))
	}
	if a.deps.Firewall != nil {
		a.policy = newPolicyOwner(a.cfg.NodeName, a.view, a.deps.Firewall, a.log.With("component", "policy"))
		a.policy.toHost, a.policy.protected = string(a.cfg.EndpointToHostAction), a.cfg.HostProtectedPorts()
		a.policy.host.healthPort = a.cfg.HTTPListen.Port()
		a.policy.agentPorts = a.cfg.AgentPorts()
		a.policy.resync = a.cfg.ResyncInterval
		if a.cfg.FlowLog.Mode != "" && a.cfg.FlowLog.Mode != flowlog.ModeOff {
			a.flows = newFlowOwner(a.cfg.FlowLog, a.cfg.NodeName, a.view, a.deps.FlowSources, a.log.With("component", "flows"))
			a.policy.onApplied = a.flows.applied
			a.metrics.watchFlows(a.flows.agg)
		}
		if rc, ok := a.deps.Firewall.(ruleCounterReader); ok {
			a.metrics.watchRuleCounters(rc)
		}
	} else {
		a.log.Warn("no firewall: network policy, anti-spoofing and natOutgoing are not enforced")
	}
	a.handler = newCNIHandler(gctx, a.cfg.NodeName, a.store, a.ipam, a.deps.Workloads, a.view, a.routes, a.log.With("component", "cni"))
	a.handler.ipv6Only = !a.nodeAddr.IsValid()
	a.handler.observe, a.handler.observeAssign = a.metrics.observeCNI, a.metrics.observeAssign
	a.handler.runner = attach.Runner{Fault: a.deps.CNIFault, Observe: a.metrics.observeStep, Panicked: a.stepPanicked}
	a.handler.endpointApart = a.deps.EndpointApart
	a.handler.kube = newKubeRecords(a.cfg.NodeName)
	if a.policy != nil {
		a.handler.policy = attach.PolicyFunc(a.policy.syncFor)
		a.handler.primer = a.policy
	}
	a.handler.advert = attach.AdvertFunc(a.bgp.waitAdvertised)
	if a.tunnel != nil {
		a.handler.autoMTU = a.tunnel.podMTU
	}
}

// newRouteTable returns the node's route table, told which classes the
// owners will set: the routes an earlier run left in the kernel stay until
// their owner's first pass, whichever owner applies the table first (a
// restart without a packet lost; docs/agent.md, "Restart without loss").
// Learned routes have their own hold, until BGP converged (newBGPOwner).
func (a *Agent) newRouteTable() *routetable.Table {
	t := routetable.New(a.deps.Routes, a.cfg.ResyncInterval)
	expect := []routetable.Class{routetable.Workload, routetable.Blackhole, routetable.Aggregate, routetable.Service}
	if a.deps.VXLAN != nil {
		expect = append(expect, routetable.Tunnel)
	}
	t.Expect(expect...)
	return t
}

// syncBlockSummaries writes the block summaries that blocks written by an
// older release lack (or that such an agent left stale) before the view
// lists them: the view reads summaries, never blocks (ipam.SyncSummaries,
// docs/datastore.md "Upgrades"). A failure leaves them to the next agent
// that starts.
func (a *Agent) syncBlockSummaries(ctx context.Context) {
	ectx, cancel := context.WithTimeout(ctx, storeCallTimeout)
	defer cancel()
	if n, err := a.ipam.SyncSummaries(ectx); err != nil {
		a.log.Warn("writing missing IPAM block summaries", "written", n, "err", err)
	} else if n > 0 {
		a.log.Info("wrote missing or stale IPAM block summaries", "records", n)
	}
}

// claimFirstBlock claims the node's first block, before any pod: its route
// reaches every peer while the node starts, so a first pod's first packets
// are not lost. A failure leaves it to the first pod.
func (a *Agent) claimFirstBlock(ctx context.Context) {
	ectx, cancel := context.WithTimeout(ctx, storeCallTimeout)
	defer cancel()
	if blk, err := a.ipam.EnsureBlock(ectx, a.cfg.NodeName); err != nil {
		a.log.Warn("claiming a first address block at start; the first pod will", "err", err)
	} else if blk.IsValid() {
		a.log.Info("claimed a first address block", "block", blk)
	}
}

// runLoops runs the CNI server, the status API and every owner's loop in
// the agent's errgroup (where the view already runs) until gctx is done or
// one fails, then waits for the CNI handler's spare-block claims (started
// by ADDs, which have all returned once the server has) and stops the BGP
// speaker gracefully.
func (a *Agent) runLoops(g *errgroup.Group, gctx context.Context, srv *cni.Server) error {
	every := a.cfg.ResyncInterval
	g.Go(func() error {
		a.cniListening.Store(true)
		defer a.cniListening.Store(false)
		return srv.Run(gctx)
	})
	g.Go(func() error { return a.serveStatus(gctx) })
	if a.cfg.DebugPprof.IsValid() {
		g.Go(func() error { return servePprof(gctx, a.cfg.DebugPprof, a.log) })
	}
	g.Go(func() error { a.routes.loop(every, a.metrics).run(gctx); return nil })
	g.Go(func() error { a.bgp.loop(every).run(gctx); return nil })
	g.Go(func() error { a.bgp.learnedLoop(gctx); return nil })
	g.Go(func() error { a.reflectors.run(gctx); return nil })
	g.Go(func() error { a.gc.loop(every, a.metrics).run(gctx); return nil })
	g.Go(func() error { a.lease.keep(gctx); return nil })
	g.Go(func() error { a.statusLoop(gctx); return nil })
	g.Go(func() error { a.handler.kube.run(gctx, a.store); return nil })
	if a.policy != nil {
		g.Go(func() error { a.policy.loop(every, a.metrics).run(gctx); return nil })
		if a.flows != nil {
			g.Go(func() error { a.flows.run(gctx); return nil })
		}
		if a.deps.WatchLinks != nil {
			g.Go(func() error { a.policy.watchLinks(gctx, a.deps.WatchLinks); return nil })
		}
	}
	if r, ok := a.deps.Workloads.(dataplane.HostIfRestorer); ok {
		g.Go(func() error { hostIfLoop(r, every, a.metrics, a.log.With("component", "hostif")).run(gctx); return nil })
	}
	if a.tunnel != nil {
		g.Go(func() error { a.tunnel.loop(every, a.metrics).run(gctx); return nil })
	}
	err := g.Wait()
	a.handler.waitSpares()
	if serr := a.bgp.stop(); serr != nil {
		err = errors.Join(err, fmt.Errorf("stopping the BGP speaker: %w", serr))
	}
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// nodeAddresses sets the node's addresses from the configuration or by
// autodetection: IPv4 unless the node is IPv6-only (--node-ip none), IPv6
// when given or autodetected (--node-ip6 autodetect).
func (a *Agent) nodeAddresses() error {
	a.nodeAddr, a.nodeAddr6 = a.cfg.NodeIP, a.cfg.NodeIP6
	if !a.nodeAddr.IsValid() && !a.cfg.NoIPv4 {
		p, err := Autodetect(a.cfg.AutodetectMethod)
		if err != nil {
			return fmt.Errorf("autodetecting the node address: %w", err)
		}
		a.log.Info("autodetected node address", "address", p, "method", a.cfg.AutodetectMethod)
		a.nodeAddr = p
	}
	if !a.nodeAddr6.IsValid() && a.cfg.AutodetectIPv6 {
		p, err := Autodetect6(a.cfg.AutodetectMethod6.AutodetectMethod)
		if err != nil {
			return fmt.Errorf("autodetecting the node's IPv6 address: %w", err)
		}
		a.log.Info("autodetected node IPv6 address", "address", p, "method", a.cfg.AutodetectMethod6)
		a.nodeAddr6 = p
	}
	if !a.nodeAddr.IsValid() && !a.nodeAddr6.IsValid() {
		return errors.New("the node has no address: set --node-ip or --node-ip6")
	}
	return nil
}

// routerID is the node's BGP router ID: --router-id, else its IPv4
// address, else (IPv6-only) the Node's spec.bgp.routerID or one derived
// from its name (bgp.RouterIDFor).
func routerID(cfg Config, node *api.Node, addr netip.Prefix) netip.Addr {
	switch {
	case cfg.RouterID.IsValid():
		return cfg.RouterID
	case addr.IsValid():
		return addr.Addr()
	}
	configured := ""
	if node != nil && node.Spec.BGP != nil {
		configured = node.Spec.BGP.RouterID
	}
	return bgp.RouterIDFor(cfg.NodeName, configured)
}

// addrPortOrEmpty is ap as "host:port", or "" when it is not set.
func addrPortOrEmpty(ap netip.AddrPort) string {
	if !ap.IsValid() {
		return ""
	}
	return ap.String()
}

// ownRoutesPresent tells a restart from a first start: our blackhole routes
// survive in the kernel when only the agent went away.
func (a *Agent) ownRoutesPresent() bool {
	rs, err := a.deps.Routes.List(dataplane.RouteProtoWorkload)
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
