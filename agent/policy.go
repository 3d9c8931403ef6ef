package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/policy"
)

// policyController keeps the node's firewall equal to the policy compiled
// from the datastore. Passes are serialised and coalesced: a caller that
// needs its change in place (CNI ADD) waits for a pass that started after
// it asked, and concurrent callers share one pass.
type policyController struct {
	node  string
	store *datastore.Store
	fw    dataplane.Firewall
	log   *slog.Logger
	kick  chan struct{}

	requested sync.Mutex // guards reqGen
	reqGen    uint64

	passMu  sync.Mutex // held while a pass runs; guards the fields below
	doneGen uint64     // reqGen as read when the last finished pass started
	lastErr error
	warned  []string
	last    dataplane.ApplyStats
	lastAt  time.Time
}

func newPolicyController(node string, store *datastore.Store, fw dataplane.Firewall, log *slog.Logger) *policyController {
	return &policyController{node: node, store: store, fw: fw, log: log, kick: make(chan struct{}, 1)}
}

// startPolicy creates the agent's policy controller; without a firewall
// (tests that run the agent in their own process's namespace) policy is
// not enforced.
func (a *Agent) startPolicy() {
	if a.firewall == nil {
		a.log.Warn("no firewall: network policy, anti-spoofing and natOutgoing are not enforced")
		return
	}
	a.policy = newPolicyController(a.cfg.NodeName, a.store, a.firewall, a.log.With("component", "policy"))
}

// policyLoop runs policy passes on datastore changes and every resync
// interval until ctx ends.
func (a *Agent) policyLoop(ctx context.Context) {
	if a.policy == nil {
		return
	}
	p := a.policy
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); p.watch(ctx) }()
	defer wg.Wait() // the watch ends with ctx
	kick(p.kick)
	a.loop(ctx, "policy", p.kick, func(ctx context.Context) error {
		err := p.sync(ctx)
		if onlyStaleCleanup(err) {
			// The desired state is in place; what could not be removed is
			// tried again on the next pass.
			p.log.Warn("stale firewall state not removed", "err", err)
			return nil
		}
		return err
	})
}

// policySync is the CNI handler's hook: it returns once a pass that saw the
// stored endpoint has programmed the firewall.
func (a *Agent) policySync(ctx context.Context, wep *api.WorkloadEndpoint) error {
	if a.policy == nil {
		return nil
	}
	err := a.policy.sync(ctx)
	if onlyStaleCleanup(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("programming policy for %s/%s: %w", wep.Metadata.Namespace, wep.Metadata.Name, err)
	}
	return nil
}

// policyKinds are the resources whose changes can change the firewall.
var policyKinds = []string{
	"resources/workloadendpoints/",
	"resources/networkpolicies/",
	"resources/globalnetworkpolicies/",
	"resources/ippools/",
}

// watch kicks the loop on every change of a policy input.
func (p *policyController) watch(ctx context.Context) {
	for ev := range p.store.Watch(ctx, "resources/", 0) {
		if ev.Type == datastore.EventResync || slices.ContainsFunc(policyKinds, func(k string) bool { return strings.HasPrefix(ev.KV.Key, k) }) {
			kick(p.kick)
		}
	}
}

// sync runs a pass unless one that started after this call finished in the
// meantime, and returns that pass's error.
func (p *policyController) sync(ctx context.Context) error {
	p.requested.Lock()
	p.reqGen++
	mine := p.reqGen
	p.requested.Unlock()

	p.passMu.Lock()
	defer p.passMu.Unlock()
	// A pass that already covered this request answers it, unless it failed
	// only because its own caller's context ended: then run one for this
	// caller.
	if p.doneGen >= mine && !(isContextErr(p.lastErr) && ctx.Err() == nil) {
		return p.lastErr
	}
	p.requested.Lock()
	gen := p.reqGen
	p.requested.Unlock()
	err := p.pass(ctx)
	p.doneGen, p.lastErr = gen, err
	return err
}

// pass compiles the datastore's policy inputs and applies the result.
// Callers hold passMu.
func (p *policyController) pass(ctx context.Context) error {
	start := time.Now()
	in, err := p.input(ctx)
	if err != nil {
		return err
	}
	rs := policy.Compile(in)
	if !slices.Equal(rs.Warnings, p.warned) {
		for _, w := range rs.Warnings {
			p.log.Warn("policy input skipped", "reason", w)
		}
		p.warned = rs.Warnings
	}
	st, err := p.fw.Apply(ctx, firewallState(rs))
	p.last, p.lastAt = st, time.Now()
	if st.Changed() {
		p.log.Debug("firewall updated", "took", time.Since(start), "chains_written", st.ChainsWritten,
			"rules_written", st.RulesWritten, "chains_deleted", st.ChainsDeleted, "sets_created", st.SetsCreated,
			"members_added", st.MembersAdded, "members_removed", st.MembersRemoved, "jumps_inserted", st.JumpsInserted)
	}
	if err != nil {
		return fmt.Errorf("applying firewall state: %w", err)
	}
	return nil
}

// input lists the policy inputs from the datastore.
func (p *policyController) input(ctx context.Context) (policy.Input, error) {
	in := policy.Input{Node: p.node}
	objs, _, err := p.store.List(ctx, api.KindWorkloadEndpoint, "")
	if err != nil {
		return in, fmt.Errorf("listing endpoints: %w", err)
	}
	for _, o := range objs {
		in.Endpoints = append(in.Endpoints, o.(*api.WorkloadEndpoint))
	}
	if objs, _, err = p.store.List(ctx, api.KindNetworkPolicy, ""); err != nil {
		return in, fmt.Errorf("listing network policies: %w", err)
	}
	for _, o := range objs {
		in.NetworkPolicies = append(in.NetworkPolicies, o.(*api.NetworkPolicy))
	}
	if objs, _, err = p.store.List(ctx, api.KindGlobalNetworkPolicy, ""); err != nil {
		return in, fmt.Errorf("listing global network policies: %w", err)
	}
	for _, o := range objs {
		in.GlobalPolicies = append(in.GlobalPolicies, o.(*api.GlobalNetworkPolicy))
	}
	if objs, _, err = p.store.List(ctx, api.KindIPPool, ""); err != nil {
		return in, fmt.Errorf("listing pools: %w", err)
	}
	for _, o := range objs {
		in.Pools = append(in.Pools, o.(*api.IPPool))
	}
	return in, nil
}

// firewallState is the ruleset as the dataplane takes it: the firewall
// backends consume the compiler's neutral model directly.
func firewallState(rs *policy.Ruleset) dataplane.FirewallState { return *rs }

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
