package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/tabbynet/tabby/agent/routetable"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/bgp/session"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/syncer"
)

// convergeHold is how long every desired peer must have been Established
// before stale learned routes from before a restart are removed.
const convergeHold = 3 * time.Second

// bgpOwner owns the BGP side of the node: the speaker (restarted when the
// node's BGP identity changes), its peers and advertisements computed from
// the view, and the learned route class (protocol RouteProtoBGP), fed
// straight from the speaker and handed to the route table.
//
// Its state comes in parts, one per concern, each an embedded struct that
// mu guards: speakerLife (the speaker and its identity), bgpSessions (the
// desired peers, their sessions' states, convergence and readiness),
// bgpAdvertiser (the advertisement sources and what the speaker accepted)
// and learnedState (the learned routes and what they may not override).
type bgpOwner struct {
	node     string
	nodeAddr netip.Prefix
	// nodeAddr6 is the node's IPv6 address (invalid without one): with
	// it BGP carries IPv6 too, and IPv6 blocks, borrowed addresses and
	// pools are passed to the speaker.
	nodeAddr6 netip.Prefix
	// routerIDFor is the router ID the node's record asks for (the
	// agent's routerID); nil keeps the one the speaker started with.
	routerIDFor func(*api.Node) netip.Addr
	view        *syncer.Syncer
	table       *routetable.Table
	log         *slog.Logger
	// md5Room makes room for that many TCP-MD5 keys on the BGP listener
	// (Deps.MD5KeyRoom; nil = nothing to do); md5Keys is the most it was
	// asked for successfully.
	md5Room func(keys int) error
	md5Keys int
	metrics *metrics
	sub     *syncer.Signal
	kick    chan struct{}

	// learnedMu serialises syncs of the learned routes.
	learnedMu sync.Mutex

	mu sync.Mutex
	speakerLife
	bgpSessions
	bgpAdvertiser
	learnedState
	serviceState
	lastPass time.Time
	// unusableFilters: see warnUnusableFilters.
	unusableFilters []string
	bgpProblems
	// problemLines, meshProblem: see noteBGPProblems, meshPassword.
	problemLines []string
	meshProblem  string
	// reflectors is the elected route reflectors (routeReflectorMode
	// Auto); nil returns nil. refused are the sessions the last pass
	// could not have (bgp.PlanPeers).
	reflectors func() *bgp.ReflectorChoice
	refused    []bgp.RefusedPeer
	reflectorReadiness
}

// speakerLife is the running speaker and the configuration (identity) it
// was started with; newSpeaker makes a replacement (nil: an identity
// change needs an agent restart).
type speakerLife struct {
	speaker    bgp.Speaker
	speakerCfg bgp.Config
	newSpeaker func() bgp.Speaker
}

// bgpSessions follows the sessions: the peers the last pass asked for,
// their states as last polled, and whether BGP has converged since the
// start (every desired peer Established for convergeHold, or settle
// passed).
type bgpSessions struct {
	started      time.Time
	settle       time.Duration
	desiredPeers []bgp.Peer
	peerStatus   []bgp.PeerStatus
	// received is the prefixes each peer sent, as last counted (see
	// countEvery).
	received   map[netip.Addr]uint32
	allUpSince time.Time
	converged  bool
	// passwords are the passwords given to the speaker, by peer
	// address: see holdLearnedOnRotation.
	passwords map[netip.Addr]string
	// rotatingSince is when a pass first saw a password not yet given to
	// the speaker (zero: none pending): see rotationDelay.
	rotatingSince time.Time
	// meshSecret is the last nodeMeshPassword that resolved from a
	// Secret: see meshPassword.
	meshSecret string
	// lastMeshKey is the last mesh key the view had, meshKeyLost whether
	// the view has lost it since: see meshKey.
	lastMeshKey string
	meshKeyLost bool
}

// bgpAdvertiser is what the node advertises: the sources it asks, the
// prefixes of the last pass (advertised; localBlocks are its affine
// blocks, for the status) and what the speaker accepted last
// (advertisedOK; advertisedCh is closed, and replaced, whenever it
// changes).
type bgpAdvertiser struct {
	sources      []bgp.AdvertisementSource
	advertised   []netip.Prefix
	localBlocks  []netip.Prefix
	advertisedOK map[netip.Prefix]bool
	advertisedCh chan struct{}
}

// learnedState is the speaker's latest route set and what the last sync
// of the kernel's learned routes protected.
type learnedState struct {
	learned    []bgp.LearnedRoute
	importCtx  bgp.ImportContext // what the last sync protected
	rejected   []bgp.Rejected
	suppressed []netip.Prefix // learned routes the table keeps off node routes
	learnedAny bool           // a speaker has delivered a route set
	// learnedSets counts the route sets delivered (see prefixCounts).
	learnedSets uint64
	counts      prefixCounts
}

