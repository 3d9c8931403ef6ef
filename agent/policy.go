package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/policy"
	"github.com/tabbynet/tabby/syncer"
)

// policyOwner keeps the node's firewall equal to the policy compiled from
// the view. Passes are serialised and coalesced: a caller that needs its
// change in place (CNI ADD) waits for a pass that started after it asked,
// and concurrent callers share one pass. A pass whose compiled state equals
// the last one applied leaves the kernel alone, except the periodic pass,
// which repairs drift.
type policyOwner struct {
	node string
	view *syncer.Syncer
	fw   dataplane.Firewall
	log  *slog.Logger
	sub  *syncer.Signal
	kick chan struct{}

	requested sync.Mutex // guards reqGen
	reqGen    uint64

	passMu  sync.Mutex // held while a pass runs; guards the fields below
	doneGen uint64     // reqGen as read when the last finished pass started
	lastErr error
	warned  []string
	last    dataplane.ApplyStats
	lastAt  time.Time
	applied *policy.Ruleset // what the last successful Apply programmed
	// published is applied, for readers outside passes (the what-if API).
	published atomic.Pointer[policy.Ruleset]
	// toHost and protected are the endpoint-to-host action and the ports
	// no pod may reach (policy.Input).
	toHost    string
	protected []policy.HostPort
	// agentPorts are the agent's own ports for the node guard
	// (Config.AgentPorts).
	agentPorts []uint16
	okOnce     bool
	passes     int
	// resync is the periodic passes' interval (Config.ResyncInterval);
	// relistAt is when the last pass that compiled from every endpoint
	// started, and relists counts those passes (relistDue).
	resync   time.Duration
	relistAt time.Time
	relists  int
	// now is time.Now, or a test's clock.
	now func() time.Time
	// host configures host endpoints; hostSt is what the last pass saw
	// of this node's.
	host   hostConfig
	hostMu sync.Mutex // guards hostSt, which Status reads during passes
	hostSt []api.HostEndpointStatus
	// compiler carries the work of one pass over to the next: a change
	// recompiles what it touches, and unchanged chains and sets are the
	// very objects of the last pass, which the firewall skips by identity.
	compiler *policy.Compiler
	// onApplied, when set, is told of every ruleset the firewall now
	// enforces (flow logs map log prefixes to rules with it).
	onApplied func(*policy.Ruleset)
	// eps holds the endpoint changes for the next pass and decides which
	// wake it (policyendpoints.go).
	eps endpointLog
	// guard and tunnel are the node and tunnel guards of the last pass,
	// computed again (O(nodes)) only when guardsDirty: a node, pool, peer
	// or BGP configuration that changes them came in since.
	guard       policy.NodeGuard
	tunnel      *policy.TunnelGuard
	guardsDirty atomic.Bool
}

// policyRelistAfter is how long the periodic passes compile the endpoint
// changes since the last pass before one compiles from every endpoint of
// the view: every 5 minutes (the 10th pass at the default 30 s resync), or
// every periodic pass when they are further apart. Each periodic pass
// applies the compiled state in full (the kernel's repair); a re-list only
// guards against an endpoint change the owner's log missed, none known,
// and it costs in proportion to the cluster's endpoints: ≈ 3-6 ms of CPU
// and a collection brought forward at 30,000 (docs/scale.md, "Idle at
// 1,000"). Wall time, not a count of passes: a count follows the resync
// interval (10 passes of a 10-minute resync would be 100 minutes).
const policyRelistAfter = 5 * time.Minute

// relistDue reports whether a periodic pass starting at now compiles from
// every endpoint: policyRelistAfter has passed since the last pass that
// did, give or take half a resync interval: the pass nearest to it does,
// whichever side of it its tick falls on (the 10th at 30 s, not the 11th
// for a tick a millisecond early), and with a resync of 200 s or more
// (1.5 intervals ≥ policyRelistAfter) every periodic pass does.
func (p *policyOwner) relistDue(now time.Time) bool {
	return now.Sub(p.relistAt) >= policyRelistAfter-p.resync/2
}

