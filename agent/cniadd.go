package agent

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/tabbynet/tabby/agent/attach"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/cni"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// addPlan is one ADD: its steps and what they hand each other. Each field
// is written by one step and read only by the steps that come after it,
// but for read, which assign reads once request has closed readDone.
type addPlan struct {
	h *cniHandler
	a *attachment
	// spec is the pair as Prepare makes it: no addresses yet.
	spec dataplane.WorkloadSpec

	// request: the read of the pod's records (Kubernetes), closing
	// readDone; assign takes its requests from it when the cache of the
	// records cannot say, and the policy gate waits for the view to reach
	// it (read.info.readRev).
	read     readResult
	readDone chan struct{}
	// newAddPlan: the agent's copy of the pod's records, when it can say
	// (a Kubernetes pod; kubeRecords.lookup): then request reads nothing,
	// and assign reads only if the copy turns out stale (readLate).
	cache     podRecords
	fromCache bool
	readLate  bool
	// assign: the requests and what else ADD takes from the pod's records;
	// recCmps, when they came from the cache (kubeRecords; see cached), its
	// comparisons, which ride on the endpoint's creation.
	reqs    []ipam.AssignRequest
	info    podInfo
	recCmps []datastore.Cmp
	// assign: the addresses; handle is "" for an address without IPAM.
	asgs      []ipam.Assignment
	addrs     []netip.Addr
	handle    string
	readPrior bool                  // a repeat (or no IPAM): the endpoint may be a live pod's
	prior     *api.WorkloadEndpoint // prior: the live pod's endpoint
	// assign, while its transaction is in flight: the addresses it
	// commits with the endpoint, and the endpoint, published at the first
	// call of endpointWith by closing early; complete configures them
	// ahead of the commit. assigned is closed when assign has ended,
	// assignOK set when it succeeded.
	early      chan struct{}
	earlyOnce  sync.Once
	earlyAddrs []netip.Addr
	// assign: the endpoint the policy gate compiles ahead of its commit
	// (attach.PolicyPrimer), the last one primed; earlyPrimed says the
	// first call of endpointWith primed one.
	primed      *api.WorkloadEndpoint
	earlyPrimed bool
	assigned    chan struct{}
	assignOK    bool
	prep        dataplane.Prepared // prepare
	st          dataplane.WorkloadStatus
	completed   bool                  // complete
	wep         *api.WorkloadEndpoint // endpoint (or assign, when rode)
	rev         int64
	stored      bool
	// rode: the endpoint was created by the assignment's transaction
	// (one durable write for both); assign's undo then removes it.
	rode    bool
	adv     []netip.Prefix // advertise: the new routes waited for
	advErr  error
	advTook time.Duration
}

func newAddPlan(h *cniHandler, a *attachment) *addPlan {
	mac := a.args.MAC
	if mac == "" {
		mac = containerMAC(a.req.ContainerID, a.req.IfName)
	}
	p := &addPlan{h: h, a: a, handle: a.handle, readDone: make(chan struct{}), early: make(chan struct{}), assigned: make(chan struct{}), spec: dataplane.WorkloadSpec{
		NetNS: a.req.Netns, IfName: a.req.IfName, HostIfName: a.hostIf, MTU: h.podMTU(a.conf), MAC: mac, SkipHostRoutes: true,
	}}
	if a.w.Orchestrator == "k8s" && !h.endpointApart {
		p.cache, p.fromCache = h.kube.lookup(a.w.Namespace, a.w.Pod)
	}
	return p
}