func newBGPOwner(node string, nodeAddr netip.Prefix, view *syncer.Syncer, table *routetable.Table, sp bgp.Speaker, newSpeaker func() bgp.Speaker, settle time.Duration, m *metrics, log *slog.Logger) *bgpOwner {
	b := &bgpOwner{node: node, nodeAddr: nodeAddr, view: view, table: table, metrics: m, log: log, kick: make(chan struct{}, 1),
		speakerLife:   speakerLife{speaker: sp, newSpeaker: newSpeaker},
		bgpSessions:   bgpSessions{started: time.Now(), settle: settle},
		bgpAdvertiser: bgpAdvertiser{sources: bgp.DefaultSources()},
	}
	b.sub = view.Notify("bgp", b.affects()...)
	if table != nil {
		// Until BGP has converged after a start, learned routes already in
		// the kernel stay, so that a restart does not cut traffic.
		table.HoldDeletes(routetable.Learned, true)
	}
	return b
}

// affects takes what peers and advertisements depend on: nodes, BGP
// configuration, peers and filters, pools (DisableBGPExport, communities),
// this node's blocks and
// claims, and blocks that lend this node addresses.
func (b *bgpOwner) affects() []syncer.Filter {
	return []syncer.Filter{
		syncer.On[api.Node](nil), syncer.On[api.BGPConfiguration](nil), syncer.On[api.BGPPeer](nil),
		syncer.On[api.BGPFilter](nil), syncer.On[api.IPPool](nil), syncer.On[datastore.BGPMeshKey](nil),
		syncer.On[datastore.BGPSecrets](nil),
		syncer.On(func(u syncer.Update[ipam.BlockSummary]) bool { return u.Either(blockOfOrLendingTo(b.node)) }),
		syncer.On(func(u syncer.Update[ipam.Affinity]) bool { return u.Either(claimOf(b.node)) }),
		syncer.On(serviceAffects(b.node)),
	}
}

func (b *bgpOwner) loop(every time.Duration) loop {
	return loop{name: "bgp", every: every, wake: [2]<-chan struct{}{b.sub.C(), b.kick}, pass: b.pass, observe: b.metrics.observeReconcile, log: b.log}
}

// speakerConfig is the speaker's configuration for this node under bc.
func speakerConfig(node *api.Node, nodeAddr, nodeAddr6 netip.Prefix, bc *api.BGPConfiguration, restarting bool, apiListen string) bgp.Config {
	asn, clusterID := node.EffectiveASN(bc), node.RouteReflectorClusterID()
	port := int32(api.DefaultListenPort)
	if bc.Spec.ListenPort != nil {
		port = int32(*bc.Spec.ListenPort)
	}
	restart := 120 * time.Second
	if bc.Spec.NodeMeshMaxRestartTime != nil {
		restart = bc.Spec.NodeMeshMaxRestartTime.Duration
	}
	var addr6 netip.Addr
	var subnet, subnet6 netip.Prefix
	if nodeAddr6.IsValid() {
		addr6, subnet6 = nodeAddr6.Addr(), nodeAddr6.Masked()
	}
	if nodeAddr.IsValid() {
		subnet = nodeAddr.Masked()
	}
	return bgp.Config{
		RouterID:  nodeAddr.Addr(), // the agent replaces it on an IPv6-only node (routerID)
		Subnet:    subnet,
		RouterID6: addr6,
		Subnet6:   subnet6,
		ASN:       asn,
		// Both families' addresses: sessions to a node that shares only
		// IPv6 with this one are IPv6.
		ListenAddr:      nodeAddr.Addr(),
		ListenAddr6:     addr6,
		IPv6Only:        !nodeAddr.IsValid(),
		ListenPort:      port,
		ClusterID:       clusterID,
		GracefulRestart: true,
		RestartTime:     restart,
		LocalRestarting: restarting,
		APIListen:       apiListen,
	}
}

// start starts the first speaker.
func (b *bgpOwner) start(ctx context.Context, cfg bgp.Config) error {
	b.mu.Lock()
	sp := b.speaker
	b.speakerCfg = cfg
	b.mu.Unlock()
	return sp.Start(ctx, cfg)
}

// stop stops the current speaker gracefully: peers keep this node's routes
// for the restart time.
func (b *bgpOwner) stop() error { return b.current().Stop(true) }

func (b *bgpOwner) current() bgp.Speaker {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.speaker
}

// pass reconciles the speaker with the view, one part after another:
// its identity (a restart when it changed), the import and export policy,
// the peers, and the advertisements. Each part keeps going after an
// earlier one failed.
func (b *bgpOwner) pass(ctx context.Context) error {
	bc := b.view.BGPConfiguration()
	pools := b.view.Pools()
	svcs := b.serviceView()
	decisions := bgp.ServiceDecisions(*svcs)
	b.noteServiceDecisions(decisions)
	idErr := b.ensureSpeakerIdentity(ctx, bc)
	sp := b.current()
	polErr := b.reconcilePolicy(ctx, sp, pools)
	desired, peerErr := b.reconcilePeers(ctx, sp, bc)
	adv, local, advErr := b.reconcileAdvertisements(ctx, sp, pools, svcs)
	svcErr := b.reconcileServiceRoutes(decisions)
	b.mu.Lock()
	b.desiredPeers, b.advertised, b.localBlocks, b.lastPass = desired, adv, local, time.Now()
	b.mu.Unlock()
	if advErr == nil {
		b.setAdvertisedOK(adv)
	}
	return errors.Join(idErr, polErr, peerErr, advErr, svcErr)
}

