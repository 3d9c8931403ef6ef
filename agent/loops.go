package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// watchLoop wakes the reconcile loops on every datastore change that can
// affect them. It carries no state: the loops re-read what they need.
func (a *Agent) watchLoop(ctx context.Context) {
	res := a.store.Watch(ctx, "resources/", 0)
	ipamEv := a.store.Watch(ctx, "ipam/", 0)
	for {
		var ev datastore.Event
		var ok bool
		select {
		case <-ctx.Done():
			return
		case ev, ok = <-res:
		case ev, ok = <-ipamEv:
		}
		if !ok {
			return
		}
		routing, bgpLoop := a.affects(ev)
		if routing {
			kick(a.routingKick)
		}
		if bgpLoop {
			kick(a.bgpKick)
		}
	}
}

// affects says which loops a datastore change can concern, so that the
// churn of other nodes' pods does not wake every agent's loops.
func (a *Agent) affects(ev datastore.Event) (routing, bgpLoop bool) {
	if ev.Type == datastore.EventResync {
		return true, true
	}
	key := ev.KV.Key
	switch {
	case strings.HasPrefix(key, "ipam/handles/"):
		return false, false // handles never change routes
	case strings.HasPrefix(key, "ipam/affinities/"):
		mine := strings.HasPrefix(key, "ipam/affinities/"+a.cfg.NodeName+"/")
		return mine, mine
	case strings.HasPrefix(key, "ipam/"):
		return true, true // a block: ours, or one we borrow from
	}
	if kind, _, name, ok := datastore.ParseResourceKey(key); ok && kind == api.KindWorkloadEndpoint {
		// Endpoint names start with their node's name (endpointName);
		// only this node's endpoints have routes here. The periodic
		// resync covers anything this misjudges.
		return strings.HasPrefix(name, strings.ToLower(a.cfg.NodeName)+"-"), false
	}
	return true, true
}

// coalesceWindow is how long a loop waits after being woken before its
// pass, so that related changes are handled together.
const coalesceWindow = 20 * time.Millisecond

// loop runs pass whenever kicked and at least every resync interval,
// retrying failed passes with backoff.
func (a *Agent) loop(ctx context.Context, name string, kickCh chan struct{}, pass func(context.Context) error) {
	t := time.NewTicker(a.cfg.ResyncInterval)
	defer t.Stop()
	failures := 0
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-kickCh:
			// A burst of changes (a pod's endpoint, address and block
			// writes) becomes one pass.
			select {
			case <-ctx.Done():
				return
			case <-time.After(coalesceWindow):
			}
			select {
			case <-kickCh:
			default:
			}
		case <-t.C:
		case <-retry:
		}
		retry = nil
		pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		start := time.Now()
		err := pass(pctx)
		cancel()
		a.metrics.observeReconcile(name, time.Since(start), err)
		if err != nil && ctx.Err() == nil {
			failures++
			a.log.Warn("reconcile pass failed", "loop", name, "failures", failures, "err", err)
			retry = time.After(backoff(failures))
			continue
		}
		failures = 0
	}
}

func (a *Agent) routingLoop(ctx context.Context) {
	a.loop(ctx, "routing", a.routingKick, a.routingPass)
}

func (a *Agent) bgpLoop(ctx context.Context) {
	a.loop(ctx, "bgp", a.bgpKick, a.bgpPass)
}

// routingPass makes the kernel's routes with our protocols equal to what
// the datastore (local workloads, affine blocks) and BGP say.
func (a *Agent) routingPass(ctx context.Context) error {
	objs, _, err := a.store.List(ctx, api.KindWorkloadEndpoint, "")
	if err != nil {
		return fmt.Errorf("listing endpoints: %w", err)
	}
	weps := make([]*api.WorkloadEndpoint, 0, len(objs))
	n := 0
	for _, o := range objs {
		w := o.(*api.WorkloadEndpoint)
		if w.Spec.Node == a.cfg.NodeName {
			weps = append(weps, w)
			n++
		}
	}
	blocks, err := a.ipam.Blocks(ctx)
	if err != nil {
		return fmt.Errorf("listing blocks: %w", err)
	}
	a.mu.Lock()
	a.lastStoreOK = time.Now()
	a.workloads = n
	a.mu.Unlock()

	var errs []error
	local := desiredLocalRoutes(a.cfg.NodeName, weps, blocks)
	// ADD can add its route after this pass read the endpoints: keep the
	// routes of interfaces being wired, asking at delete time.
	inflight := keepRoutes{a.routes, func(r dataplane.Route) bool { return r.Dev != "" && a.inflightDevs()[r.Dev] }}
	if err := ignoreNoDevice(dataplane.SyncRoutes(inflight, dataplane.RouteProtoWorkload, local)); err != nil {
		errs = append(errs, fmt.Errorf("workload routes: %w", err))
	}

	nLearned, err := a.syncLearned()
	if err != nil {
		errs = append(errs, err)
	}
	a.metrics.routes.WithLabelValues("workload").Set(float64(len(local)))
	a.metrics.routes.WithLabelValues("bgp").Set(float64(nLearned))
	a.mu.Lock()
	a.lastRouting = time.Now()
	a.mu.Unlock()
	return errors.Join(errs...)
}

