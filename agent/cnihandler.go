package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"strings"
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
	"github.com/tabbynet/tabby/syncer"
)

// storeCallTimeout bounds each datastore call of a CNI request, so that an
// unreachable etcd fails the request well within the runtime's deadline
// instead of at it. A healthy call takes milliseconds.
const storeCallTimeout = 8 * time.Second

// advertiseWait bounds how long ADD waits for the route of a new block (or
// a borrowed address) to be advertised; past it ADD succeeds anyway and
// logs: the route follows, a pod without network is worse.
const advertiseWait = 5 * time.Second

// CNI error codes of our own (>= 100 per the spec).
const (
	codeIPAM      = 100
	codeDataplane = 101
	codeDatastore = 102
)

// cniHandler carries out CNI requests for this node: each verb is a plan of
// attach steps (addplan.go's table for ADD) run by one attach.Runner. It is
// safe for concurrent use; the cni.Server serialises requests per
// container.
type cniHandler struct {
	node string
	// store holds the pods' and namespaces' records (podinfo.go) and the
	// node's liveness key (STATUS); every call through it is bounded.
	store *datastore.Store
	// ipam and endpoints bound every call with storeCallTimeout.
	ipam      attach.Addresses
	endpoints attach.Endpoints
	// endpointApart: no endpoint rides on the IPAM transaction (Deps).
	endpointApart bool
	wl            dataplane.Workloads
	// view answers GC's question which endpoints this node has.
	view *syncer.Syncer
	// kube, when set, is the cache of the controllers' records that ADD
	// takes a Kubernetes pod's from (kuberecords.go); nil: ADD waits for
	// its read of them.
	kube *kubeRecords
	// readHook, when set, is called by ADD's read of the pod's records
	// before it reads (tests hold the read with it)
	readHook func()
	// routes installs a new pod's routes (the one writer of them).
	routes attach.HostRoutes
	// policy, when set, programs the firewall for a new endpoint before
	// ADD returns, so that a pod never runs without its policy.
	policy attach.PolicyGate
	// primer, when set, compiles a new endpoint's policy ahead of its
	// commit (the policy owner).
	primer attach.PolicyPrimer
	// advert, when set, returns once BGP advertises a prefix: ADD of a pod
	// in a block claimed for it (or with a borrowed address) waits for it,
	// at most advertiseWait, so that the pod's first packets to other
	// nodes are not lost while its route propagates.
	advert attach.AdvertGate
	// runner runs the plans; its Fault hook fails a step by name (tests),
	// its Observe hook times every step (metrics).
	runner attach.Runner
	log    *slog.Logger
	// life bounds background work (the spare-block claim): the agent's
	// lifetime.
	life context.Context
	// observe records a finished operation (metrics).
	observe func(op string, d time.Duration, err error)
	// observeAssign records an IPAM assignment (metrics).
	observeAssign func(borrowed bool, err error)
	// autoMTU, when set, is the pod MTU when the network config sets
	// none (the tunnel owner's: the underlay's minus the encapsulation).
	autoMTU func() int
	// wlocks serialises requests of one workload across its sandboxes.
	wlocks cni.KeyedLocks
	// ipv6Only: the node has no IPv4 address (--node-ip none), so an ADD
	// that asks for an IPv4 address fails (refuseIPv4).
	ipv6Only bool

	// spareBusy marks the families whose spare-block claim is running
	// (claimSpare); spares holds the claims' goroutines, which the agent
	// waits for on shutdown (waitSpares); spareClosed, set then, refuses
	// new claims.
	spareMu     sync.Mutex
	spareBusy   map[int]bool
	spares      sync.WaitGroup
	spareClosed bool

	addingMu sync.Mutex
	adding   map[string]bool // host interfaces ADD is working on
}

// newCNIHandler makes a handler whose datastore and IPAM calls are each
// bounded by storeCallTimeout; life (the agent's run context) bounds its
// background work. The optional parts (policy, advert, the runner's
// hooks, the metrics) are set by the caller.
func newCNIHandler(life context.Context, node string, store *datastore.Store, alloc attach.Addresses, wl dataplane.Workloads, view *syncer.Syncer, routes attach.HostRoutes, log *slog.Logger) *cniHandler {
	return &cniHandler{
		node: node, store: store, wl: wl, view: view, routes: routes, log: log, life: life,
		ipam:      boundedAddresses{alloc},
		endpoints: storeEndpoints{store},
	}
}