// steps is ADD. The veth pair is prepared while IPAM assigns; the endpoint
// record (then its policy) and the interfaces' addresses (then their
// routes) need only the address, so they run concurrently: ADD costs the
// longer of the two, not the sum. Policy rules match the host interface by
// name, so they can be programmed while the interface is still being made.
// The pod's records (Kubernetes) are read while IPAM assigns: the
// request and the endpoint come from the agent's cache of the records,
// checked by the assignment's transaction, and from the read only when the
// cache cannot say or was stale. The policy gate needs the cluster view to
// hold every write before the ADD began: the view catches up with the
// read while IPAM assigns.
// A repeated ADD of a live attachment must leave it as it was when it
// fails: what it finds already there is never undone. docs/agent.md shows
// this table.
func (p *addPlan) steps() []attach.Step {
	req, wepName := p.a.req, p.a.endpointName(p.h.node)
	return []attach.Step{
		{Name: "assign", Code: codeIPAM, Msg: "assigning addresses for " + p.a.handle, Do: p.assign, Undo: p.unassign},
		{Name: "prepare", Code: codeDataplane, Msg: "wiring " + req.IfName + " in " + req.Netns, Do: p.prepare, Undo: p.unprepare},
		{Name: "request", Code: codeDatastore, Msg: "reading the pod's records", Do: p.request},
		{Name: "prime", Code: codeDataplane, Msg: "programming policy ahead for " + wepName, Do: p.primePolicy, Undo: p.unprime},
		{Name: "prior", After: []string{"assign"}, Code: codeDatastore, Msg: "reading the endpoint of " + shortID(req.ContainerID), Do: p.readEndpoint},
		{Name: "complete", After: []string{"prepare"}, Code: codeDataplane, Msg: "wiring " + req.IfName + " in " + req.Netns, Do: p.complete, Undo: p.uncomplete},
		{Name: "routes", After: []string{"complete"}, Code: codeDataplane, Msg: "routing to " + p.a.hostIf, Do: p.wire, Undo: p.unwire},
		{Name: "endpoint", After: []string{"prior"}, Code: codeDatastore, Msg: "recording endpoint " + wepName, Do: p.putEndpoint, Undo: p.unputEndpoint},
		{Name: "view", After: []string{"request"}, Code: codeDatastore, Msg: "waiting for the cluster view", Do: p.catchUp},
		{Name: "policy", After: []string{"endpoint", "view"}, Code: codeDataplane, Msg: "programming policy for " + wepName, Do: p.syncPolicy},
		{Name: "advertise", After: []string{"assign"}, Detached: true, Do: p.waitAdvertised},
	}
}

// readResult is what the read of the pod's records gives: the IPAM
// requests (one per family the network assigns) and the rest.
type readResult struct {
	reqs []ipam.AssignRequest
	info podInfo
	err  error
}

// request reads the pod's records (Kubernetes) and builds one IPAM request
// per family the network assigns from them, unless the agent's copy of
// them answers: the endpoint's creation then compares the copy with etcd's
// records, and the policy gate waits for the view to reach the endpoint's
// revision (a progress report after the commit) rather than the read's.
func (p *addPlan) request(ctx context.Context) error {
	if p.fromCache {
		return nil
	}
	return p.readRecords(ctx)
}

// readRecords is the read of the pod's records; it closes readDone.
func (p *addPlan) readRecords(ctx context.Context) (err error) {
	defer close(p.readDone)
	defer func() { p.read.err = err }()
	pod, ns, rev, err := p.h.readRecords(ctx, p.a.w)
	if err != nil {
		return err
	}
	p.read.reqs, p.read.info, err = p.h.assignRequests(p.a.w, p.a.req, p.a.conf, p.a.args, p.a.handle, pod, ns)
	p.read.info.readRev = rev
	return err
}