// keepRoutes is a Routes that does not delete the routes keep picks; the
// sync still adds and replaces everything it wants.
type keepRoutes struct {
	dataplane.Routes
	keep func(dataplane.Route) bool
}

func (k keepRoutes) Delete(r dataplane.Route) error {
	if k.keep(r) {
		return nil
	}
	return k.Routes.Delete(r)
}

// ignoreNoDevice drops errors about routes whose device is gone: a workload
// deleted while the pass ran. Its endpoint is gone too by the next pass.
func ignoreNoDevice(err error) error {
	if err == nil {
		return nil
	}
	multi, ok := err.(interface{ Unwrap() []error })
	if !ok {
		if errors.Is(err, dataplane.ErrNoDevice) {
			return nil
		}
		return err
	}
	var keep []error
	for _, e := range multi.Unwrap() {
		if e = ignoreNoDevice(e); e != nil {
			keep = append(keep, e)
		}
	}
	return errors.Join(keep...)
}

// syncLearned makes the kernel's BGP routes (protocol RouteProtoBGP) equal
// to the speaker's latest best routes. It reads only memory and the kernel,
// so a new route set lands at once, without a datastore round trip.
func (a *Agent) syncLearned() (int, error) {
	a.learnedSyncMu.Lock()
	defer a.learnedSyncMu.Unlock()
	a.mu.Lock()
	learned := desiredLearnedRoutes(a.nodeAddr.Addr(), a.learned)
	converged := a.converged
	a.mu.Unlock()
	var r dataplane.Routes = a.routes
	if !converged {
		// Until BGP has converged after a start, learned routes already in
		// the kernel stay, so that a restart does not cut traffic.
		r = keepRoutes{a.routes, func(dataplane.Route) bool { return true }}
	}
	if err := dataplane.SyncRoutes(r, dataplane.RouteProtoBGP, learned); err != nil {
		return len(learned), fmt.Errorf("learned routes: %w", err)
	}
	return len(learned), nil
}