// reconcilePolicy gives the speaker the pools (import), their communities
// and aggregates (export).
func (b *bgpOwner) reconcilePolicy(ctx context.Context, sp bgp.Speaker, pools []*api.IPPool) error {
	pol := bgp.Policy{Pools: b.families(poolPrefixes(pools)), Communities: bgp.PoolCommunities(pools), Aggregates: bgp.PoolAggregates(pools)}
	if err := sp.SetPolicy(ctx, pol); err != nil {
		return fmt.Errorf("setting the import policy: %w", err)
	}
	return nil
}

// reconcilePeers gives the speaker the peers DesiredPeers computes and
// returns them.
func (b *bgpOwner) reconcilePeers(ctx context.Context, sp bgp.Speaker, bc *api.BGPConfiguration) ([]bgp.Peer, error) {
	bgpPeers, filters := b.view.BGPPeers(), b.view.BGPFilters()
	b.warnUnusableFilters(bgp.UnusableFilters(bgpPeers, filters))
	nodes := b.view.Nodes()
	choice := b.electedReflectors()
	var ready map[string]time.Time
	if b.readyFor != nil {
		ready = b.readyFor()
	}
	desired, refused := bgp.PlanPeers(bgp.PeerInput{Self: b.node, Nodes: nodes, Config: bc, Peers: bgpPeers, Filters: filters, Reflectors: choice, Ready: ready})
	b.noteRefused(refused)
	lookup := b.view.BGPSecrets().Lookup
	pw := b.meshPassword(bc, lookup)
	desired, down := bgp.ResolvePasswords(desired, lookup)
	desired = bgp.WithMeshPassword(desired, pw)
	b.noteBGPProblems(down, bgp.LocalASProblems(nodes, bgpPeers))
	desired, wait := b.holdLearnedOnRotation(desired, time.Now())
	if wait > 0 {
		time.AfterFunc(wait, b.wake)
	}
	b.ensureMD5Room(desired)
	err := sp.SetPeers(ctx, desired)
	b.notePeersPlanned(choice, desired, sp)
	if err != nil {
		return desired, fmt.Errorf("setting peers: %w", err)
	}
	return desired, nil
}

// ensureMD5Room makes room for the signed peers' keys before the speaker
// sets them: the kernel refuses keys beyond net.core.optmem_max (960
// signed clients of a reflector at the default; docs/scale.md), and GoBGP
// only warns, leaving the peer's SYNs dropped. It asks again only when the
// count grows; a failure is a warning and is retried on the next pass.
func (b *bgpOwner) ensureMD5Room(desired []bgp.Peer) {
	if b.md5Room == nil {
		return
	}
	signed := 0
	for _, p := range desired {
		if p.Password != "" {
			signed++
		}
	}
	if signed <= b.md5Keys {
		return
	}
	if err := b.md5Room(signed); err != nil {
		b.log.Warn("cannot make room for the BGP sessions' TCP-MD5 keys; sessions beyond the limit will not establish", "keys", signed, "err", err)
		return
	}
	b.md5Keys = signed
}

// meshKey is the cluster's mesh key from the view. When the view loses it
// (the record deleted, or written so that it does not decode) the last
// key stays in use, with a warning: falling back to no key would turn
// every cluster session unauthenticated at once. A new key ends it.
func (b *bgpOwner) meshKey() string {
	key := b.view.BGPMeshKey()
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case key != "":
		b.lastMeshKey, b.meshKeyLost = key, false
	case b.lastMeshKey != "":
		if !b.meshKeyLost {
			b.log.Warn("the cluster's BGP mesh key is gone from the datastore; keeping the last one", "key", datastore.BGPMeshKeyKey)
			b.meshKeyLost = true
		}
		key = b.lastMeshKey
	}
	return key
}

// rotationDelay is how long a changed password waits before the sessions
// are re-created with it. Every agent's view sees the new password (a mesh
// key, a Secret) within milliseconds of the others and holds its learned
// routes from then on; a session re-created at once sends its peer a Cease,
// which GoBGP answers by dropping that peer's paths, and a peer whose own
// view was a little late (a loaded node) did not hold them yet: its routes
// to the rotating node went until the new session's UPDATEs (lost pings in
// TestMeshKeyRotationInLab). Waiting a second first makes every agent hold
// before any session goes; the session is down about as long as before.
const rotationDelay = time.Second