// plan takes the IPAM requests and what else ADD takes from the pod's
// records: from the agent's cache of the records when it can say (then
// speculative: the assignment's transaction checks them), else from the
// read. A cached record that does not decode, or whose request is
// invalid, leaves the answer (and its error) to the read.
func (p *addPlan) plan(ctx context.Context) error {
	w := p.a.w
	if recs := p.cache; p.fromCache {
		var pod *api.KubePod
		var ns *api.KubeNamespace
		var err error
		if recs.pod != nil {
			pod, ns, err = decodePodRecords(w.Namespace, w.Pod, recs.pod, recs.ns)
		}
		if err == nil {
			var reqs []ipam.AssignRequest
			var info podInfo
			if reqs, info, err = p.h.assignRequests(w, p.a.req, p.a.conf, p.a.args, p.a.handle, pod, ns); err == nil {
				p.reqs, p.info, p.recCmps = reqs, info, recs.cmps
				return nil
			}
		}
	}
	return p.awaitRead(ctx)
}

// cached reports whether the requests came from the cache of the pod's
// records (they carry its comparisons; a lookup always has some).
func (p *addPlan) cached() bool { return len(p.recCmps) > 0 }

// awaitRead takes the requests from the read of the pod's records; when
// the copy was to answer, request read nothing, and the read is made now
// (assign's goroutine, the only one that reads them then).
func (p *addPlan) awaitRead(ctx context.Context) error {
	if p.fromCache && !p.readLate {
		p.readLate = true
		_ = p.readRecords(ctx) // its error is p.read.err
	}
	select {
	case <-p.readDone:
	case <-ctx.Done():
		return ctx.Err()
	}
	if p.read.err != nil {
		return p.read.err
	}
	p.reqs, p.info, p.recCmps = p.read.reqs, p.read.info, nil
	return nil
}

// confirm checks speculative requests against the read when no
// transaction checked the cached records (they changed before it
// committed, or it carried no endpoint: a repeat): the endpoint is then
// written with the read's records, and an address request that differs
// fails ADD (the address may be from the wrong pool), which the runtime
// tries again.
func (p *addPlan) confirm(ctx context.Context) error {
	reqs, info := p.reqs, p.info
	if err := p.awaitRead(ctx); err != nil {
		return err
	}
	if !sameRequests(reqs, p.reqs) || info.noIPAM != p.info.noIPAM {
		return &types.Error{Code: types.ErrTryAgainLater, Msg: fmt.Sprintf("the address annotations of pod %s/%s changed during ADD", p.a.w.Namespace, p.a.w.Pod),
			Details: "the agent's copy of the pod's records was older than etcd's; try again"}
	}
	return nil
}

// sameRequests reports whether two sets of IPAM requests ask for the same
// (their families, pools and addresses).
func sameRequests(a, b []ipam.AssignRequest) bool {
	return slices.EqualFunc(a, b, func(x, y ipam.AssignRequest) bool {
		return x.Family == y.Family && x.Addr == y.Addr && slices.Equal(x.Pools, y.Pools)
	})
}

// assign takes one address of each family under one handle. IPAM says
// whether this is a repeat; only a repeat reads the endpoint (or every ADD
// of an address without IPAM, which IPAM knows nothing of).
func (p *addPlan) assign(ctx context.Context) (err error) {
	defer func() {
		p.assignOK = err == nil
		close(p.assigned)
	}()
	if err := p.plan(ctx); err != nil {
		return err
	}
	if err := p.assignAddrs(ctx); err != nil {
		return err
	}
	if p.cached() && !p.rode {
		return p.confirm(ctx)
	}
	return nil
}