// guarding is a filter that takes what pred takes (everything when nil)
// and marks the guards to be computed again when it does.
func guarding[T syncer.Value](p *policyOwner, pred func(syncer.Update[T]) bool) func(syncer.Update[T]) bool {
	return func(u syncer.Update[T]) bool {
		if pred != nil && !pred(u) {
			return false
		}
		p.guardsDirty.Store(true)
		return true
	}
}

func newPolicyOwner(node string, view *syncer.Syncer, fw dataplane.Firewall, log *slog.Logger) *policyOwner {
	p := &policyOwner{node: node, view: view, fw: fw, log: log, kick: make(chan struct{}, 1), compiler: policy.NewCompiler(), now: time.Now}
	p.guardsDirty.Store(true)
	p.eps.node = node
	p.sub = view.Notify("policy", syncer.On[api.NetworkPolicy](nil), syncer.On[api.GlobalNetworkPolicy](nil),
		syncer.On[api.Tier](nil), syncer.On[api.StagedGlobalNetworkPolicy](nil),
		syncer.On(guarding[api.IPPool](p, nil)), syncer.On(p.affectsEndpoint), syncer.On(p.affectsRemote),
		syncer.On[api.HostEndpoint](nil), syncer.On[api.ClusterConfiguration](nil), syncer.On(p.affectsHost),
		syncer.On(guarding(p, func(u syncer.Update[api.Node]) bool { return nodeAddrsChanged(u) || tunnelGuardChanged(u) })),
		syncer.On(guarding[api.BGPPeer](p, nil)), syncer.On(guarding[api.BGPConfiguration](p, nil)))
	return p
}

// The policy owner wakes on policies, pools and the endpoints
// affectsEndpoint takes: this node's and those the last compilation's
// Interest wants (members of a set a policy applied here uses). Another
// node's pod that no such set takes cannot change this node's rules, so it
// costs a record and a few selector matches here. affectsEndpoint records
// every change for the next pass: it is the signal's only filter of
// endpoints, so the view calls it once for each.
func (p *policyOwner) affectsEndpoint(u syncer.Update[api.WorkloadEndpoint]) bool {
	return p.eps.record(u.Old, u.New)
}

// affectsRemote is affectsEndpoint for the endpoints of other nodes,
// which the agent's view keeps in compact form (syncer.CompactRemote).
func (p *policyOwner) affectsRemote(u syncer.Update[api.RemoteEndpoint]) bool {
	return p.eps.recordRemote(u.Old, u.New)
}

// loop runs passes on view changes and, applying in full, every resync
// interval.
func (p *policyOwner) loop(every time.Duration, m *metrics) loop {
	pass := func(force bool) func(context.Context) error {
		return func(ctx context.Context) error {
			err := p.sync(ctx, force)
			if onlyStaleCleanup(err) {
				// The desired state is in place; what could not be removed
				// is tried again on the next pass.
				p.log.Warn("stale firewall state not removed", "err", err)
				return nil
			}
			return err
		}
	}
	return loop{name: "policy", every: every, wake: [2]<-chan struct{}{p.sub.C(), p.kick}, observe: m.observeReconcile, log: p.log,
		pass: pass(false), full: pass(true)}
}

// syncFor is the CNI handler's hook: it returns once a pass that saw the
// endpoint stored at revision rev, and every write up to since (up to rev
// when since is 0), has programmed the firewall. With since the view need
// not reach rev in all its parts, which would take a progress report from
// etcd: the endpoint's own event brings it (syncer.WaitHeld).
func (p *policyOwner) syncFor(ctx context.Context, wep *api.WorkloadEndpoint, rev, since int64) error {
	var err error
	if since > 0 && since < rev {
		var key string
		if key, err = datastore.ResourceKey(api.KindWorkloadEndpoint, wep.Metadata.Namespace, wep.Metadata.Name); err == nil {
			err = p.view.WaitHeld(ctx, since, key, rev)
		}
	} else {
		err = p.view.WaitRevision(ctx, rev)
	}
	if err != nil {
		return fmt.Errorf("waiting for endpoint %s/%s in the cluster view: %w", wep.Metadata.Namespace, wep.Metadata.Name, err)
	}
	err = p.sync(ctx, false)
	if onlyStaleCleanup(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("programming policy for %s/%s: %w", wep.Metadata.Namespace, wep.Metadata.Name, err)
	}
	return nil
}