// holdLearnedOnRotation starts BGP's convergence over when the password
// of a session that stays changes (a mesh key rotation, a Secret rotated;
// docs/bgp.md): GoBGP re-creates a neighbour whose password changes and
// drops its paths at once, so the learned routes are held in the kernel,
// as after a start, until every peer is Established again (a cluster peer
// has sent End-of-RIB on its new session), or the settle time passed. The
// data path does not need the session, so a rotation then costs no
// traffic. It returns the peers to give the speaker: for rotationDelay
// after the change was first seen the rotated peers keep the password
// they have, and wait is how long until the new ones are due (0: desired
// as it is). Called before SetPeers.
func (b *bgpOwner) holdLearnedOnRotation(desired []bgp.Peer, now time.Time) (apply []bgp.Peer, wait time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	applied := b.passwords
	var rotated []netip.Addr
	for _, p := range desired {
		if old, ok := applied[p.Address]; ok && old != p.Password {
			rotated = append(rotated, p.Address)
		}
	}
	apply = desired
	switch {
	case len(rotated) == 0:
		b.rotatingSince = time.Time{}
	case b.rotatingSince.IsZero():
		b.rotatingSince = now
		b.restartConvergence(now)
		slices.SortFunc(rotated, netip.Addr.Compare)
		b.log.Info("bgp password changed: learned routes held; sessions are re-created with it shortly", "peers", rotated, "in", rotationDelay)
		fallthrough
	case now.Sub(b.rotatingSince) < rotationDelay:
		wait = b.rotatingSince.Add(rotationDelay).Sub(now)
		apply = slices.Clone(desired)
		for i, p := range apply {
			if old, ok := applied[p.Address]; ok {
				apply[i].Password = old
			}
		}
	default: // re-created now: convergence is timed from here
		b.rotatingSince = time.Time{}
		b.restartConvergence(now)
	}
	b.passwords = make(map[netip.Addr]string, len(apply))
	for _, p := range apply {
		b.passwords[p.Address] = p.Password
	}
	return apply, wait
}

// restartConvergence holds the learned routes until BGP converges again,
// timed from now. Called with b.mu held.
func (b *bgpOwner) restartConvergence(now time.Time) {
	b.converged, b.started, b.allUpSince = false, now, time.Time{}
	if b.table != nil {
		b.table.HoldDeletes(routetable.Learned, true)
	}
}

// reconcileAdvertisements gives the speaker what the advertisement sources
// want advertised under the view, and returns the advertised prefixes and
// this node's affine blocks.
func (b *bgpOwner) reconcileAdvertisements(ctx context.Context, sp bgp.Speaker, pools []*api.IPPool, svcs *bgp.ServiceView) (adv, local []netip.Prefix, err error) {
	affine, borrowed := bgpBlocks(b.node, b.blocks(), b.borrowed())
	v := bgp.SourceView{Affine: affine, Borrowed: borrowed, Aggregates: bgp.PoolAggregates(pools), Services: svcs}
	ads := bgp.DesiredAdvertisementsFrom(b.sources, v)
	if err = sp.SetAdvertisements(ctx, ads); err != nil {
		err = fmt.Errorf("setting advertisements: %w", err)
	}
	local = make([]netip.Prefix, 0, len(affine))
	for _, blk := range affine {
		local = append(local, blk.CIDR)
	}
	return bgp.Prefixes(ads), local, err
}

// warnUnusableFilters logs, once per change, the BGPFilters that BGPPeers
// name but that do not exist or do not validate: their rules are left out.
func (b *bgpOwner) warnUnusableFilters(problems []string) {
	if replaced(&b.mu, &b.unusableFilters, problems) {
		for _, p := range problems {
			b.log.Warn("bgp filter left out", "problem", p)
		}
	}
}

// replaced sets *last to next under mu and reports whether that changed
// it: what logs a list once per change keeps the last list this way.
func replaced[T comparable](mu *sync.Mutex, last *[]T, next []T) bool {
	mu.Lock()
	defer mu.Unlock()
	changed := !slices.Equal(next, *last)
	*last = next
	return changed
}

// setAdvertisedOK records what the speaker advertises and wakes waiters.
func (b *bgpOwner) setAdvertisedOK(adv []netip.Prefix) {
	set := make(map[netip.Prefix]bool, len(adv))
	for _, p := range adv {
		set[p] = true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advertisedOK = set
	if b.advertisedCh != nil {
		close(b.advertisedCh)
		b.advertisedCh = nil
	}
}

// waitAdvertised returns once the speaker advertises p (a block claimed or
// an address borrowed for a pod being added), kicking a pass so that it
// need not wait for the view's wake-up alone; or ctx's error.
func (b *bgpOwner) waitAdvertised(ctx context.Context, p netip.Prefix) error {
	if !p.Addr().Is4() && !b.nodeAddr6.IsValid() {
		return nil // BGP carries no IPv6 without the node's IPv6 address
	}
	select {
	case b.kick <- struct{}{}:
	default:
	}
	for {
		b.mu.Lock()
		if b.advertisedOK[p] {
			b.mu.Unlock()
			return nil
		}
		if b.advertisedCh == nil {
			b.advertisedCh = make(chan struct{})
		}
		ch := b.advertisedCh
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s to be advertised: %w", p, ctx.Err())
		case <-ch:
		}
	}
}