func (p *addPlan) assignAddrs(ctx context.Context) error {
	defer func() {
		for _, a := range p.asgs {
			p.addrs = append(p.addrs, a.Addr)
		}
	}()
	if p.info.noIPAM.IsValid() {
		p.asgs, p.handle, p.readPrior = []ipam.Assignment{{Addr: p.info.noIPAM}}, "", true
		return nil
	}
	for i, areq := range p.reqs {
		if i == len(p.reqs)-1 && !p.readPrior && !p.h.endpointApart {
			// A new attachment: its endpoint commits with its last address.
			areq.With = p.endpointWith
		}
		a, err := p.h.ipam.Assign(ctx, areq)
		if p.h.observeAssign != nil {
			p.h.observeAssign(a.Borrowed, err)
		}
		if err != nil {
			if len(areq.Pools) > 0 && errors.Is(err, ipam.ErrNoPool) {
				return cniErr(types.ErrInvalidNetworkConfig, fmt.Sprintf("network %s: ipv%d_pools %v", p.a.conf.Name, areq.Family, areq.Pools), err)
			}
			return cniErr(codeIPAM, fmt.Sprintf("assigning an IPv%d address for %s", areq.Family, p.handle), err)
		}
		p.asgs = append(p.asgs, a)
		p.readPrior = p.readPrior || a.Existing
		if a.WithRev != 0 {
			p.wep.Metadata.ResourceVersion = strconv.FormatInt(a.WithRev, 10)
			p.rev, p.stored, p.rode = a.WithRev, true, true
		}
	}
	return nil
}

// endpointWith is the endpoint's creation for the assignment's
// transaction, with addr as its last address. Called again on a retry;
// the last call is what commits.
func (p *addPlan) endpointWith(addr netip.Addr) ([]datastore.Cmp, []datastore.Op, error) {
	addrs := make([]netip.Addr, 0, len(p.asgs)+1)
	for _, a := range p.asgs {
		addrs = append(addrs, a.Addr)
	}
	wep, cmp, op, err := p.h.endpoints.CreateOp(p.endpoint(append(addrs, addr)))
	if err != nil {
		return nil, nil, fmt.Errorf("preparing endpoint %s: %w", p.a.endpointName(p.h.node), err)
	}
	p.wep = wep
	if pr := p.h.primer; pr != nil {
		if pr.Prime(wep) {
			p.primed = wep
		} else if p.primed != nil {
			pr.Unprime(p.primed)
			p.primed = nil
		}
	}
	p.earlyOnce.Do(func() {
		p.earlyAddrs, p.earlyPrimed = append(addrs, addr), p.primed != nil
		close(p.early)
	})
	// An endpoint from the cache's records commits only if they are
	// still etcd's.
	return append([]datastore.Cmp{cmp}, p.recCmps...), []datastore.Op{op}, nil
}

// unassign releases what assign took: on a repeat only the addresses that
// are new, else the handle.
func (p *addPlan) unassign(ctx context.Context) error {
	if p.handle == "" || len(p.asgs) == 0 {
		return nil
	}
	if p.rode {
		// The endpoint came with the address: it goes first, so that no
		// endpoint ever names an address that is free.
		m := p.wep.Metadata
		if err := p.h.endpoints.Delete(ctx, m.Namespace, m.Name, ""); err != nil {
			return fmt.Errorf("removing endpoint %s: %w", m.Name, err)
		}
	}
	if !p.readPrior {
		return p.h.ipam.ReleaseHandle(ctx, p.handle)
	}
	var errs []error
	for _, a := range p.asgs {
		if !a.Existing {
			errs = append(errs, p.h.ipam.ReleaseAddrHeldBy(ctx, a.Addr, p.handle))
		}
	}
	return errors.Join(errs...)
}

// prepare makes the veth pair, when there is none yet, with all that needs
// no address.
func (p *addPlan) prepare(ctx context.Context) (err error) {
	p.prep, err = p.h.wl.Prepare(ctx, p.spec)
	return err
}

func (p *addPlan) unprepare(ctx context.Context) error {
	if !p.prep.Created {
		return nil
	}
	return p.h.wl.Teardown(ctx, p.spec)
}

func (p *addPlan) readEndpoint(ctx context.Context) (err error) {
	if p.readPrior {
		p.prior, err = p.h.endpointOf(ctx, p.a.w, p.a.req.ContainerID)
	}
	return err
}

// specWith is the spec with addrs.
func (p *addPlan) specWith(addrs []netip.Addr) dataplane.WorkloadSpec {
	spec := p.spec
	for _, a := range addrs {
		spec.Addrs = append(spec.Addrs, netip.PrefixFrom(a, a.BitLen()))
	}
	return spec
}