// podMTU is the pod interfaces' MTU: the network config's, else the
// automatic one (0: the dataplane's default).
func (h *cniHandler) podMTU(conf *cni.NetConf) int {
	if conf.MTU != 0 || h.autoMTU == nil {
		return conf.MTU
	}
	return h.autoMTU()
}

func cniErr(code uint, msg string, err error) *types.Error {
	return &types.Error{Code: code, Msg: msg, Details: err.Error()}
}

// attachment is what every verb derives from a request: the workload, its
// names and, for ADD and DEL, the workload's lock.
type attachment struct {
	req    *cni.Request
	conf   *cni.NetConf
	args   *cni.Args
	w      workloadID
	handle string // IPAM handle
	hostIf string
	unlock func()
}

// open validates a request of the verb and derives its attachment; ADD and
// DEL also take the workload's lock, which close releases.
func (h *cniHandler) open(ctx context.Context, verb string, req *cni.Request, conf *cni.NetConf, args *cni.Args) (*attachment, error) {
	switch {
	case verb == "add" && (req.ContainerID == "" || req.IfName == ""):
		return nil, &types.Error{Code: types.ErrInvalidEnvironmentVariables, Msg: "CNI_CONTAINERID and CNI_IFNAME are required"}
	case verb == "del" && req.ContainerID == "":
		return nil, &types.Error{Code: types.ErrInvalidEnvironmentVariables, Msg: "CNI_CONTAINERID is required"}
	case verb == "add" && req.Netns == "":
		return nil, &types.Error{Code: types.ErrInvalidEnvironmentVariables, Msg: "CNI_NETNS is required for ADD"}
	}
	if verb == "del" && req.IfName == "" {
		req.IfName = "eth0"
	}
	w := newWorkloadID(req, args)
	a := &attachment{req: req, conf: conf, args: args, w: w, handle: ipamHandle(conf.Name, req.ContainerID), hostIf: w.hostIfName(), unlock: func() {}}
	if verb == "check" {
		return a, nil
	}
	unlock, err := h.wlocks.Lock(ctx, a.hostIf)
	if err != nil {
		return nil, cniErr(types.ErrTryAgainLater, "waiting for another request of the same pod", err)
	}
	a.unlock = unlock
	if verb != "add" {
		return a, nil
	}
	h.setAdding(a.hostIf, true)
	a.unlock = func() { h.setAdding(a.hostIf, false); unlock() }
	// The host name is 44 bits of a hash: make sure it is not another
	// workload's, whose link Setup would otherwise take for a stale one.
	if other := h.interfaceHolder(w, a.hostIf); other != nil {
		a.close()
		return nil, cniErr(codeDataplane, "host interface name collision",
			fmt.Errorf("%s, the host interface of %s, is already that of endpoint %s/%s (container %s)",
				a.hostIf, w.key(), other.Metadata.Namespace, other.Metadata.Name, shortID(other.Spec.ContainerID)))
	}
	return a, nil
}

func (a *attachment) close() { a.unlock() }

// endpointName is the attachment's WorkloadEndpoint name on node.
func (a *attachment) endpointName(node string) string { return a.w.endpointName(node) }

// Add assigns an address, wires the pod, installs its routes, records its
// endpoint and programs its policy: the plan addSteps declares. A failed
// step undoes what the plan did; a repeated ADD returns the same result,
// and a failed one leaves the live attachment as it was.
func (h *cniHandler) Add(ctx context.Context, req *cni.Request, conf *cni.NetConf, args *cni.Args) (_ *current.Result, err error) {
	start := time.Now()
	defer func() { h.done("add", start, err) }()
	a, err := h.open(ctx, "add", req, conf, args)
	if err != nil {
		return nil, err
	}
	defer a.close()
	p := newAddPlan(h, a)
	res, err := h.runner.Run(ctx, "add", p.steps())
	if res.UndoErr != nil {
		h.log.Error("rolling back failed ADD left state behind", "container", req.ContainerID, "err", res.UndoErr)
	}
	if err != nil {
		return nil, err
	}
	p.logAdded(&res)
	if p.handle != "" {
		h.claimSpare(p.addrs)
	}
	return buildResult(req, p.addrs, a.hostIf, p.st), nil
}

// spareClaimTimeout bounds a background spare-block claim.
const spareClaimTimeout = 10 * time.Second