// ensureSpeakerIdentity restarts the speaker when this node's AS number,
// route-reflector cluster ID or router ID (routerIDFor: an IPv6-only
// node's spec.bgp.routerID) changed since it started (an operator made the
// node a reflector, say). The old speaker stops gracefully, so peers keep
// its routes until the new one has re-sent them.
func (b *bgpOwner) ensureSpeakerIdentity(ctx context.Context, bc *api.BGPConfiguration) error {
	self, ok := b.view.Node(b.node)
	if !ok {
		return nil
	}
	asn, clusterID := self.EffectiveASN(bc), b.clusterID(self, bc)
	b.mu.Lock()
	cfg := b.speakerCfg
	b.mu.Unlock()
	rid := cfg.RouterID
	if b.routerIDFor != nil {
		rid = b.routerIDFor(self)
	}
	if cfg.ASN == asn && cfg.ClusterID == clusterID && cfg.RouterID == rid {
		return nil
	}
	if b.newSpeaker == nil {
		return fmt.Errorf("bgp identity changed (AS %d → %d, cluster ID %q → %q, router ID %v → %v): restart the agent to apply it", cfg.ASN, asn, cfg.ClusterID, clusterID, cfg.RouterID, rid)
	}
	cfg.ASN, cfg.ClusterID, cfg.RouterID = asn, clusterID, rid
	cfg.LocalRestarting = true
	// The new speaker needs the old one's listening port: stop the old one
	// first (gracefully), after publishing the new one so that the
	// learned-routes loop follows it.
	next := b.newSpeaker()
	b.mu.Lock()
	old := b.speaker
	b.speaker = next
	b.mu.Unlock()
	if err := old.Stop(true); err != nil {
		b.log.Warn("stopping the previous BGP speaker", "err", err)
	}
	if err := next.Start(ctx, cfg); err != nil {
		return fmt.Errorf("restarting the BGP speaker with AS %d, cluster ID %q: %w", asn, clusterID, err)
	}
	b.mu.Lock()
	b.speakerCfg = cfg
	b.mu.Unlock()
	b.log.Info("bgp identity changed, speaker restarted", "asn", asn, "clusterID", clusterID, "router_id", rid)
	return nil
}

// electedReflectors is the choice of routeReflectorMode Auto, nil without one.
func (b *bgpOwner) electedReflectors() *bgp.ReflectorChoice {
	if b.reflectors == nil {
		return nil
	}
	return b.reflectors()
}

// clusterID is self's route-reflector cluster ID: the one an operator set,
// else its zone's when it is an elected reflector (Auto mode), else "".
func (b *bgpOwner) clusterID(self *api.Node, bc *api.BGPConfiguration) string {
	if id := self.RouteReflectorClusterID(); id != "" || !bc.AutoReflectors() {
		return id
	}
	return b.electedReflectors().ClusterIDOf(b.node)
}

// noteRefused keeps the sessions the pass could not have, and logs them
// once per change.
func (b *bgpOwner) noteRefused(refused []bgp.RefusedPeer) {
	if replaced(&b.mu, &b.refused, refused) {
		for _, r := range refused {
			b.log.Warn("bgp session refused", "peer", r.Name, "address", r.Address, "reason", r.Reason)
		}
	}
}

// importContext is what no learned route may override: this node's
// workload addresses, its blocks and its subnets, of both families, and
// the cluster's Service prefixes. The
// node's own (non-Tabby) kernel routes are the route table's to guard.
func (b *bgpOwner) importContext() bgp.ImportContext {
	var ic bgp.ImportContext
	if b.nodeAddr.IsValid() {
		ic.NodeSubnets = append(ic.NodeSubnets, b.nodeAddr.Masked())
	}
	if b.nodeAddr6.IsValid() {
		ic.NodeSubnets = append(ic.NodeSubnets, b.nodeAddr6.Masked())
	}
	for _, w := range b.view.EndpointsOn(b.node) {
		addrs, _ := w.Addrs() // entries that do not parse are skipped
		ic.Workloads = append(ic.Workloads, addrs...)
	}
	for _, blk := range b.view.BlocksOf(b.node) {
		ic.Blocks = append(ic.Blocks, blk.CIDR)
	}
	b.mu.Lock()
	ic.Services = bgp.ServicePrefixes(b.serviceDecisions) // the last pass's
	b.mu.Unlock()
	return ic
}

// syncLearned hands the route table the speaker's latest best routes,
// minus those that would override this node's own (see bgp.FilterLearned),
// as the learned class, and applies it. It reads only memory (and the
// kernel at the table's periodic resync), so a new route set lands at once.
func (b *bgpOwner) syncLearned() (int, error) {
	b.learnedMu.Lock()
	defer b.learnedMu.Unlock()
	ic := b.importContext()
	b.mu.Lock()
	kept, rejected := bgp.FilterLearned(b.learned, ic)
	learned := desiredLearnedRoutes([]netip.Addr{b.nodeAddr.Addr(), b.nodeAddr6.Addr()}, kept)
	converged := b.converged
	newlyRejected := !slices.EqualFunc(rejected, b.rejected, func(x, y bgp.Rejected) bool { return x.Route.Prefix == y.Route.Prefix && x.Over == y.Over })
	b.importCtx, b.rejected = ic, rejected
	b.mu.Unlock()
	if newlyRejected {
		for _, r := range rejected {
			b.log.Warn("learned route not installed: it would override this node's own", "prefix", r.Route.Prefix, "over", r.Over, "nexthops", r.Route.NextHops)
		}
	}
	b.table.HoldDeletes(routetable.Learned, !converged)
	err := b.table.SetClass(routetable.Learned, learned)
	err = errors.Join(err, b.table.Apply(routetable.Learned))
	suppressed := b.table.Suppressed()
	b.logSuppressed(suppressed)
	b.metrics.routes.WithLabelValues("bgp-rejected").Set(float64(len(rejected) + len(suppressed)))
	if err != nil {
		return len(learned), fmt.Errorf("learned routes: %w", err)
	}
	b.metrics.routes.WithLabelValues("bgp").Set(float64(len(learned)))
	return len(learned), nil
}