// errNotAssigned ends a step waiting for the addresses when assign failed
// (assign's error, earlier in the plan, is ADD's).
var errNotAssigned = errors.New("no addresses: assigning them failed")

// complete adds the addresses and routes inside the pod (all of Setup for
// a pair Prepare did not make). In a pair Prepare made it adds the
// addresses the assignment is committing as soon as it has chosen them,
// while the transaction is in flight, and, when the committed ones differ
// (the transaction was tried again with others), sets those once it is
// done: the pod's container starts only after ADD returns, so nothing
// uses them before.
func (p *addPlan) complete(ctx context.Context) (err error) {
	addrs, ahead, err := p.addrsToComplete(ctx)
	if err != nil {
		return err
	}
	p.st, err = p.h.wl.Complete(ctx, p.specWith(addrs), p.prep)
	p.completed = err == nil
	if err != nil || !ahead {
		return err
	}
	if err := p.awaitAssigned(ctx); err != nil {
		return err
	}
	if slices.Equal(addrs, p.addrs) {
		return nil
	}
	// The same pair: its status (indexes, MACs) is Complete's.
	_, err = p.h.wl.Setup(ctx, p.specWith(p.addrs))
	return err
}

// addrsToComplete returns the addresses complete configures: in a pair
// Prepare made, the ones the assignment has chosen if it has (ahead: not
// yet committed), else, once assign is done, the assigned ones.
func (p *addPlan) addrsToComplete(ctx context.Context) (addrs []netip.Addr, ahead bool, err error) {
	if p.prep.Created {
		select {
		case <-p.early:
			return p.earlyAddrs, true, nil
		case <-p.assigned:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
	if err := p.awaitAssigned(ctx); err != nil {
		return nil, false, err
	}
	return p.addrs, false, nil
}

// awaitAssigned waits for assign to end; errNotAssigned when it failed.
func (p *addPlan) awaitAssigned(ctx context.Context) error {
	select {
	case <-p.assigned:
	case <-ctx.Done():
		return ctx.Err()
	}
	if !p.assignOK {
		return errNotAssigned
	}
	return nil
}

// uncomplete removes a pair that Complete made (a stale link replaced); one
// that Prepare made is prepare's to undo, one that was there stays.
func (p *addPlan) uncomplete(ctx context.Context) error {
	if !p.completed || p.st.Existed || p.prep.Created {
		return nil
	}
	return p.h.wl.Teardown(ctx, p.spec)
}

func (p *addPlan) wire(context.Context) error {
	return p.h.routes.Wire(p.a.hostIf, dataplane.HostRoutes(p.specWith(p.addrs)))
}

func (p *addPlan) unwire(context.Context) error {
	if !p.st.Existed {
		p.h.routes.Unwire(p.a.hostIf)
	}
	return nil
}

// putEndpoint writes the endpoint, unless assign's transaction did.
func (p *addPlan) putEndpoint(ctx context.Context) (err error) {
	if p.rode {
		return nil
	}
	p.wep = p.endpoint(p.addrs)
	p.rev, err = p.h.endpoints.Put(ctx, p.wep, !p.readPrior)
	p.stored = err == nil
	return err
}

// endpoint is the pod's WorkloadEndpoint with addrs.
func (p *addPlan) endpoint(addrs []netip.Addr) *api.WorkloadEndpoint {
	a, h := p.a, p.h
	wep := buildEndpoint(h.node, a.w, p.handle, addrs, a.hostIf, p.spec.MAC, p.info.labels)
	wep.Spec.NamespaceLabels = p.info.nsLabels
	wep.Spec.Ports = p.info.ports
	wep.Metadata.Annotations = map[string]string{api.AnnotationOrigin: api.OriginAgent}
	if p.info.kube {
		// Its labels come from Kubernetes, and the controllers keep them.
		wep.Metadata.Annotations[api.AnnotationOrigin] = api.OriginKubernetes
	}
	if p.info.noIPAM.IsValid() {
		wep.Metadata.Annotations[api.AnnotationNoIPAM] = "true"
	}
	return wep
}

// unputEndpoint puts a live pod's record back as it was, or removes the
// new one. A write that failed may still have committed (a timeout): then
// the endpoint goes if it names this container. One that came with the
// address is assign's to undo.
func (p *addPlan) unputEndpoint(ctx context.Context) error {
	switch {
	case p.rode:
		return nil
	case p.prior != nil:
		return p.h.endpoints.Restore(ctx, p.prior)
	case p.stored:
		return p.h.endpoints.Delete(ctx, p.wep.Metadata.Namespace, p.wep.Metadata.Name, "")
	default:
		return p.h.deleteEndpointOf(ctx, p.wep.Metadata.Namespace, p.wep.Metadata.Name, p.a.req.ContainerID)
	}
}

// catchUp waits for the cluster view to reach the pod records' read (a
// progress report from etcd, asked for now), while IPAM assigns, so that
// the policy gate finds it there. The gate waits for it itself: this only
// moves the wait off ADD's longest path.
func (p *addPlan) catchUp(ctx context.Context) error {
	if p.fromCache {
		return nil // no read: the gate waits for the endpoint's revision
	}
	if p.h.policy == nil || p.h.view == nil || p.read.info.readRev == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, storeCallTimeout)
	defer cancel()
	return p.h.view.WaitRevision(ctx, p.read.info.readRev)
}

// primePolicy programs the policy of the endpoint that assign's
// transaction is creating while it is in flight (endpointWith primed it),
// so that the policy step's pass after the commit finds nothing to change.
// It never fails ADD: the policy step's pass is what ADD waits for.
func (p *addPlan) primePolicy(ctx context.Context) error {
	select {
	case <-p.early:
	case <-p.assigned:
		return nil
	case <-ctx.Done():
		return nil
	}
	if !p.earlyPrimed {
		return nil
	}
	if err := p.h.primer.Program(ctx); err != nil && ctx.Err() == nil {
		p.h.log.Debug("programming policy ahead of the endpoint's commit", "endpoint", p.a.endpointName(p.h.node), "err", err)
	}
	return nil
}

// unprime takes back an endpoint primed for a creation that did not
// commit (or an ADD that failed: its endpoint goes, with its own event).
func (p *addPlan) unprime(context.Context) error {
	if p.primed != nil {
		p.h.primer.Unprime(p.primed)
	}
	return nil
}

func (p *addPlan) syncPolicy(ctx context.Context) error {
	if p.primed != nil && !p.rode {
		// The endpoint was written apart (endpoint), not as primed.
		p.h.primer.Unprime(p.primed)
		p.primed = nil
	}
	if p.h.policy == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, storeCallTimeout)
	defer cancel()
	return p.h.policy.SyncEndpoint(ctx, p.wep, p.rev, p.read.info.readRev)
}

