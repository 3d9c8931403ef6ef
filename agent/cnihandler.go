package agent

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/cni"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/syncer"
)

// storeCallTimeout bounds each datastore step of a CNI request, so that an
// unreachable etcd fails the request well within the runtime's deadline
// instead of at it. A healthy step takes milliseconds.
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

// cniHandler carries out CNI requests for this node. It is safe for
// concurrent use; the cni.Server serialises requests per container.
type cniHandler struct {
	node  string
	store *datastore.Store
	ipam  *ipam.Allocator
	wl    dataplane.Workloads
	// view answers GC's question which endpoints this node has.
	view *syncer.Syncer
	// routes installs a new pod's routes (the one writer of them).
	routes *routeOwner
	log    *slog.Logger
	// fault, when set, is called after each step of ADD with the step's
	// name; a non-nil error aborts ADD there (tests inject failures).
	fault func(step string) error
	// observe records a finished operation (metrics).
	observe func(op string, d time.Duration, err error)
	// wlocks serialises requests of one workload across its sandboxes.
	wlocks cni.KeyedLocks
	// observeAssign records an IPAM assignment (metrics).
	observeAssign func(borrowed bool, err error)
	// policySync, when set, programs the firewall for the endpoint stored
	// at the given revision before ADD returns, so that a pod never runs
	// without its policy.
	policySync func(ctx context.Context, wep *api.WorkloadEndpoint, rev int64) error

	// advertised, when set, returns once BGP advertises the prefix: ADD
	// of a pod in a block claimed for it (or with a borrowed address) waits
	// for it, at most advertiseWait, so that the pod's first packets to
	// other nodes are not lost while its route propagates.
	advertised func(ctx context.Context, p netip.Prefix) error

	// runCtx is the agent's run context: a spare-block claim outlives its
	// request, not the agent.
	runCtx context.Context
	// spareBusy marks the families whose spare-block claim is running
	// (claimSpare).
	spareMu   sync.Mutex
	spareBusy map[int]bool

	addingMu sync.Mutex
	adding   map[string]bool // host interfaces ADD is working on
}

func (h *cniHandler) step(name string) error {
	if h.fault == nil {
		return nil
	}
	return h.fault(name)
}

func cniErr(code uint, msg string, err error) *types.Error {
	return &types.Error{Code: code, Msg: msg, Details: err.Error()}
}