// importChanged reports whether what learned routes must not override
// changed since the last sync (a new local pod or block; a node route that
// kept a learned route off its destination came or went).
func (b *bgpOwner) importChanged() bool {
	ic := b.importContext()
	nodeChanged, err := false, error(nil)
	if b.table != nil {
		if nodeChanged, err = b.table.RefreshNodeRoutes(); err != nil {
			b.log.Warn("reading the node's own routes", "err", err)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return nodeChanged || !reflect.DeepEqual(ic, b.importCtx)
}

// logSuppressed logs, once per change, the learned routes the route table
// keeps off the node's own routes.
func (b *bgpOwner) logSuppressed(dsts []netip.Prefix) {
	if replaced(&b.mu, &b.suppressed, dsts) {
		for _, p := range dsts {
			b.log.Warn("learned route not installed: it would override this node's own", "prefix", p, "over", p)
		}
	}
}

// learnedLoop installs BGP's best routes as the speaker delivers them and
// retries a failed install every second. The session poll that decides
// when BGP has converged runs beside it (statusLoop): the speaker's
// session listing can wait seconds on GoBGP while it resets a session,
// and a route set (a BFD peer's withdrawal) must not wait for it.
func (b *bgpOwner) learnedLoop(ctx context.Context) {
	wake := make(chan struct{}, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); b.statusLoop(ctx, wake) }()
	defer wg.Wait()
	// retry runs only while an install has failed: an idle agent does
	// not wake for it.
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	sp := b.current()
	routes := sp.Routes()
	// delivered is when the oldest route set not yet installed came:
	// tabby_reconcile_duration_seconds{loop="learned"} times from it to
	// the kernel (docs/scale.md, "Where block → route goes").
	var delivered time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case rs, ok := <-routes:
			if !ok {
				// Stop closes the channel: follow a replacement speaker.
				next := b.current()
				if next == sp {
					return
				}
				sp, routes = next, next.Routes()
				continue
			}
			b.mu.Lock()
			b.learned, b.learnedAny = rs, true
			b.learnedSets++
			b.mu.Unlock()
			if delivered.IsZero() {
				delivered = time.Now()
			}
		case <-wake:
		case <-retry.C:
		}
		_, err := b.syncLearned()
		if !delivered.IsZero() {
			b.metrics.observeReconcile("learned", time.Since(delivered), err)
		}
		if err != nil {
			b.log.Warn("installing learned routes failed; retrying", "err", err)
			retry.Reset(time.Second)
			continue
		}
		retry.Stop()
		delivered = time.Time{}
	}
}

// statusLoop follows the sessions and decides when BGP has converged.
// Session states come from the speaker's own record of GoBGP's events
// (Sessions, which asks GoBGP nothing): read at once when the speaker
// signals a change, and on a tick, often until BGP has converged after
// the start (or a mesh key rotation), then every statusEvery, which also
// bounds how late a change of what learned routes must not override is
// seen. The prefixes each peer sent are counted by GoBGP's peer listing
// (Peers), which stops every session while it counts: see countDue. It
// wakes learnedLoop when BGP converged (stale routes can go) or when what
// learned routes must not override changed.
func (b *bgpOwner) statusLoop(ctx context.Context, wake chan<- struct{}) {
	t := time.NewTicker(convergingEvery)
	defer t.Stop()
	slow := false
	var last bgp.Speaker
	for {
		sp := b.current()
		changed := sp != last
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-sp.SessionsChanged():
			b.mu.Lock()
			b.counts.sessionsChanged = true
			gap := sessionReadGap(len(b.desiredPeers))
			b.mu.Unlock()
			changed = true
			// Let the events of the next moments coalesce (the channel
			// holds one signal) before reading every session.
			if gap > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(gap):
				}
			}
		}
		last = sp
		if b.countIf(ctx, sp, (*prefixCounts).due) {
			changed = true
		}
		// Once converged, a tick with nothing new reads nothing: on a
		// reflector the sessions are a thousand.
		dirty := false
		if changed || !b.isConverged() {
			dirty = b.updatePeerStatus(sp)
		}
		if converged := b.isConverged(); !slow && converged {
			t.Reset(statusEvery)
			slow = true
		} else if slow && !converged { // converging again: a mesh key rotation
			t.Reset(convergingEvery)
			slow = false
		}
		b.checkReflectorReady(ctx)
		if b.importChanged() {
			dirty = true
		}
		if dirty {
			select {
			case wake <- struct{}{}:
			default:
			}
		}
	}
}

// The session status tick: convergingEvery until BGP has converged, then
// statusEvery. Neither asks GoBGP anything (see statusLoop).
const (
	convergingEvery = 500 * time.Millisecond
	statusEvery     = 2 * time.Second
)