// waitAdvertised waits, at most advertiseWait, until the new routes (one
// per family at most: a new block, or a borrowed address) are advertised.
// It never fails ADD: the result is logged.
func (p *addPlan) waitAdvertised(ctx context.Context) error {
	for _, a := range p.asgs {
		switch {
		case p.h.advert == nil || a.Existing:
		case a.NewBlock:
			p.adv = append(p.adv, a.Block)
		case a.Borrowed:
			p.adv = append(p.adv, netip.PrefixFrom(a.Addr, a.Addr.BitLen()))
		}
	}
	if len(p.adv) == 0 {
		return nil
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, advertiseWait)
	defer cancel()
	var errs []error
	for _, pr := range p.adv {
		errs = append(errs, p.h.advert.Advertised(ctx, pr))
	}
	p.advErr, p.advTook = errors.Join(errs...), time.Since(start)
	return nil
}

// logAdded logs a successful ADD with the time of each step, and as
// before the plan: ipam, from the start until the addresses were assigned
// (the pod's records and IPAM), and dataplane, from then until the routes
// were wired.
func (p *addPlan) logAdded(res *attach.Result) {
	h, a := p.h, p.a
	if p.advErr != nil {
		h.log.Warn("pod added before its route was advertised", "container", shortID(a.req.ContainerID), "prefixes", p.adv, "err", p.advErr)
	} else if len(p.adv) > 0 {
		h.log.Info("waited for the pod's route to be advertised", "prefixes", p.adv, "waited", p.advTook.Round(time.Microsecond))
	}
	took := func(step string) time.Duration {
		t, _ := res.Timing(step)
		return t.Took().Round(time.Microsecond)
	}
	assigned, _ := res.Timing("assign")
	routed, _ := res.Timing("routes")
	borrowed := len(p.asgs) > 0 && p.asgs[0].Borrowed // the first family's (IPv4 when the network has it)
	attrs := []any{"container", shortID(a.req.ContainerID), "pod", a.w.Namespace + "/" + a.w.Pod, "ips", p.addrs, "iface", a.hostIf,
		"borrowed", borrowed, "cached", p.cached(), "ipam", assigned.End.Round(time.Microsecond), "dataplane", (routed.End - assigned.End).Round(time.Microsecond)}
	for _, step := range cni.AddSteps {
		attrs = append(attrs, step, took(step))
	}
	h.log.Info("workload added", attrs...)
}