// Add assigns an address, wires the pod, installs its routes, records its
// endpoint and programs its policy. Each step that changed something
// pushes its inverse on one undo stack, run in reverse if a later step
// fails; a repeated ADD returns the same result.
func (h *cniHandler) Add(ctx context.Context, req *cni.Request, conf *cni.NetConf, args *cni.Args) (_ *current.Result, err error) {
	start := time.Now()
	defer func() { h.done("add", start, err) }()
	if req.ContainerID == "" || req.IfName == "" {
		return nil, &types.Error{Code: types.ErrInvalidEnvironmentVariables, Msg: "CNI_CONTAINERID and CNI_IFNAME are required"}
	}
	if req.Netns == "" {
		return nil, &types.Error{Code: types.ErrInvalidEnvironmentVariables, Msg: "CNI_NETNS is required for ADD"}
	}
	w := newWorkloadID(req, args)
	handle := ipamHandle(conf.Name, req.ContainerID)
	hostIf := w.hostIfName()
	unlock, err := h.wlocks.Lock(ctx, hostIf)
	if err != nil {
		return nil, cniErr(types.ErrTryAgainLater, "waiting for another request of the same pod", err)
	}
	defer unlock()
	h.setAdding(hostIf, true)
	defer h.setAdding(hostIf, false)
	// The host name is 44 bits of a hash: make sure it is not another
	// workload's, whose link Setup would otherwise take for a stale one.
	if other := h.interfaceHolder(w, hostIf); other != nil {
		return nil, cniErr(codeDataplane, "host interface name collision",
			fmt.Errorf("%s, the host interface of %s, is already that of endpoint %s/%s (container %s)",
				hostIf, w.key(), other.Metadata.Namespace, other.Metadata.Name, shortID(other.Spec.ContainerID)))
	}

	var undo undoStack
	defer func() {
		if err == nil {
			return
		}
		// Undo with a fresh deadline: the request's may be what failed.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if uerr := undo.run(rctx); uerr != nil {
			h.log.Error("rolling back failed ADD left state behind", "container", req.ContainerID, "err", uerr)
		}
	}()

	// 1. The addresses: one of each family the network asks for, under
	// one handle. Meanwhile the veth pair is made (Prepare), when there
	// is none yet: what it needs of the address is added once IPAM has
	// answered (Complete). ADD returns only after Prepare has, and a
	// pair it made goes on the undo stack, so a failure of either side
	// undoes both.
	t0 := time.Now()
	reqs, info, err := h.assignRequests(ctx, w, req, conf, args, handle)
	if err != nil {
		return nil, err
	}
	mac := args.MAC
	if mac == "" {
		mac = containerMAC(req.ContainerID, req.IfName)
	}
	spec := dataplane.WorkloadSpec{
		NetNS:          req.Netns,
		IfName:         req.IfName,
		HostIfName:     hostIf,
		MTU:            conf.MTU,
		MAC:            mac,
		SkipHostRoutes: true,
	}
	type prepResult struct {
		p    dataplane.Prepared
		err  error
		took time.Duration
	}
	prepc := make(chan prepResult, 1)
	go func(spec dataplane.WorkloadSpec) {
		p, err := h.wl.Prepare(ctx, spec)
		prepc <- prepResult{p, err, time.Since(t0)}
	}(spec) // a copy: the addresses are added to spec meanwhile
	var prep *prepResult
	waitPrepared := func() *prepResult {
		if prep == nil {
			r := <-prepc
			prep = &r
			if r.err == nil && r.p.Created {
				undo.push("removing interfaces", func(ctx context.Context) error { return h.wl.Teardown(ctx, spec) })
			}
		}
		return prep
	}
	// On every return, after the steps below pushed theirs and before the
	// undo stack runs (deferred earlier, so it runs later).
	defer waitPrepared()
	// A repeated ADD of a live attachment must leave it as it was when it
	// fails: only a successful ADD replaces, only DEL removes. What it
	// finds already there is therefore never pushed on the undo stack.
	// IPAM says whether this is a repeat; only a repeat reads the endpoint
	// (or every ADD of an address without IPAM, which IPAM knows nothing of).
	var asgs []ipam.Assignment
	readPrior := false
	if info.noIPAM.IsValid() {
		asgs = []ipam.Assignment{{Addr: info.noIPAM}}
		handle = ""
		readPrior = true
	} else {
		for _, areq := range reqs {
			actx, cancel := context.WithTimeout(ctx, storeCallTimeout)
			a, err := h.ipam.Assign(actx, areq)
			cancel()
			if h.observeAssign != nil {
				h.observeAssign(a.Borrowed, err)
			}
			if err != nil {
				if len(areq.Pools) > 0 && errors.Is(err, ipam.ErrNoPool) {
					return nil, cniErr(types.ErrInvalidNetworkConfig, fmt.Sprintf("network %s: ipv%d_pools %v", conf.Name, areq.Family, areq.Pools), err)
				}
				return nil, cniErr(codeIPAM, fmt.Sprintf("assigning an IPv%d address for %s", areq.Family, handle), err)
			}
			asgs = append(asgs, a)
			readPrior = readPrior || a.Existing
		}
		if readPrior {
			for _, a := range asgs {
				if !a.Existing {
					addr := a.Addr
					undo.push("releasing address "+addr.String(), func(ctx context.Context) error { return h.ipam.ReleaseAddrHeldBy(ctx, addr, handle) })
				}
			}
		} else {
			undo.push("releasing addresses", func(ctx context.Context) error { return h.ipam.ReleaseHandle(ctx, handle) })
		}
	}
	var prior *api.WorkloadEndpoint
	if readPrior {
		gctx, cancel := context.WithTimeout(ctx, storeCallTimeout)
		prior, err = h.endpointOf(gctx, w, req.ContainerID)
		cancel()
		if err != nil {
			return nil, cniErr(codeDatastore, "reading the endpoint of "+shortID(req.ContainerID), err)
		}
	}
	if err = h.step("assign"); err != nil {
		return nil, err
	}
	asg := asgs[0] // the first family's address (IPv4 when the network has it), for the log
	var addrs []netip.Addr
	var prefixes []netip.Prefix
	// New routes to advertise, one per family at most: wait for them
	// alongside the other steps (h.advertised returns at once for a
	// family BGP does not carry).
	var advPrefixes []netip.Prefix
	for _, a := range asgs {
		addrs = append(addrs, a.Addr)
		prefixes = append(prefixes, netip.PrefixFrom(a.Addr, a.Addr.BitLen()))
		switch {
		case h.advertised == nil || a.Existing:
		case a.NewBlock:
			advPrefixes = append(advPrefixes, a.Block)
		case a.Borrowed:
			advPrefixes = append(advPrefixes, netip.PrefixFrom(a.Addr, a.Addr.BitLen()))
		}
	}
	advc := make(chan error, 1)
	if len(advPrefixes) > 0 {
		go func() {
			wctx, cancel := context.WithTimeout(ctx, advertiseWait)
			defer cancel()
			var errs []error
			for _, p := range advPrefixes {
				errs = append(errs, h.advertised(wctx, p))
			}
			advc <- errors.Join(errs...)
		}()
	} else {
		advc <- nil
	}

	// 2. The endpoint record (then its policy) and the interfaces (then
	// their routes) need only the address, so they are made concurrently:
	// ADD costs the longer of the two, not the sum. Policy rules match the
	// host interface by name, so they can be programmed while the
	// interface is still being made.
	spec.Addrs = prefixes
	t1 := time.Now()
	wep := buildEndpoint(h.node, w, handle, addrs, hostIf, mac, args.Labels)
	wep.Spec.NamespaceLabels = info.nsLabels
	wep.Spec.Ports = info.ports
	wep.Metadata.Annotations = map[string]string{api.AnnotationOrigin: api.OriginAgent}
	if info.kube {
		// Its labels come from Kubernetes, and the controllers keep them.
		wep.Metadata.Annotations[api.AnnotationOrigin] = api.OriginKubernetes
	}
	if info.noIPAM.IsValid() {
		wep.Metadata.Annotations[api.AnnotationNoIPAM] = "true"
	}
	type epResult struct {
		stored bool
		err    error
		polErr error
		took   time.Duration // the write
		pol    time.Duration // then the policy pass
	}
	epc := make(chan epResult, 1)
	go func() {
		var r epResult
		var rev int64
		rev, r.err = h.putEndpoint(ctx, wep, !readPrior)
		r.stored, r.took = r.err == nil, time.Since(t1)
		if r.err == nil && h.policySync != nil {
			pctx, cancel := context.WithTimeout(ctx, storeCallTimeout)
			r.polErr = h.policySync(pctx, wep, rev)
			cancel()
			r.pol = time.Since(t1) - r.took
		}
		epc <- r
	}()
	var st dataplane.WorkloadStatus
	setupErr := waitPrepared().err
	if setupErr == nil {
		st, setupErr = h.wl.Complete(ctx, spec, prep.p)
	}
	var routeErr error
	if setupErr == nil {
		if !st.Existed && !prep.p.Created {
			undo.push("removing interfaces", func(ctx context.Context) error { return h.wl.Teardown(ctx, spec) })
		}
		routeErr = h.routes.Wire(hostIf, dataplane.HostRoutes(spec))
		if !st.Existed {
			undo.push("withdrawing routes", func(context.Context) error { h.routes.Unwire(hostIf); return nil })
		}
	}
	setupTook := time.Since(t1)
	ep := <-epc
	if prior != nil {
		// The live pod's record: put it back as it was.
		undo.push("restoring endpoint", func(ctx context.Context) error {
			_, err := h.store.Apply(ctx, prior)
			return err
		})
	} else if ep.stored {
		undo.push("removing endpoint", func(ctx context.Context) error {
			return ignoreNotFound(h.store.Delete(ctx, api.KindWorkloadEndpoint, w.Namespace, wep.Metadata.Name, ""))
		})
	} else {
		// The write failed, but etcd may have committed it (a timeout):
		// remove the endpoint if it names this container.
		undo.push("removing endpoint", func(ctx context.Context) error {
			return h.deleteEndpointOf(ctx, w.Namespace, wep.Metadata.Name, req.ContainerID)
		})
	}
	switch {
	case setupErr != nil:
		return nil, cniErr(codeDataplane, "wiring "+req.IfName+" in "+req.Netns, setupErr)
	case routeErr != nil:
		return nil, cniErr(codeDataplane, "routing to "+hostIf, routeErr)
	}
	if err = h.step("dataplane"); err != nil {
		return nil, err
	}
	if ep.err != nil {
		return nil, cniErr(codeDatastore, "recording endpoint "+wep.Metadata.Name, ep.err)
	}
	if err = h.step("endpoint"); err != nil {
		return nil, err
	}
	if ep.polErr != nil {
		return nil, cniErr(codeDataplane, "programming policy for "+wep.Metadata.Name, ep.polErr)
	}
	tAdv := time.Now()
	if aerr := <-advc; aerr != nil {
		h.log.Warn("pod added before its route was advertised", "container", shortID(req.ContainerID), "prefixes", advPrefixes, "err", aerr)
	} else if len(advPrefixes) > 0 {
		h.log.Info("waited for the pod's route to be advertised", "prefixes", advPrefixes, "waited", time.Since(tAdv).Round(time.Microsecond))
	}
	h.log.Info("workload added", "container", shortID(req.ContainerID), "pod", w.Namespace+"/"+w.Pod, "ips", addrs, "iface", hostIf, "borrowed", asg.Borrowed,
		"ipam", t1.Sub(t0).Round(time.Microsecond), "prepare", prep.took.Round(time.Microsecond),
		"dataplane", setupTook.Round(time.Microsecond), "endpoint", ep.took.Round(time.Microsecond), "policy", ep.pol.Round(time.Microsecond))
	if handle != "" {
		h.claimSpare(addrs)
	}
	return buildResult(req, addrs, hostIf, st), nil
}