// bgpPass reconciles the speaker's peers and advertisements with the
// datastore, and releases the blocks of nodes that are gone.
func (a *Agent) bgpPass(ctx context.Context) error {
	nodeObjs, _, err := a.store.List(ctx, api.KindNode, "")
	if err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	peerObjs, _, err := a.store.List(ctx, api.KindBGPPeer, "")
	if err != nil {
		return fmt.Errorf("listing BGP peers: %w", err)
	}
	bc, err := a.bgpConfiguration(ctx)
	if err != nil {
		return err
	}
	blocks, borrowed, err := a.ipam.BGPState(ctx)
	if err != nil {
		return fmt.Errorf("listing blocks: %w", err)
	}
	nodes := make([]*api.Node, 0, len(nodeObjs))
	names := map[string]bool{}
	for _, o := range nodeObjs {
		n := o.(*api.Node)
		nodes = append(nodes, n)
		names[n.Metadata.Name] = true
	}
	peers := make([]*api.BGPPeer, 0, len(peerObjs))
	for _, o := range peerObjs {
		peers = append(peers, o.(*api.BGPPeer))
	}

	var errs []error
	if err := a.ensureSpeakerIdentity(ctx, nodes, bc); err != nil {
		errs = append(errs, err)
	}
	sp := a.currentSpeaker()
	desired := bgp.DesiredPeers(a.cfg.NodeName, nodes, bc, peers)
	if err := sp.SetPeers(ctx, desired); err != nil {
		errs = append(errs, fmt.Errorf("setting peers: %w", err))
	}
	affine, borrowedBlocks := bgpBlocks(a.cfg.NodeName, blocks, borrowed)
	adv := bgp.DesiredAdvertisements(affine, borrowedBlocks)
	if err := sp.SetAdvertised(ctx, adv); err != nil {
		errs = append(errs, fmt.Errorf("setting advertisements: %w", err))
	}
	var local []netip.Prefix
	for _, b := range affine {
		local = append(local, b.CIDR)
	}
	a.mu.Lock()
	a.desiredPeers = desired
	a.advertised = adv
	a.localBlocks = local
	a.lastStoreOK = time.Now()
	a.lastBGP = time.Now()
	a.mu.Unlock()

	if err := a.releaseGoneNodes(ctx, names, blocks); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// NodeGCGrace is how long a deleted node's addresses stay allocated after
// its block affinities were released (its pods may still be draining).
var NodeGCGrace = 5 * time.Minute

// releaseGoneNodes releases the affinities of nodes that no longer exist and,
// after NodeGCGrace, their addresses. Every agent may do it; IPAM's
// compare-and-swap writes make concurrent releases safe.
func (a *Agent) releaseGoneNodes(ctx context.Context, names map[string]bool, blocks []ipam.BlockInfo) error {
	now := time.Now()
	var errs []error
	// List skips a record that does not decode: ask for each node missing
	// from it whether its key is really gone. known is false when the
	// datastore did not say.
	type verdict struct{ gone, known bool }
	checked := map[string]verdict{}
	isGone := func(n string) verdict {
		if v, ok := checked[n]; ok {
			return v
		}
		v := verdict{known: true}
		key, err := datastore.ResourceKey(api.KindNode, "", n)
		if err == nil {
			_, err = a.store.GetKV(ctx, key)
		}
		switch {
		case errors.Is(err, datastore.ErrNotFound):
			v.gone = true
		case err != nil:
			v.known = false
			errs = append(errs, fmt.Errorf("checking that node %s is gone: %w", n, err))
		}
		checked[n] = v
		return v
	}
	// Affinities go at once: the node will not use its blocks again.
	for _, b := range blocks {
		if b.Affinity == "" || names[b.Affinity] || !isGone(b.Affinity).gone {
			continue
		}
		n := b.Affinity
		a.mu.Lock()
		if _, seen := a.missingNodes[n]; !seen {
			a.missingNodes[n] = now
		}
		a.mu.Unlock()
		if err := a.ipam.ReleaseNode(ctx, n, false); err != nil {
			errs = append(errs, fmt.Errorf("releasing blocks of deleted node %s: %w", n, err))
			continue
		}
		a.log.Info("released block affinities of deleted node", "node", n)
	}
	// Addresses go after the grace period, counted from when the node was
	// first seen gone (its pods may still be draining).
	a.mu.Lock()
	missing := maps.Clone(a.missingNodes)
	a.mu.Unlock()
	var due []string
	for n, first := range missing {
		v := verdict{gone: false, known: true}
		if !names[n] {
			v = isGone(n)
		}
		switch {
		case !v.known:
		case !v.gone:
			a.mu.Lock()
			delete(a.missingNodes, n) // it came back, or never went
			a.mu.Unlock()
		case now.Sub(first) >= NodeGCGrace:
			due = append(due, n)
		}
	}
	for _, n := range due {
		if err := a.ipam.ReleaseNode(ctx, n, true); err != nil {
			errs = append(errs, fmt.Errorf("releasing addresses of deleted node %s: %w", n, err))
			continue
		}
		a.log.Info("released addresses of deleted node", "node", n)
		a.mu.Lock()
		delete(a.missingNodes, n)
		a.mu.Unlock()
	}
	return errors.Join(errs...)
}

// learnedLoop takes BGP's best routes into the routing loop and decides
// when BGP has converged after a start.
func (a *Agent) learnedLoop(ctx context.Context) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	sp := a.currentSpeaker()
	routes := sp.Routes()
	for {
		select {
		case <-ctx.Done():
			return
		case rs, ok := <-routes:
			if !ok {
				// Stop closes the channel: follow a replacement speaker.
				next := a.currentSpeaker()
				if next == sp {
					return
				}
				sp, routes = next, next.Routes()
				continue
			}
			a.mu.Lock()
			a.learned, a.learnedAny = rs, true
			a.mu.Unlock()
			if _, err := a.syncLearned(); err != nil {
				a.log.Warn("installing learned routes failed; the routing loop retries", "err", err)
				kick(a.routingKick)
			}
		case <-t.C:
			a.updatePeerStatus(ctx)
		}
	}
}