// containerMAC derives a stable, locally administered unicast MAC for a
// container interface, so that a repeated ADD asks for the same one.
func containerMAC(containerID, ifName string) string {
	sum := sha256.Sum256([]byte(containerID + "/" + ifName))
	sum[0] = sum[0]&0xfe | 0x02
	return net.HardwareAddr(sum[:6]).String()
}

func buildResult(req *cni.Request, addrs []netip.Addr, hostIf string, st dataplane.WorkloadStatus) *current.Result {
	idx := 1
	r := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: hostIf, Mac: dataplane.HostMAC},
			{Name: req.IfName, Mac: st.ContainerMAC, Sandbox: req.Netns},
		},
	}
	for _, a := range addrs {
		gw, zero := dataplane.GatewayAddr, netip.IPv4Unspecified()
		if a.Is6() {
			gw, zero = dataplane.GatewayAddr6, netip.IPv6Unspecified()
		}
		r.IPs = append(r.IPs, &current.IPConfig{
			Interface: &idx,
			Address:   net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())},
			Gateway:   gw.AsSlice(),
		})
		r.Routes = append(r.Routes, &types.Route{
			Dst: net.IPNet{IP: zero.AsSlice(), Mask: net.CIDRMask(0, zero.BitLen())},
			GW:  gw.AsSlice(),
		})
	}
	return r
}

// buildEndpoint makes the WorkloadEndpoint for a wired pod.
func buildEndpoint(node string, w workloadID, handle string, addrs []netip.Addr, hostIf, mac string, labels map[string]string) *api.WorkloadEndpoint {
	nets := make([]string, 0, len(addrs))
	for _, a := range addrs {
		nets = append(nets, netip.PrefixFrom(a, a.BitLen()).String())
	}
	wep := &api.WorkloadEndpoint{
		Metadata: api.ObjectMeta{
			Name:      w.endpointName(node),
			Namespace: w.Namespace,
			Labels:    labels,
		},
		Spec: api.WorkloadEndpointSpec{
			Node:          node,
			Orchestrator:  w.Orchestrator,
			Pod:           w.Pod,
			ContainerID:   w.ContainerID,
			Endpoint:      w.Endpoint,
			InterfaceName: hostIf,
			MAC:           mac,
			IPNetworks:    nets,
			IPAMHandle:    handle,
		},
	}
	wep.SetDefaults()
	return wep
}