// spareClaimTimeout bounds a background spare-block claim.
const spareClaimTimeout = 10 * time.Second

// claimSpare makes sure, in the background, that the node keeps a block
// with a free address in each family it just assigned from: when the
// pod took the last one, the next pod would open a block and wait for its
// route to reach the other nodes — and a packet answered by a node that
// has not installed it yet is lost. One claim per family at a time; with
// room left it costs nothing (IPAM's cache answers).
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
		busy := h.spareBusy[fam]
		h.spareBusy[fam] = true
		h.spareMu.Unlock()
		if busy {
			continue
		}
		go func() {
			defer func() {
				h.spareMu.Lock()
				h.spareBusy[fam] = false
				h.spareMu.Unlock()
			}()
			ctx, cancel := context.WithTimeout(h.runCtx, spareClaimTimeout)
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

// assignRequests builds the IPAM requests of an ADD, one per family the
// network assigns (IPv4 first): the family's pools, the runtime's
// requested address of that family, and for IPv4 the pod's address
// annotations (Kubernetes). A requested address of a family the network
// does not assign is an error.
func (h *cniHandler) assignRequests(ctx context.Context, w workloadID, req *cni.Request, conf *cni.NetConf, args *cni.Args, handle string) ([]ipam.AssignRequest, podInfo, error) {
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
	info, err := h.applyPodInfo(ctx, w, conf, args, &v4, &v6)
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

// undoStack holds the inverse of each step a request completed.
type undoStack []undoStep

type undoStep struct {
	what string
	do   func(context.Context) error
}

func (u *undoStack) push(what string, do func(context.Context) error) {
	*u = append(*u, undoStep{what, do})
}

// run undoes every step, last first, and keeps going after a failure.
func (u undoStack) run(ctx context.Context) error {
	var errs []error
	for i := len(u) - 1; i >= 0; i-- {
		if err := u[i].do(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", u[i].what, err))
		}
	}
	return errors.Join(errs...)
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
	obj, err := h.store.Get(ctx, api.KindWorkloadEndpoint, w.Namespace, w.endpointName(h.node))
	if errors.Is(err, datastore.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if wep, ok := obj.(*api.WorkloadEndpoint); ok && wep.Spec.ContainerID == containerID {
		return wep, nil
	}
	return nil, nil
}

// deleteEndpointOf deletes the endpoint if it exists and belongs to
// containerID (compare-and-swap on the revision read).
func (h *cniHandler) deleteEndpointOf(ctx context.Context, ns, name, containerID string) error {
	obj, err := h.store.Get(ctx, api.KindWorkloadEndpoint, ns, name)
	if errors.Is(err, datastore.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if wep, ok := obj.(*api.WorkloadEndpoint); !ok || wep.Spec.ContainerID != containerID {
		return nil
	}
	err = h.store.Delete(ctx, api.KindWorkloadEndpoint, ns, name, obj.GetMeta().ResourceVersion)
	if errors.Is(err, datastore.ErrNotFound) {
		return nil
	}
	return err
}

// containerMAC derives a stable, locally administered unicast MAC for a
// container interface, so that a repeated ADD asks for the same one.
func containerMAC(containerID, ifName string) string {
	sum := sha256.Sum256([]byte(containerID + "/" + ifName))
	sum[0] = sum[0]&0xfe | 0x02
	return net.HardwareAddr(sum[:6]).String()
}

// putEndpoint creates or replaces the endpoint and returns the revision
// that holds it. A stale endpoint of an earlier sandbox of the same pod is
// replaced. For a new attachment (fresh) the endpoint is most likely not
// there: one create, one etcd round trip, instead of Apply's read and
// write; only if it exists after all does Apply replace it.
func (h *cniHandler) putEndpoint(ctx context.Context, wep *api.WorkloadEndpoint, fresh bool) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, storeCallTimeout)
	defer cancel()
	var obj api.Object
	err := datastore.ErrExists
	if fresh {
		obj, err = h.store.Create(ctx, wep)
	}
	if errors.Is(err, datastore.ErrExists) {
		obj, err = h.store.Apply(ctx, wep)
	}
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(obj.GetMeta().ResourceVersion, 10, 64)
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

// Del removes the pod's interfaces, endpoint and address. Every missing piece
// counts as success; it works without the netns and without an endpoint.
func (h *cniHandler) Del(ctx context.Context, req *cni.Request, conf *cni.NetConf, args *cni.Args) (err error) {
	start := time.Now()
	defer func() { h.done("del", start, err) }()
	if req.ContainerID == "" {
		return &types.Error{Code: types.ErrInvalidEnvironmentVariables, Msg: "CNI_CONTAINERID is required"}
	}
	if req.IfName == "" {
		req.IfName = "eth0"
	}
	w := newWorkloadID(req, args)
	handle := ipamHandle(conf.Name, req.ContainerID)
	var errs []error
	// Without a datastore DEL cannot finish; fail fast and let the runtime retry.
	ctx, cancel := context.WithTimeout(ctx, storeCallTimeout)
	defer cancel()

	// Deleting the host link takes the pod's side and its routes with it.
	spec := dataplane.WorkloadSpec{NetNS: req.Netns, IfName: req.IfName, HostIfName: w.hostIfName(), SkipHostRoutes: true}
	unlock, err := h.wlocks.Lock(ctx, spec.HostIfName)
	if err != nil {
		return cniErr(types.ErrTryAgainLater, "waiting for another request of the same pod", err)
	}
	defer unlock()

	// The endpoint tells whether a newer sandbox of the same pod now owns the
	// host interface; if so, leave the host side alone. Without an answer
	// it is not safe to touch the host side: fail and let the runtime retry.
	wepName := w.endpointName(h.node)
	obj, gerr := h.store.Get(ctx, api.KindWorkloadEndpoint, w.Namespace, wepName)
	if legacy, ok := w.legacyEndpointName(h.node); ok && errors.Is(gerr, datastore.ErrNotFound) {
		// Written by an agent that named endpoints by 12 characters of the
		// container ID: remove it only if it is this container's.
		if lobj, lerr := h.store.Get(ctx, api.KindWorkloadEndpoint, w.Namespace, legacy); lerr == nil {
			if wep, ok := lobj.(*api.WorkloadEndpoint); ok && wep.Spec.ContainerID == req.ContainerID {
				wepName, obj, gerr = legacy, lobj, nil
			}
		}
	}
	ownsEndpoint := true
	switch {
	case errors.Is(gerr, datastore.ErrNotFound):
		ownsEndpoint = false
	case gerr != nil:
		return cniErr(types.ErrTryAgainLater, "removing workload "+shortID(req.ContainerID),
			fmt.Errorf("reading endpoint %s/%s: %w", w.Namespace, wepName, gerr))
	default:
		if wep, ok := obj.(*api.WorkloadEndpoint); ok && wep.Spec.ContainerID != req.ContainerID {
			ownsEndpoint = false
			spec.HostIfName = ""
			h.log.Info("DEL of an old sandbox: the pod's interface belongs to a newer one", "container", shortID(req.ContainerID), "current", shortID(wep.Spec.ContainerID))
		}
	}
	// The kernel work and the datastore work are independent: do them
	// concurrently. When a newer sandbox owns the host interface, the old
	// pair is already gone: creating the new one deleted the stale link and
	// with it its peer.
	var teardownErr error
	tdDone := make(chan struct{})
	go func() {
		defer close(tdDone)
		if spec.HostIfName != "" {
			// The link takes its routes with it; the route owner drops any
			// it still holds for an ADD that did not finish.
			teardownErr = h.wl.Teardown(ctx, spec)
			h.routes.Unwire(spec.HostIfName)
		}
	}()
	if ownsEndpoint {
		rv := obj.GetMeta().ResourceVersion
		if derr := h.store.Delete(ctx, api.KindWorkloadEndpoint, w.Namespace, wepName, rv); derr != nil && !errors.Is(derr, datastore.ErrNotFound) {
			errs = append(errs, fmt.Errorf("removing endpoint: %w", derr))
		}
	}
	if rerr := h.ipam.ReleaseHandle(ctx, handle); rerr != nil {
		errs = append(errs, fmt.Errorf("releasing addresses of %s: %w", handle, rerr))
	}
	<-tdDone
	if teardownErr != nil {
		errs = append(errs, fmt.Errorf("removing interfaces: %w", teardownErr))
	}
	if err := errors.Join(errs...); err != nil {
		return cniErr(types.ErrTryAgainLater, "removing workload "+shortID(req.ContainerID), err)
	}
	h.log.Info("workload deleted", "container", shortID(req.ContainerID), "pod", w.Namespace+"/"+w.Pod)
	return nil
}

// Check compares the pod's interfaces, address, routes and endpoint with what
// ADD made and reports every difference.
func (h *cniHandler) Check(ctx context.Context, req *cni.Request, conf *cni.NetConf, args *cni.Args, prev *current.Result) (err error) {
	start := time.Now()
	defer func() { h.done("check", start, err) }()
	w := newWorkloadID(req, args)
	handle := ipamHandle(conf.Name, req.ContainerID)
	var errs []error
	addrs, aerr := h.ipam.AddressesByHandle(ctx, handle)
	if aerr != nil {
		return cniErr(codeIPAM, "reading addresses of "+handle, aerr)
	}
	if len(addrs) == 0 {
		errs = append(errs, fmt.Errorf("ipam: handle %s holds no address", handle))
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
		errs = append(errs, fmt.Errorf("ipam: handle %s holds %v, the previous result says %v", handle, addrs, prevAddrs))
	}
	spec := dataplane.WorkloadSpec{NetNS: req.Netns, IfName: req.IfName, HostIfName: w.hostIfName(), MTU: conf.MTU}
	for _, a := range addrs {
		spec.Addrs = append(spec.Addrs, netip.PrefixFrom(a, a.BitLen()))
	}
	if cerr := h.wl.Check(ctx, spec); cerr != nil {
		errs = append(errs, cerr)
	}
	obj, gerr := h.store.Get(ctx, api.KindWorkloadEndpoint, w.Namespace, w.endpointName(h.node))
	switch {
	case gerr != nil:
		errs = append(errs, fmt.Errorf("endpoint %s/%s: %w", w.Namespace, w.endpointName(h.node), gerr))
	default:
		wep := obj.(*api.WorkloadEndpoint)
		if wep.Spec.ContainerID != req.ContainerID {
			errs = append(errs, fmt.Errorf("endpoint belongs to container %s", shortID(wep.Spec.ContainerID)))
		}
		var want []string
		for _, a := range addrs {
			want = append(want, netip.PrefixFrom(a, a.BitLen()).String())
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

// Status reports whether ADD can be served: the datastore must answer.
func (h *cniHandler) Status(ctx context.Context, conf *cni.NetConf) error {
	if _, err := h.store.GetKV(ctx, datastore.NodeLivenessKey(h.node)); err != nil && !errors.Is(err, datastore.ErrNotFound) {
		return cniErr(types.ErrPluginNotAvailable, "tabby-agent cannot reach the datastore", err)
	}
	return nil
}

// GC removes this node's attachments of the network that the runtime no
// longer knows.
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
		if wep.Spec.IPAMHandle != "" && wep.Spec.IPAMHandle != ipamHandle(conf.Name, wep.Spec.ContainerID) {
			continue // another network's attachment
		}
		spec := dataplane.WorkloadSpec{HostIfName: wep.Spec.InterfaceName, SkipHostRoutes: true}
		if terr := h.wl.Teardown(ctx, spec); terr != nil {
			errs = append(errs, terr)
		}
		if derr := h.store.Delete(ctx, api.KindWorkloadEndpoint, wep.Metadata.Namespace, wep.Metadata.Name, wep.Metadata.ResourceVersion); derr != nil && !errors.Is(derr, datastore.ErrNotFound) {
			errs = append(errs, derr)
		}
		if rerr := h.ipam.ReleaseHandle(ctx, ipamHandle(conf.Name, wep.Spec.ContainerID)); rerr != nil {
			errs = append(errs, rerr)
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