// claimSpare makes sure, in the background, that the node keeps a block
// with a free address in each family it just assigned from: when the
// pod took the last one, the next pod would open a block and wait for its
// route to reach the other nodes — and a packet answered by a node that
// has not installed it yet is lost. One claim per family at a time; with
// room left it costs nothing (IPAM's cache answers). Once waitSpares has
// begun it starts none.
func (h *cniHandler) claimSpare(addrs []netip.Addr) {
	for _, a := range addrs {
		fam := 4
		if a.Is6() {
			fam = 6
		}
		h.spareMu.Lock()
		if h.spareBusy == nil {
			h.spareBusy = map[int]bool{}
		}
		start := !h.spareBusy[fam] && !h.spareClosed
		if start {
			h.spareBusy[fam] = true
			h.spares.Add(1) // under spareMu: every Add happens before waitSpares's Wait
		}
		h.spareMu.Unlock()
		if !start {
			continue
		}
		go func() {
			defer h.spares.Done()
			defer func() {
				h.spareMu.Lock()
				h.spareBusy[fam] = false
				h.spareMu.Unlock()
			}()
			ctx, cancel := context.WithTimeout(h.life, spareClaimTimeout)
			defer cancel()
			blk, err := h.ipam.EnsureFreeBlock(ctx, h.node, fam)
			switch {
			case err != nil:
				h.log.Warn("claiming a spare block", "family", fam, "err", err)
			case blk.IsValid():
				h.log.Info("claimed a spare block: the node's blocks are full", "block", blk)
			}
		}()
	}
}

// waitSpares refuses new spare-block claims and waits for the running
// ones, which end soon once life is done (the agent is stopping). The
// agent calls it after its CNI server has stopped, before the store
// closes under the claims.
func (h *cniHandler) waitSpares() {
	h.spareMu.Lock()
	h.spareClosed = true
	running := 0
	for _, busy := range h.spareBusy {
		if busy {
			running++
		}
	}
	h.spareMu.Unlock()
	if running > 0 {
		h.log.Info("stopping: waiting for spare-block claims", "running", running)
	}
	h.spares.Wait()
}

// assignRequests builds the IPAM requests of an ADD, one per family the
// network assigns (IPv4 first): the family's pools, the runtime's
// requested address of that family, and for IPv4 the pod's address
// annotations (Kubernetes: pod and ns are its records, nil outside
// Kubernetes). A requested address of a family the network does not
// assign is an error.
func (h *cniHandler) assignRequests(w workloadID, req *cni.Request, conf *cni.NetConf, args *cni.Args, handle string, pod *api.KubePod, ns *api.KubeNamespace) ([]ipam.AssignRequest, podInfo, error) {
	if h.ipv6Only && conf.WantsIPv4() {
		return nil, podInfo{}, h.refuseIPv4(conf)
	}
	base := ipam.AssignRequest{
		Node:   h.node,
		Handle: handle,
		Attrs: ipam.Attributes{
			Node: h.node, Namespace: w.Namespace, Pod: w.Pod, ContainerID: req.ContainerID, Time: time.Now(),
		},
	}
	v4, v6 := base, base
	v4.Family, v4.Pools = 4, conf.IPv4Pools
	v6.Family, v6.Pools = 6, conf.IPv6Pools
	for _, a := range args.IPs {
		r := &v4
		if a.Is6() {
			r = &v6
		}
		if r.Addr.IsValid() {
			return nil, podInfo{}, &types.Error{Code: types.ErrInvalidNetworkConfig, Msg: fmt.Sprintf("the runtime asks for two IPv%d addresses (%s and %s); a pod gets one per family", r.Family, r.Addr, a)}
		}
		r.Addr = a
	}
	info, err := h.applyPodInfo(w, pod, ns, conf, args, &v4, &v6)
	if err != nil {
		return nil, podInfo{}, err
	}
	var out []ipam.AssignRequest
	for _, f := range []struct {
		want bool
		r    ipam.AssignRequest
	}{{conf.WantsIPv4(), v4}, {conf.WantsIPv6(), v6}} {
		switch {
		case f.want:
			out = append(out, f.r)
		case f.r.Addr.IsValid():
			return nil, podInfo{}, &types.Error{Code: types.ErrInvalidNetworkConfig,
				Msg: fmt.Sprintf("%s is asked for (by the runtime or the pod's annotations), but network %s assigns no IPv%d addresses (assign_ipv%d)", f.r.Addr, conf.Name, f.r.Family, f.r.Family)}
		}
	}
	return out, info, nil
}