// Prime implements attach.PolicyPrimer: the next pass compiles wep, whose
// creation CNI ADD has in flight, as if the view held it (docs/agent.md,
// "Ahead of the commit"). Not when the view holds an endpoint of that name
// (the creation fails then, and two of one name would be compiled
// meanwhile), nor when an address of it lies outside the blocks affine to
// this node (a borrowed one, which another node may be committing to a pod
// of its own at the same time; or a block this transaction claims, which
// the view does not hold yet).
func (p *policyOwner) Prime(wep *api.WorkloadEndpoint) bool {
	if _, ok := p.view.Endpoint(wep.Metadata.Namespace, wep.Metadata.Name); ok {
		return false
	}
	for _, n := range wep.Spec.IPNetworks {
		a, err := netip.ParsePrefix(n)
		if err != nil || !p.view.InBlocksOf(p.node, a.Addr()) {
			return false
		}
	}
	p.eps.prime(wep)
	return true
}

// Unprime implements attach.PolicyPrimer: the creation of wep did not
// commit; the next pass removes what Prime added.
func (p *policyOwner) Unprime(wep *api.WorkloadEndpoint) {
	if p.eps.unprime(wep) {
		kick(p.kick)
	}
}

// Program implements attach.PolicyPrimer: a pass.
func (p *policyOwner) Program(ctx context.Context) error {
	err := p.sync(ctx, false)
	if onlyStaleCleanup(err) {
		return nil
	}
	return err
}

// sync runs a pass unless one that started after this call finished in the
// meantime, and returns that pass's error.
func (p *policyOwner) sync(ctx context.Context, force bool) error {
	p.requested.Lock()
	p.reqGen++
	mine := p.reqGen
	p.requested.Unlock()

	p.passMu.Lock()
	defer p.passMu.Unlock()
	// A pass that already covered this request answers it, unless it failed
	// only because its own caller's context ended: then run one for this
	// caller.
	if !force && p.doneGen >= mine && !(isContextErr(p.lastErr) && ctx.Err() == nil) {
		return p.lastErr
	}
	p.requested.Lock()
	gen := p.reqGen
	p.requested.Unlock()
	err := p.pass(ctx, force)
	p.doneGen, p.lastErr = gen, err
	return err
}