// sessionReadGap is how long statusLoop lets session events coalesce
// before it reads the sessions: nothing up to 100 peers, then 50 µs a
// peer (50 ms at 1,000). Each read is O(peers) (Sessions, the comparison
// with the last status, convergence); a reflector whose clients come and
// go gets session events by the dozen a second, and read the thousand
// sessions for each (6 % of a 1,000-client reflector's CPU in such a
// rest, docs/scale.md).
func sessionReadGap(peers int) time.Duration {
	return time.Duration(max(0, peers-100)) * 50 * time.Microsecond
}

// prefixCounts decides when statusLoop has GoBGP count the prefixes each
// peer sent (Peers); the owner's mu guards it. GoBGP counts every peer's Adj-RIB-In (2,048 table
// shards a peer) while it holds the server's write lock, stopping every
// session's UPDATE handling; polled every 2 s it was a tenth of an idle
// client's CPU at 1,000 nodes and of a reflector's with 300 clients. So
// the counts are taken soon after a change that may have changed them (a
// session event, a new learned route set), when the status API or a
// metrics scrape asks (refreshCounts), and otherwise every countEvery, the
// bound on how stale they may be in the published status (docs/bgp.md).
type prefixCounts struct {
	at              time.Time // last count
	sets            uint64    // route sets delivered by then
	sessionsChanged bool      // a session event since
}

// due reports whether a count is due at now with that many peers and
// route sets delivered so far.
func (c *prefixCounts) due(now time.Time, peers int, sets uint64) bool {
	since := now.Sub(c.at)
	changed := c.sessionsChanged || sets != c.sets
	return since >= countEvery(peers) || (changed && since >= countSoon(peers))
}

func (c *prefixCounts) counted(now time.Time, sets uint64) {
	c.at, c.sets, c.sessionsChanged = now, sets, false
}

// countEvery is the interval of the counts while nothing changes: 30 s,
// and 60 ms a peer beyond 500 peers. countSoon is the least interval
// between counts after changes: 2 s, and 10 ms a peer beyond 200 (the
// session poll's pace before it stopped counting).
func countEvery(peers int) time.Duration {
	return max(30*time.Second, time.Duration(peers)*60*time.Millisecond)
}

func countSoon(peers int) time.Duration {
	return max(2*time.Second, time.Duration(peers)*10*time.Millisecond)
}

// fresh reports whether the counts are older than countSoon: whoever
// shows them (the status API, a metrics scrape) has them taken again.
func (c *prefixCounts) fresh(now time.Time, peers int, _ uint64) bool {
	return now.Sub(c.at) >= countSoon(peers)
}

// countIf has GoBGP count the prefixes each peer sent when due says so;
// it reports whether it did.
func (b *bgpOwner) countIf(ctx context.Context, sp bgp.Speaker, due func(*prefixCounts, time.Time, int, uint64) bool) bool {
	now := time.Now()
	b.mu.Lock()
	ok, sets := due(&b.counts, now, len(b.desiredPeers), b.learnedSets), b.learnedSets
	if ok {
		b.counts.counted(now, sets) // one caller at a time counts
	}
	b.mu.Unlock()
	if ok {
		b.countPrefixes(ctx, sp)
	}
	return ok
}

// refreshCounts counts the prefixes each peer sent unless the last count
// is recent (countSoon), and updates the status and the metrics with
// them: the status API and the metrics scrape call it, so what they show
// is at most countSoon old.
func (b *bgpOwner) refreshCounts(ctx context.Context) {
	b.countIf(ctx, b.current(), (*prefixCounts).fresh)
	b.mu.Lock()
	defer b.mu.Unlock()
	st := slices.Clone(b.peerStatus)
	b.setPeerStatus(st)
	b.peerStatus = st
}

// setPeerStatus puts the last counts into st and passes st to the metrics
// when it differs from the last status. Called with b.mu held.
func (b *bgpOwner) setPeerStatus(st []bgp.PeerStatus) {
	for i := range st {
		st[i].Received = b.received[st[i].Address]
	}
	if !slices.EqualFunc(st, b.peerStatus, equalPeerStatus) {
		b.metrics.setPeers(st)
	}
}

func (b *bgpOwner) peerCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.desiredPeers)
}

// countPrefixes records the prefixes each peer sent, from the speaker's
// counting peer listing.
func (b *bgpOwner) countPrefixes(ctx context.Context, sp bgp.Speaker) {
	st, err := sp.Peers(ctx)
	if err != nil {
		b.log.Debug("counting received prefixes", "err", err)
		return
	}
	counts := make(map[netip.Addr]uint32, len(st))
	for _, p := range st {
		counts[p.Address] = p.Received
	}
	b.mu.Lock()
	b.received = counts
	b.mu.Unlock()
}

// updatePeerStatus takes the speaker's sessions, with the last counts of
// received prefixes; it returns true when BGP has just converged.
func (b *bgpOwner) updatePeerStatus(sp bgp.Speaker) bool {
	st := sp.Sessions()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.setPeerStatus(st)
	b.statusSpeaker = sp
	if b.observe(st, time.Now(), !b.lastPass.IsZero(), b.learnedAny) {
		b.log.Info("bgp converged; stale learned routes will be removed")
		return true
	}
	return false
}