// refuseIPv4 is the error of an ADD that asks an IPv6-only node for an
// IPv4 address: the node could neither route nor advertise it. It names
// the IPv4 pod pools the address would come from.
func (h *cniHandler) refuseIPv4(conf *cni.NetConf) error {
	pools := slices.Clone(conf.IPv4Pools)
	if len(pools) == 0 {
		for _, p := range h.view.Pools() {
			if pfx, err := p.Prefix(); err == nil && pfx.Addr().Is4() && !p.IsLoadBalancer() {
				pools = append(pools, p.Metadata.Name+" "+pfx.String())
			}
		}
	}
	from := "no IPv4 pool exists"
	if len(pools) > 0 {
		from = "IPv4 pools: " + strings.Join(pools, ", ")
	}
	return &types.Error{Code: types.ErrInvalidNetworkConfig,
		Msg: fmt.Sprintf("node %s is IPv6-only (--node-ip none): it cannot give a pod an IPv4 address (%s); set \"ipam\": {\"assign_ipv4\": \"false\", \"assign_ipv6\": \"true\"} in network %s", h.node, from, conf.Name)}
}

func ignoreNotFound(err error) error {
	if errors.Is(err, datastore.ErrNotFound) {
		return nil
	}
	return err
}

func (h *cniHandler) setAdding(hostIf string, on bool) {
	h.addingMu.Lock()
	defer h.addingMu.Unlock()
	if h.adding == nil {
		h.adding = map[string]bool{}
	}
	if on {
		h.adding[hostIf] = true
	} else {
		delete(h.adding, hostIf)
	}
}

func (h *cniHandler) isAdding(hostIf string) bool {
	h.addingMu.Lock()
	defer h.addingMu.Unlock()
	return h.adding[hostIf]
}

// interfaceHolder returns an endpoint of this node, of another workload,
// that uses hostIf, or nil.
func (h *cniHandler) interfaceHolder(w workloadID, hostIf string) *api.WorkloadEndpoint {
	for _, wep := range h.view.EndpointsOn(h.node) {
		if wep.Spec.InterfaceName == hostIf && !w.sameWorkload(wep) {
			return wep
		}
	}
	return nil
}