// pass compiles the view's policy inputs and applies the result. Callers
// hold passMu.
func (p *policyOwner) pass(ctx context.Context, force bool) error {
	start := time.Now()
	p.passes++
	// The endpoint changes are taken before anything is read from the
	// view, so that none the view holds is missing from the compiler.
	changes, all := p.eps.take()
	now := p.now()
	relist := all || force && p.relistDue(now)
	if p.guardsDirty.Swap(false) || relist {
		p.guard = policy.NewNodeGuard(p.view.Nodes(), p.view.BGPPeers(), p.view.BGPConfiguration(), p.agentPorts)
		p.tunnel = tunnelGuard(p.view)
	}
	heps, fsIn, fsOut := p.hostInputs()
	if st := p.hostStatus(heps); !slices.Equal(st, p.hostEndpoints()) {
		for _, h := range st {
			if h.State == api.HostEndpointNoInterface {
				p.log.Warn("host endpoint names an interface this node does not have; its rules apply once it appears",
					"hostendpoint", h.Name, "interface", h.Interface)
			}
		}
		p.hostMu.Lock()
		p.hostSt = st
		p.hostMu.Unlock()
	}
	in := p.input(heps, fsIn, fsOut)
	var rs *policy.Ruleset
	if !relist {
		rs, _ = p.compiler.CompileChanges(in, changes)
	}
	if rs == nil {
		// The first pass, too many changes, or a periodic one
		// policyRelistAfter after the last of these: every endpoint.
		in.Endpoints, in.Remote = p.view.Endpoints(), p.view.RemoteEndpoints()
		rs = p.compiler.Compile(in)
		p.relistAt = now
		p.relists++
	}
	if p.eps.publish(p.compiler.Interest()) {
		kick(p.kick)
	}
	if !slices.Equal(rs.Warnings, p.warned) {
		for _, w := range rs.Warnings {
			p.log.Warn("policy input skipped", "reason", w)
		}
		p.warned = rs.Warnings
	}
	if !force && p.applied.Equal(rs) {
		return nil // another node's pod, say, that no rule here selects
	}
	st, err := p.fw.Apply(ctx, *rs) // the backends consume the compiler's neutral model
	p.last, p.lastAt = st, time.Now()
	if st.Changed() {
		p.log.Debug("firewall updated", "took", time.Since(start), "chains_written", st.ChainsWritten,
			"rules_written", st.RulesWritten, "chains_deleted", st.ChainsDeleted, "sets_created", st.SetsCreated,
			"members_added", st.MembersAdded, "members_removed", st.MembersRemoved, "jumps_inserted", st.JumpsInserted)
	}
	if err != nil && !onlyStaleCleanup(err) {
		p.applied = nil
		p.published.Store(nil)
		return fmt.Errorf("applying firewall state: %w", err)
	}
	if p.onApplied != nil && !p.applied.Equal(rs) {
		p.onApplied(rs)
	}
	p.applied, p.okOnce = rs, true
	p.published.Store(rs)
	return err
}

// input is what a pass compiles, but the endpoints.
func (p *policyOwner) input(heps []*api.HostEndpoint, fsIn, fsOut []policy.Failsafe) policy.Input {
	return policy.Input{
		Node:                 p.node,
		NetworkPolicies:      p.view.NetworkPolicies(),
		GlobalPolicies:       p.view.GlobalNetworkPolicies(),
		Tiers:                p.view.Tiers(),
		StagedPolicies:       p.view.StagedGlobalNetworkPolicies(),
		Pools:                p.view.Pools(),
		EndpointToHostAction: p.toHost,
		HostProtectedPorts:   p.protected,
		HostEndpoints:        heps,
		FailsafeInbound:      fsIn,
		FailsafeOutbound:     fsOut,
		Guard:                p.guard,
		TunnelGuard:          p.tunnel,
	}
}

// programmed reports whether a pass has succeeded.
func (p *policyOwner) programmed() bool {
	p.passMu.Lock()
	defer p.passMu.Unlock()
	return p.okOnce
}

// onlyStaleCleanup reports whether err is non-nil and made only of
// dataplane.ErrStaleCleanup errors. The dataplane wraps each such error as
// fmt.Errorf("%w: …: %w", ErrStaleCleanup, cause) and joins them.
func onlyStaleCleanup(err error) bool {
	switch e := err.(type) {
	case nil:
		return false
	case interface{ Unwrap() []error }:
		errs := e.Unwrap()
		if len(errs) > 0 && errs[0] == dataplane.ErrStaleCleanup {
			return true
		}
		for _, x := range errs {
			if !onlyStaleCleanup(x) {
				return false
			}
		}
		return len(errs) > 0
	case interface{ Unwrap() error }:
		return onlyStaleCleanup(e.Unwrap())
	}
	return err == dataplane.ErrStaleCleanup
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// nodeAddrsChanged takes the node updates that change the node guard's
// addresses: a node added or removed, or its addresses changed.
func nodeAddrsChanged(u syncer.Update[api.Node]) bool {
	if u.Old == nil || u.New == nil {
		return true
	}
	return !slices.Equal(policy.NewNodeGuard([]*api.Node{u.Old}, nil, nil, nil).NodeAddrs,
		policy.NewNodeGuard([]*api.Node{u.New}, nil, nil, nil).NodeAddrs)
}