// equalPeerStatus reports whether two statuses are the same.
func equalPeerStatus(x, y bgp.PeerStatus) bool {
	return x.Address == y.Address && x.Type == y.Type && x.State == y.State && x.Since.Equal(y.Since) &&
		x.Info == y.Info && x.PrefixLimitExceeded == y.PrefixLimitExceeded && x.Received == y.Received &&
		x.MaxPrefixes == y.MaxPrefixes && x.BFD == y.BFD && slices.Equal(x.Families, y.Families) && x.Syncing == y.Syncing
}

// observe takes the sessions' states polled at now; passed says the owner
// has completed a pass, learnedAny that a speaker has delivered a route
// set. It returns true when BGP has just converged. Called with b.mu held.
func (s *bgpSessions) observe(st []bgp.PeerStatus, now time.Time, passed, learnedAny bool) bool {
	s.peerStatus = st
	if s.converged {
		return false
	}
	allUp := len(s.desiredPeers) > 0 || passed
	est := s.established()
	syncing := map[netip.Addr]bool{}
	for _, p := range st {
		syncing[p.Address] = p.Syncing
	}
	for _, p := range s.desiredPeers {
		// A cluster peer (a Tabby agent, which sends End-of-RIB) that
		// restarted sends its routes only after its own deferral: until
		// its End-of-RIB the routes it had are still coming, and the
		// stale ones must stay.
		if !est[p.Address] || (clusterPeer(p.Type) && syncing[p.Address]) {
			allUp = false
		}
	}
	switch {
	case !allUp:
		s.allUpSince = time.Time{}
	case s.allUpSince.IsZero():
		s.allUpSince = now
	}
	// Until the speaker's first route set (which after a restart waits for
	// the peers' End-of-RIB) the learned set is empty, not complete.
	if (learnedAny && !s.allUpSince.IsZero() && now.Sub(s.allUpSince) >= convergeHold) || now.Sub(s.started) >= s.settle {
		s.converged = true
		return true
	}
	return false
}

// established are the peers whose session was Established when last
// polled. Called with b.mu held.
func (s *bgpSessions) established() map[netip.Addr]bool {
	est := map[netip.Addr]bool{}
	for _, p := range s.peerStatus {
		if p.State == session.Established {
			est[p.Address] = true
		}
	}
	return est
}

// ready reports an error before the first pass and when cluster peers are
// configured and none is Established.
func (b *bgpOwner) ready() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.readiness(!b.lastPass.IsZero())
}

// readiness is ready's answer; passed says the owner has completed a
// pass. Called with b.mu held.
func (s *bgpSessions) readiness(passed bool) error {
	// Before the first pass the desired peers are not known: "no peers"
	// would read as "none configured" and a restarted agent would report
	// ready before opening any session.
	if !passed {
		return errors.New("BGP peers not configured yet")
	}
	est := s.established()
	cluster := 0
	for _, p := range s.desiredPeers {
		if !clusterPeer(p.Type) {
			continue // a router outside the cluster
		}
		cluster++
		if est[p.Address] {
			return nil
		}
	}
	if cluster == 0 {
		return nil
	}
	return fmt.Errorf("no BGP session to any of %d cluster peers is established", cluster)
}

// clusterPeer reports whether a peer of type t is another node's agent.
func clusterPeer(t bgp.PeerType) bool {
	return t == bgp.PeerMesh || t == bgp.PeerRR || t == bgp.PeerRRClient
}

// poolPrefixes returns the CIDRs of the pools of both families: the
// prefixes cluster peers may send. A disabled pool counts: its blocks
// still hold pods.
func poolPrefixes(pools []*api.IPPool) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range pools {
		if pc, err := netip.ParsePrefix(p.Spec.CIDR); err == nil {
			out = append(out, pc.Masked())
		}
	}
	return out
}

// families keeps the prefixes of the families BGP carries: IPv4, and IPv6
// when the node has an IPv6 address.
func (b *bgpOwner) families(ps []netip.Prefix) []netip.Prefix {
	if b.nodeAddr6.IsValid() {
		return ps
	}
	return slices.DeleteFunc(slices.Clone(ps), func(p netip.Prefix) bool { return !p.Addr().Is4() })
}

func (b *bgpOwner) isConverged() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.converged
}

// blocks are this node's blocks of the families BGP carries (see families).
func (b *bgpOwner) blocks() []ipam.BlockInfo {
	bs := b.view.BlocksOf(b.node)
	if b.nodeAddr6.IsValid() {
		return bs
	}
	return slices.DeleteFunc(slices.Clone(bs), func(b ipam.BlockInfo) bool { return !b.CIDR.Addr().Is4() })
}

// borrowed are the addresses this node borrowed, of the families BGP
// carries.
func (b *bgpOwner) borrowed() []ipam.BorrowedAddr {
	bs := b.view.BorrowedBy(b.node)
	if b.nodeAddr6.IsValid() {
		return bs
	}
	return slices.DeleteFunc(slices.Clone(bs), func(b ipam.BorrowedAddr) bool { return !b.Addr.Is4() })
}