// convergeHold is how long every desired peer must have been Established
// before stale learned routes from before a restart are removed.
const convergeHold = 3 * time.Second

func (a *Agent) updatePeerStatus(ctx context.Context) {
	st, err := a.currentSpeaker().Peers(ctx)
	if err != nil {
		return
	}
	a.metrics.setPeers(st)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.peerStatus = st
	if a.converged {
		return
	}
	allUp := len(a.desiredPeers) > 0 || !a.lastBGP.IsZero()
	est := map[netip.Addr]bool{}
	for _, p := range st {
		if p.State == "Established" {
			est[p.Address] = true
		}
	}
	for _, p := range a.desiredPeers {
		if !est[p.Address] {
			allUp = false
		}
	}
	now := time.Now()
	switch {
	case !allUp:
		a.allUpSince = time.Time{}
	case a.allUpSince.IsZero():
		a.allUpSince = now
	}
	// Until the speaker's first route set (which after a restart waits for
	// the peers' End-of-RIB) the learned set is empty, not complete.
	if (a.learnedAny && !a.allUpSince.IsZero() && now.Sub(a.allUpSince) >= convergeHold) || now.Sub(a.started) >= a.cfg.BGPSettleTime {
		a.converged = true
		a.log.Info("bgp converged; stale learned routes will be removed")
		kick(a.routingKick)
	}
}

// statusLoop publishes this node's BGP session states to the datastore
// under the liveness lease, so that any node can show the whole cluster.
func (a *Agent) statusLoop(ctx context.Context) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	var last []byte
	var lastLease datastore.LeaseID
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st := a.Status()
		b, err := marshalStatus(st)
		a.mu.Lock()
		lease := a.statusLease
		a.mu.Unlock()
		// A new lease means the old one expired and took the record with it.
		if err != nil || (slices.Equal(b, last) && lease == lastLease) {
			continue
		}
		if _, err := a.store.PutKV(ctx, "status/bgp/"+a.cfg.NodeName, b, lease); err != nil {
			if !errors.Is(err, context.Canceled) {
				a.log.Debug("publishing status failed", "err", err)
			}
			continue
		}
		last, lastLease = b, lease
	}
}

func (a *Agent) currentSpeaker() bgp.Speaker {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.speaker
}

// ensureSpeakerIdentity restarts the speaker when this node's AS number or
// route-reflector cluster ID changed since it started (an operator made the
// node a reflector, say). The old speaker stops gracefully, so peers keep
// its routes until the new one has re-sent them.
func (a *Agent) ensureSpeakerIdentity(ctx context.Context, nodes []*api.Node, bc *api.BGPConfiguration) error {
	var self *api.Node
	for _, n := range nodes {
		if n.Metadata.Name == a.cfg.NodeName {
			self = n
		}
	}
	if self == nil {
		return nil
	}
	asn, clusterID := self.EffectiveASN(bc), self.RouteReflectorClusterID()
	a.mu.Lock()
	cfg := a.speakerCfg
	a.mu.Unlock()
	if cfg.ASN == asn && cfg.ClusterID == clusterID {
		return nil
	}
	if a.newSpeaker == nil {
		return fmt.Errorf("bgp identity changed (AS %d → %d, cluster ID %q → %q): restart the agent to apply it", cfg.ASN, asn, cfg.ClusterID, clusterID)
	}
	cfg.ASN, cfg.ClusterID = asn, clusterID
	cfg.LocalRestarting = true
	// The new speaker needs the old one's listening port: stop the old one
	// first (gracefully), after publishing the new one so that the
	// learned-routes loop follows it.
	next := a.newSpeaker()
	a.mu.Lock()
	old := a.speaker
	a.speaker = next
	a.mu.Unlock()
	if err := old.Stop(true); err != nil {
		a.log.Warn("stopping the previous BGP speaker", "err", err)
	}
	if err := next.Start(ctx, cfg); err != nil {
		return fmt.Errorf("restarting the BGP speaker with AS %d, cluster ID %q: %w", asn, clusterID, err)
	}
	a.mu.Lock()
	a.speakerCfg = cfg
	a.mu.Unlock()
	a.log.Info("bgp identity changed, speaker restarted", "asn", asn, "clusterID", clusterID)
	return nil
}