// endpointOf returns this node's stored endpoint of the workload when it
// belongs to containerID, else nil.
func (h *cniHandler) endpointOf(ctx context.Context, w workloadID, containerID string) (*api.WorkloadEndpoint, error) {
	wep, err := h.endpoints.Get(ctx, w.Namespace, w.endpointName(h.node))
	switch {
	case errors.Is(err, datastore.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, err
	case wep.Spec.ContainerID == containerID:
		return wep, nil
	}
	return nil, nil
}

// deleteEndpointOf deletes the endpoint if it exists and belongs to
// containerID (compare-and-swap on the revision read).
func (h *cniHandler) deleteEndpointOf(ctx context.Context, ns, name, containerID string) error {
	wep, err := h.endpoints.Get(ctx, ns, name)
	switch {
	case errors.Is(err, datastore.ErrNotFound):
		return nil
	case err != nil:
		return err
	case wep.Spec.ContainerID != containerID:
		return nil
	}
	return h.endpoints.Delete(ctx, ns, name, wep.Metadata.ResourceVersion)
}

// removal is what DEL and GC remove of one attachment. DEL's first step
// fills it in from the endpoint it reads; GC knows it from the view.
type removal struct {
	spec   dataplane.WorkloadSpec // HostIfName "": leave the host side alone
	ns     string
	wep    string // the endpoint's name; "" when the attachment has none
	rv     string // the endpoint's resource version read
	handle string
}

// removalSteps remove the interfaces, the endpoint and the addresses of an
// attachment, independently of one another (so concurrently), each once
// the steps named by after succeeded. A missing piece counts as removed.
func (h *cniHandler) removalSteps(rm *removal, after ...string) []attach.Step {
	return []attach.Step{
		{Name: "teardown", After: after, Code: types.ErrTryAgainLater, Do: func(ctx context.Context) error {
			if rm.spec.HostIfName == "" {
				return nil
			}
			// The link takes its routes with it; the route owner drops
			// any it still holds for an ADD that did not finish.
			err := h.wl.Teardown(ctx, rm.spec)
			h.routes.Unwire(rm.spec.HostIfName)
			if err != nil {
				return fmt.Errorf("removing interfaces: %w", err)
			}
			return nil
		}},
		{Name: "unrecord", After: after, Code: types.ErrTryAgainLater, Do: func(ctx context.Context) error {
			if rm.wep == "" {
				return nil
			}
			if err := h.endpoints.Delete(ctx, rm.ns, rm.wep, rm.rv); err != nil {
				return fmt.Errorf("removing endpoint: %w", err)
			}
			return nil
		}},
		{Name: "release", After: after, Code: types.ErrTryAgainLater, Do: func(ctx context.Context) error {
			if err := h.ipam.ReleaseHandle(ctx, rm.handle); err != nil {
				return fmt.Errorf("releasing addresses of %s: %w", rm.handle, err)
			}
			return nil
		}},
	}
}

// Del removes the pod's interfaces, endpoint and address. Every missing piece
// counts as success; it works without the netns and without an endpoint.
func (h *cniHandler) Del(ctx context.Context, req *cni.Request, conf *cni.NetConf, args *cni.Args) (err error) {
	start := time.Now()
	defer func() { h.done("del", start, err) }()
	// Without a datastore DEL cannot finish; fail fast and let the runtime retry.
	ctx, cancel := context.WithTimeout(ctx, storeCallTimeout)
	defer cancel()
	a, err := h.open(ctx, "del", req, conf, args)
	if err != nil {
		return err
	}
	defer a.close()
	// Deleting the host link takes the pod's side and its routes with it.
	rm := &removal{spec: dataplane.WorkloadSpec{NetNS: req.Netns, IfName: req.IfName, HostIfName: a.hostIf, SkipHostRoutes: true},
		ns: a.w.Namespace, handle: a.handle}
	steps := append([]attach.Step{{Name: "read", Code: types.ErrTryAgainLater, Do: func(ctx context.Context) error { return h.delTarget(ctx, a, rm) }}},
		h.removalSteps(rm, "read")...)
	if _, err := h.runner.RunAll(ctx, "del", steps); err != nil {
		return cniErr(types.ErrTryAgainLater, "removing workload "+shortID(req.ContainerID), err)
	}
	h.log.Info("workload deleted", "container", shortID(req.ContainerID), "pod", a.w.Namespace+"/"+a.w.Pod)
	return nil
}

// delTarget reads the endpoint, which tells whether a newer sandbox of the
// same pod now owns the host interface; if so, DEL leaves the host side
// alone (creating the new pair deleted the stale link and with it its
// peer). Without an answer it is not safe to touch the host side: DEL
// fails and the runtime retries.
func (h *cniHandler) delTarget(ctx context.Context, a *attachment, rm *removal) error {
	name := a.endpointName(h.node)
	wep, err := h.endpoints.Get(ctx, a.w.Namespace, name)
	if legacy, ok := a.w.legacyEndpointName(h.node); ok && errors.Is(err, datastore.ErrNotFound) {
		// Written by an agent that named endpoints by 12 characters of the
		// container ID: remove it only if it is this container's.
		if lwep, lerr := h.endpoints.Get(ctx, a.w.Namespace, legacy); lerr == nil && lwep.Spec.ContainerID == a.req.ContainerID {
			name, wep, err = legacy, lwep, nil
		}
	}
	switch {
	case errors.Is(err, datastore.ErrNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("reading endpoint %s/%s: %w", a.w.Namespace, name, err)
	case wep.Spec.ContainerID != a.req.ContainerID:
		rm.spec.HostIfName = ""
		h.log.Info("DEL of an old sandbox: the pod's interface belongs to a newer one", "container", shortID(a.req.ContainerID), "current", shortID(wep.Spec.ContainerID))
		return nil
	}
	rm.wep, rm.rv = name, wep.Metadata.ResourceVersion
	return nil
}

// Check compares the pod's interfaces, addresses, routes and endpoint with
// what ADD made and reports every difference. The addresses are IPAM's, or
// for an attachment without IPAM (ipAddrsNoIpam) its endpoint's.
func (h *cniHandler) Check(ctx context.Context, req *cni.Request, conf *cni.NetConf, args *cni.Args, prev *current.Result) (err error) {
	start := time.Now()
	defer func() { h.done("check", start, err) }()
	a, err := h.open(ctx, "check", req, conf, args)
	if err != nil {
		return err
	}
	defer a.close()
	var errs []error
	name := a.endpointName(h.node)
	wep, gerr := h.endpoints.Get(ctx, a.w.Namespace, name)
	if gerr != nil {
		errs = append(errs, fmt.Errorf("endpoint %s/%s: %w", a.w.Namespace, name, gerr))
	}
	var addrs []netip.Addr
	if gerr == nil && wep.Metadata.Annotations[api.AnnotationNoIPAM] == "true" {
		addrs = endpointAddrs(wep)
	} else {
		held, aerr := h.ipam.AddressesByHandle(ctx, a.handle)
		if aerr != nil {
			return cniErr(codeIPAM, "reading addresses of "+a.handle, aerr)
		}
		if len(held) == 0 {
			errs = append(errs, fmt.Errorf("ipam: handle %s holds no address", a.handle))
		}
		addrs = held
	}
	var prevAddrs []netip.Addr
	for _, ipc := range prev.IPs {
		if a, ok := netip.AddrFromSlice(ipc.Address.IP); ok {
			prevAddrs = append(prevAddrs, a.Unmap())
		}
	}
	slices.SortFunc(prevAddrs, netip.Addr.Compare)
	slices.SortFunc(addrs, netip.Addr.Compare)
	if !slices.Equal(prevAddrs, addrs) {
		errs = append(errs, fmt.Errorf("addresses: the attachment holds %v, the previous result says %v", addrs, prevAddrs))
	}
	spec := dataplane.WorkloadSpec{NetNS: req.Netns, IfName: req.IfName, HostIfName: a.hostIf, MTU: h.podMTU(conf)}
	for _, a := range addrs {
		spec.Addrs = append(spec.Addrs, netip.PrefixFrom(a, a.BitLen()))
	}
	if cerr := h.wl.Check(ctx, spec); cerr != nil {
		errs = append(errs, cerr)
	}
	if gerr == nil {
		if wep.Spec.ContainerID != req.ContainerID {
			errs = append(errs, fmt.Errorf("endpoint belongs to container %s", shortID(wep.Spec.ContainerID)))
		}
		var want []string
		for _, p := range spec.Addrs {
			want = append(want, p.String())
		}
		if !slices.Equal(want, wep.Spec.IPNetworks) {
			errs = append(errs, fmt.Errorf("endpoint has ipNetworks %v, want %v", wep.Spec.IPNetworks, want))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return cniErr(types.ErrInternal, "check of "+shortID(req.ContainerID)+" found differences", err)
	}
	return nil
}

// endpointAddrs are the addresses of an endpoint's ipNetworks.
func endpointAddrs(wep *api.WorkloadEndpoint) []netip.Addr {
	var out []netip.Addr
	for _, n := range wep.Spec.IPNetworks {
		if p, err := netip.ParsePrefix(n); err == nil {
			out = append(out, p.Addr())
		}
	}
	return out
}

// Status reports whether ADD can be served: the datastore must answer.
func (h *cniHandler) Status(ctx context.Context, conf *cni.NetConf) error {
	ctx, cancel := context.WithTimeout(ctx, storeCallTimeout)
	defer cancel()
	if _, err := h.store.GetKV(ctx, datastore.NodeLivenessKey(h.node)); err != nil && !errors.Is(err, datastore.ErrNotFound) {
		return cniErr(types.ErrPluginNotAvailable, "tabby-agent cannot reach the datastore", err)
	}
	return nil
}

// GC removes this node's attachments of the network that the runtime no
// longer knows, each with DEL's removal steps.
func (h *cniHandler) GC(ctx context.Context, conf *cni.NetConf, valid []types.GCAttachment) error {
	keep := map[string]bool{}
	for _, v := range valid {
		keep[v.ContainerID+"/"+v.IfName] = true
	}
	var errs []error
	for _, wep := range h.view.EndpointsOn(h.node) {
		if keep[wep.Spec.ContainerID+"/"+wep.Spec.Endpoint] {
			continue
		}
		if h.isAdding(wep.Spec.InterfaceName) {
			continue // being added right now; the runtime's list may lag
		}
		handle := ipamHandle(conf.Name, wep.Spec.ContainerID)
		if wep.Spec.IPAMHandle != "" && wep.Spec.IPAMHandle != handle {
			continue // another network's attachment
		}
		rm := &removal{spec: dataplane.WorkloadSpec{HostIfName: wep.Spec.InterfaceName, SkipHostRoutes: true},
			ns: wep.Metadata.Namespace, wep: wep.Metadata.Name, rv: wep.Metadata.ResourceVersion, handle: handle}
		if _, err := h.runner.RunAll(ctx, "gc", h.removalSteps(rm)); err != nil {
			errs = append(errs, err)
		}
		h.log.Info("gc removed attachment", "container", shortID(wep.Spec.ContainerID), "endpoint", wep.Metadata.Name)
	}
	if err := errors.Join(errs...); err != nil {
		return cniErr(types.ErrTryAgainLater, "gc", err)
	}
	return nil
}

func (h *cniHandler) done(op string, start time.Time, err error) {
	if h.observe != nil {
		h.observe(op, time.Since(start), err)
	}
}

// boundedAddresses bounds each IPAM call by storeCallTimeout.
type boundedAddresses struct{ a attach.Addresses }

func bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, storeCallTimeout)
}

func (b boundedAddresses) Assign(ctx context.Context, req ipam.AssignRequest) (ipam.Assignment, error) {
	ctx, cancel := bounded(ctx)
	defer cancel()
	return b.a.Assign(ctx, req)
}

func (b boundedAddresses) ReleaseHandle(ctx context.Context, handle string) error {
	ctx, cancel := bounded(ctx)
	defer cancel()
	return b.a.ReleaseHandle(ctx, handle)
}

func (b boundedAddresses) ReleaseAddrHeldBy(ctx context.Context, addr netip.Addr, handle string) error {
	ctx, cancel := bounded(ctx)
	defer cancel()
	return b.a.ReleaseAddrHeldBy(ctx, addr, handle)
}

func (b boundedAddresses) AddressesByHandle(ctx context.Context, handle string) ([]netip.Addr, error) {
	ctx, cancel := bounded(ctx)
	defer cancel()
	return b.a.AddressesByHandle(ctx, handle)
}

func (b boundedAddresses) EnsureFreeBlock(ctx context.Context, node string, family int) (netip.Prefix, error) {
	ctx, cancel := bounded(ctx)
	defer cancel()
	return b.a.EnsureFreeBlock(ctx, node, family)
}

// storeEndpoints are the endpoints in the datastore, each call bounded by
// storeCallTimeout.
type storeEndpoints struct{ store *datastore.Store }

func (s storeEndpoints) Get(ctx context.Context, ns, name string) (*api.WorkloadEndpoint, error) {
	ctx, cancel := bounded(ctx)
	defer cancel()
	return datastore.GetAs[*api.WorkloadEndpoint](ctx, s.store, api.KindWorkloadEndpoint, ns, name)
}

// Put creates or replaces the endpoint and returns the revision that holds
// it. A stale endpoint of an earlier sandbox of the same pod is replaced.
// For a new attachment (fresh) the endpoint is most likely not there: one
// create, one etcd round trip, instead of Apply's read and write; only if
// it exists after all does Apply replace it.
func (s storeEndpoints) Put(ctx context.Context, wep *api.WorkloadEndpoint, fresh bool) (int64, error) {
	ctx, cancel := bounded(ctx)
	defer cancel()
	var obj api.Object
	err := datastore.ErrExists
	if fresh {
		obj, err = s.store.Create(ctx, wep)
	}
	if errors.Is(err, datastore.ErrExists) {
		obj, err = s.store.Apply(ctx, wep)
	}
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(obj.GetMeta().ResourceVersion, 10, 64)
}

func (s storeEndpoints) CreateOp(wep *api.WorkloadEndpoint) (*api.WorkloadEndpoint, datastore.Cmp, datastore.Op, error) {
	return datastore.CreateOp(wep)
}

func (s storeEndpoints) Restore(ctx context.Context, wep *api.WorkloadEndpoint) error {
	ctx, cancel := bounded(ctx)
	defer cancel()
	_, err := s.store.Apply(ctx, wep)
	return err
}

func (s storeEndpoints) Delete(ctx context.Context, ns, name, rv string) error {
	ctx, cancel := bounded(ctx)
	defer cancel()
	return ignoreNotFound(s.store.Delete(ctx, api.KindWorkloadEndpoint, ns, name, rv))
}
