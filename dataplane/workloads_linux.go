package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetlinkWorkloads implements Workloads with netlink. Host ends and host
// routes live in the node's network namespace, fixed at construction; each
// call opens its own netlink sockets, so calls for different workloads may
// run concurrently.
type NetlinkWorkloads struct {
	mu      sync.Mutex
	nodeNS  netns.NsHandle
	devconf *devconfSocket // nil: the host interface's settings go through /proc/sys
}

var _ Workloads = (*NetlinkWorkloads)(nil)

// NewWorkloads returns Workloads whose host side is the network namespace at
// nodeNetNSPath ("" = the namespace of the calling thread). The caller must
// Close it.
func NewWorkloads(nodeNetNSPath string) (*NetlinkWorkloads, error) {
	nsh, err := openNetNS(nodeNetNSPath)
	if err != nil {
		return nil, err
	}
	w := &NetlinkWorkloads{nodeNS: nsh}
	if w.devconf, err = newDevconfSocket(nsh); err != nil {
		nsh.Close()
		return nil, err
	}
	return w, nil
}

// Close releases the node namespace handle.
func (w *NetlinkWorkloads) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.nodeNS.IsOpen() {
		return nil
	}
	err := w.nodeNS.Close()
	w.nodeNS = netns.None()
	if w.devconf != nil {
		w.devconf.close()
		w.devconf = nil
	}
	return err
}

// nodeNSDup returns a copy of the node namespace handle that the caller must
// close, so that Close cannot pull it away under a running call.
func (w *NetlinkWorkloads) nodeNSDup() (netns.NsHandle, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.nodeNS.IsOpen() {
		return netns.None(), errClosed
	}
	fd, err := unix.FcntlInt(uintptr(w.nodeNS), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return netns.None(), fmt.Errorf("duplicating node netns handle: %w", err)
	}
	return netns.NsHandle(fd), nil
}

// workloadCall holds what one Setup, Teardown or Check works with.
type workloadCall struct {
	spec   WorkloadSpec
	nodeNS netns.NsHandle
	node   *netlink.Handle
	contNS netns.NsHandle
	cont   *netlink.Handle
	conf   *devconfSocket
}

// open opens the node and (if it exists) container namespaces. contGone
// reports a container namespace that does not exist (any more).
func (w *NetlinkWorkloads) open(spec WorkloadSpec) (c *workloadCall, contGone bool, err error) {
	c = &workloadCall{spec: spec, nodeNS: netns.None(), contNS: netns.None()}
	w.mu.Lock()
	c.conf = w.devconf
	w.mu.Unlock()
	defer func() {
		if err != nil {
			c.close()
			c = nil
		}
	}()
	if c.nodeNS, err = w.nodeNSDup(); err != nil {
		return c, false, err
	}
	if c.node, err = newHandleAt(c.nodeNS); err != nil {
		return c, false, fmt.Errorf("node netns: %w", err)
	}
	if spec.NetNS == "" {
		return c, true, nil
	}
	if c.contNS, err = openNetNS(spec.NetNS); err != nil {
		if netnsGone(err) {
			return c, true, nil
		}
		return c, false, err
	}
	if c.cont, err = newHandleAt(c.contNS); err != nil {
		return c, false, fmt.Errorf("netns %s: %w", spec.NetNS, err)
	}
	return c, false, nil
}

func (c *workloadCall) close() {
	if c.cont != nil {
		c.cont.Close()
	}
	if c.node != nil {
		c.node.Close()
	}
	if c.contNS.IsOpen() {
		c.contNS.Close()
	}
	if c.nodeNS.IsOpen() {
		c.nodeNS.Close()
	}
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

// linkByName returns the link or nil if there is none.
func linkByName(h *netlink.Handle, name string) (netlink.Link, error) {
	l, err := h.LinkByName(name)
	if isNotFound(err) {
		return nil, nil
	}
	return l, err
}

// isPair reports whether host (in the node namespace) and cont (in the
// container namespace) are the two ends of one veth.
func (c *workloadCall) isPair(host, cont netlink.Link) bool {
	if host.Type() != "veth" || cont.Type() != "veth" {
		return false
	}
	ha, ca := host.Attrs(), cont.Attrs()
	if ha.ParentIndex != ca.Index || ca.ParentIndex != ha.Index {
		return false
	}
	// The index check could match by chance across namespaces; the netns id
	// of the peer, where the kernel has one, settles it.
	if id, err := c.node.GetNetNsIdByFd(int(c.contNS)); err == nil && id >= 0 && ha.NetNsID >= 0 {
		return id == ha.NetNsID
	}
	return true
}

var hostHWAddr, _ = net.ParseMAC(HostMAC)

// openLive is open for a call that needs the pod's namespace: it fails,
// naming verb, when ctx is done or the namespace is gone.
func (w *NetlinkWorkloads) openLive(ctx context.Context, spec WorkloadSpec, verb string) (*workloadCall, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s %s: %w", verb, spec.HostIfName, err)
	}
	c, contGone, err := w.open(spec)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", verb, spec.HostIfName, err)
	}
	if contGone {
		c.close()
		return nil, fmt.Errorf("%s %s: netns %s does not exist", verb, spec.HostIfName, spec.NetNS)
	}
	return c, nil
}

// Setup implements Workloads.
//
// It creates the veth pair (or keeps a pair that is already right), then
// converges every attribute, each step changing only what differs. A host
// link of the same name that is not the peer of the container interface is
// stale and replaced. If a step fails, everything this call created is
// removed again.
func (w *NetlinkWorkloads) Setup(ctx context.Context, spec WorkloadSpec) (_ WorkloadStatus, err error) {
	if err := spec.Validate(); err != nil {
		return WorkloadStatus{}, err
	}
	c, err := w.openLive(ctx, spec, "setting up")
	if err != nil {
		return WorkloadStatus{}, err
	}
	defer c.close()

	// undo holds the inverse of each change this call made, run in reverse
	// order if the call fails. err is the named result, so a failure
	// returned from any step below is seen here.
	var undo []func() error
	defer rollback(&undo, &err)

	host, cont, existed, err := c.ensurePair(&undo)
	if err != nil {
		return WorkloadStatus{}, fmt.Errorf("setting up %s: %w", spec.HostIfName, err)
	}
	steps := []struct {
		what string
		do   func() error
	}{
		{"configuring host interface", func() error { return c.ensureHostLink(host, !existed) }},
		{"configuring container interface", func() error { return c.ensureContainerLink(cont, !existed) }},
	}
	if !spec.SkipHostRoutes {
		steps = append(steps, struct {
			what string
			do   func() error
		}{"adding host routes", func() error { return c.ensureHostRoutes(host, existed, &undo) }})
	}
	for _, st := range steps {
		if err := ctx.Err(); err != nil {
			return WorkloadStatus{}, fmt.Errorf("setting up %s: %w", spec.HostIfName, err)
		}
		if err := st.do(); err != nil {
			return WorkloadStatus{}, fmt.Errorf("setting up %s: %s: %w", spec.HostIfName, st.what, err)
		}
	}
	st := c.status(host, cont)
	st.Existed = existed
	return st, nil
}

// rollback runs the inverse of each change, last first, when *err is set,
// and adds what failed of it to *err.
func rollback(undo *[]func() error, err *error) {
	if *err == nil {
		return
	}
	var uerrs []error
	for i := len(*undo) - 1; i >= 0; i-- {
		if uerr := (*undo)[i](); uerr != nil {
			uerrs = append(uerrs, uerr)
		}
	}
	if len(uerrs) > 0 {
		*err = errors.Join(*err, fmt.Errorf("rolling back: %w", errors.Join(uerrs...)))
	}
}

// Prepare implements Workloads. A new pair costs its creation, the host
// end's settings and lo up here; Complete then adds two or three requests
// for the addresses, the container end up and its routes.
func (w *NetlinkWorkloads) Prepare(ctx context.Context, spec WorkloadSpec) (_ Prepared, err error) {
	if err := spec.ValidateLinks(); err != nil {
		return Prepared{}, err
	}
	c, err := w.openLive(ctx, spec, "preparing")
	if err != nil {
		return Prepared{}, err
	}
	defer c.close()
	host, err := linkByName(c.node, spec.HostIfName)
	if err != nil {
		return Prepared{}, fmt.Errorf("preparing %s: looking up %s: %w", spec.HostIfName, spec.HostIfName, err)
	}
	cont, err := linkByName(c.cont, spec.IfName)
	if err != nil {
		return Prepared{}, fmt.Errorf("preparing %s: looking up %s in %s: %w", spec.HostIfName, spec.IfName, spec.NetNS, err)
	}
	if host != nil || cont != nil {
		return Prepared{}, nil // a repeat or a stale link: Setup's work, once the addresses are known
	}
	var undo []func() error
	defer rollback(&undo, &err)
	host, cont, err = c.createPair(&undo)
	if err != nil {
		return Prepared{}, fmt.Errorf("preparing %s: %w", spec.HostIfName, err)
	}
	if err := c.ensureHostLink(host, true); err != nil { // spec has no IPv6 address yet: IPv4 settings only
		return Prepared{}, fmt.Errorf("preparing %s: configuring host interface: %w", spec.HostIfName, err)
	}
	if err := c.ensureLoUp(); err != nil {
		return Prepared{}, fmt.Errorf("preparing %s: %w", spec.HostIfName, err)
	}
	st := c.status(host, cont)
	return Prepared{Created: true, HostIfIndex: st.HostIfIndex, ContainerIfIndex: st.ContainerIfIndex, ContainerMAC: st.ContainerMAC}, nil
}

// Complete implements Workloads.
func (w *NetlinkWorkloads) Complete(ctx context.Context, spec WorkloadSpec, p Prepared) (_ WorkloadStatus, err error) {
	if !p.Created {
		return w.Setup(ctx, spec)
	}
	var undo []func() error
	defer rollback(&undo, &err)
	// Whatever fails below, the pair Prepare made goes: the ADD fails.
	undo = append(undo, func() error { return w.deleteHostLink(spec) })
	if err := spec.Validate(); err != nil {
		return WorkloadStatus{}, err
	}
	c, err := w.openLive(ctx, spec, "setting up")
	if err != nil {
		return WorkloadStatus{}, err
	}
	defer c.close()
	// The links as Prepare left them; requests need only their indexes.
	host := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: spec.HostIfName, Index: p.HostIfIndex, Flags: net.FlagUp}}
	cont := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: spec.IfName, Index: p.ContainerIfIndex}}
	if spec.HasIPv6() {
		// Before the container end is up, so that the host end's
		// link-local address is not tentative.
		if err := c.ensureHostIPv6(host, true); err != nil {
			return WorkloadStatus{}, fmt.Errorf("setting up %s: configuring host interface: %w", spec.HostIfName, err)
		}
	}
	if err := c.ensureAddrs(cont, true); err != nil {
		return WorkloadStatus{}, fmt.Errorf("setting up %s: configuring container interface: %w", spec.HostIfName, err)
	}
	if err := ensureUp(c.cont, cont); err != nil {
		return WorkloadStatus{}, fmt.Errorf("setting up %s: configuring container interface: %w", spec.HostIfName, err)
	}
	if err := c.ensureContainerRoutes(cont, true); err != nil {
		return WorkloadStatus{}, fmt.Errorf("setting up %s: configuring container interface: %w", spec.HostIfName, err)
	}
	if !spec.SkipHostRoutes {
		if err := c.ensureHostRoutes(host, false, &undo); err != nil {
			return WorkloadStatus{}, fmt.Errorf("setting up %s: adding host routes: %w", spec.HostIfName, err)
		}
	}
	return WorkloadStatus{HostIfIndex: p.HostIfIndex, HostMAC: hostHWAddr.String(), ContainerIfIndex: p.ContainerIfIndex, ContainerMAC: p.ContainerMAC}, nil
}

// deleteHostLink deletes the workload's host link (and with it its peer
// and its routes) if it exists.
func (w *NetlinkWorkloads) deleteHostLink(spec WorkloadSpec) error {
	c, _, err := w.open(WorkloadSpec{HostIfName: spec.HostIfName})
	if err != nil {
		return fmt.Errorf("deleting %s: %w", spec.HostIfName, err)
	}
	defer c.close()
	return c.deleteHostLink()
}

func (c *workloadCall) deleteHostLink() error {
	l, err := linkByName(c.node, c.spec.HostIfName)
	if err != nil || l == nil {
		return err
	}
	if err := c.node.LinkDel(l); err != nil && !isNotFound(err) {
		return fmt.Errorf("deleting %s: %w", c.spec.HostIfName, err)
	}
	return nil
}

// ensurePair returns the host and container ends of the workload's veth,
// creating the pair if needed; existed says it was there already. A new
// pair is made with the host end up and is not read back: LinkAdd looks up
// the new host end's index itself, and the container end is read once (its
// index, and its MAC when the kernel chose it).
func (c *workloadCall) ensurePair(undo *[]func() error) (host, cont netlink.Link, existed bool, err error) {
	spec := c.spec
	if host, err = linkByName(c.node, spec.HostIfName); err != nil {
		return nil, nil, false, fmt.Errorf("looking up %s: %w", spec.HostIfName, err)
	}
	if cont, err = linkByName(c.cont, spec.IfName); err != nil {
		return nil, nil, false, fmt.Errorf("looking up %s in %s: %w", spec.IfName, spec.NetNS, err)
	}
	if host != nil && cont != nil && c.isPair(host, cont) {
		return host, cont, true, nil
	}
	if host != nil {
		// Stale: left by an earlier sandbox, its peer elsewhere. Deleting
		// one end of a veth deletes both, and the routes through it.
		if err := c.node.LinkDel(host); err != nil && !isNotFound(err) {
			return nil, nil, false, fmt.Errorf("deleting stale %s: %w", spec.HostIfName, err)
		}
		if cont, err = linkByName(c.cont, spec.IfName); err != nil {
			return nil, nil, false, fmt.Errorf("looking up %s in %s: %w", spec.IfName, spec.NetNS, err)
		}
	}
	if cont != nil {
		return nil, nil, false, fmt.Errorf("interface %s already exists in netns %s and is not the peer of %s",
			spec.IfName, spec.NetNS, spec.HostIfName)
	}
	host, cont, err = c.createPair(undo)
	return host, cont, false, err
}

// createPair creates the workload's veth pair, the host end up, and
// returns both ends.
func (c *workloadCall) createPair(undo *[]func() error) (host, cont netlink.Link, err error) {
	spec := c.spec
	attrs := netlink.NewLinkAttrs()
	attrs.Name = spec.HostIfName
	attrs.MTU = spec.EffectiveMTU()
	attrs.HardwareAddr = hostHWAddr
	attrs.Flags = net.FlagUp // one request less; the container end is not configured yet, so nothing flows
	veth := &netlink.Veth{
		LinkAttrs:     attrs,
		PeerName:      spec.IfName,
		PeerNamespace: netlink.NsFd(int(c.contNS)),
		PeerMTU:       uint32(spec.EffectiveMTU()),
		PeerTxQLen:    -1,
	}
	if spec.MAC != "" {
		veth.PeerHardwareAddr, _ = net.ParseMAC(spec.MAC) // validated
	}
	if err := c.node.LinkAdd(veth); err != nil {
		return nil, nil, fmt.Errorf("creating veth %s/%s: %w", spec.HostIfName, spec.IfName, err)
	}
	*undo = append(*undo, c.deleteHostLink)
	if veth.Attrs().Index == 0 {
		return nil, nil, fmt.Errorf("creating veth %s/%s: new host end not found", spec.HostIfName, spec.IfName)
	}
	if cont, err = c.cont.LinkByName(spec.IfName); err != nil {
		return nil, nil, fmt.Errorf("looking up new %s in %s: %w", spec.IfName, spec.NetNS, err)
	}
	return veth, cont, nil
}

// ensureLinkAttrs sets MTU and MAC (if mac is not nil) where they differ.
func ensureLinkAttrs(h *netlink.Handle, l netlink.Link, mtu int, mac net.HardwareAddr) error {
	a := l.Attrs()
	if a.MTU != mtu {
		if err := h.LinkSetMTU(l, mtu); err != nil {
			return fmt.Errorf("setting mtu %d: %w", mtu, err)
		}
	}
	if mac != nil && a.HardwareAddr.String() != mac.String() {
		if err := h.LinkSetHardwareAddr(l, mac); err != nil {
			return fmt.Errorf("setting mac %s: %w", mac, err)
		}
	}
	return nil
}

func ensureUp(h *netlink.Handle, l netlink.Link) error {
	if l.Attrs().Flags&net.FlagUp != 0 {
		return nil
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("setting %s up: %w", l.Attrs().Name, err)
	}
	return nil
}

// ensureHostLink converges the host end. Its IPv4 settings
// (hostIfSysctls) go over netlink, and through /proc/sys where that fails;
// there, on a pair this call created (fresh), without being read first.
// Its IPv6 hardening (hostIfHardening6) goes through /proc/sys, for a
// workload of either family, before the container end is up.
func (c *workloadCall) ensureHostLink(host netlink.Link, fresh bool) error {
	if err := ensureLinkAttrs(c.node, host, c.spec.EffectiveMTU(), hostHWAddr); err != nil {
		return err
	}
	if c.conf == nil || c.conf.setHostIf(host.Attrs().Index) != nil {
		if err := setSysctls(c.nodeNS, hostIfSysctls(c.spec.HostIfName), !fresh); err != nil {
			return err
		}
	}
	if err := hardenIPv6(c.nodeNS, c.spec.HostIfName, !fresh); err != nil {
		return err
	}
	if c.spec.HasIPv6() {
		if err := c.ensureHostIPv6(host, fresh); err != nil {
			return err
		}
	}
	return ensureUp(c.node, host)
}

// ensureHostIPv6 readies the host end for IPv6: its settings, the node's
// forwarding, and the gateway's link-local address set explicitly (the
// kernel derives the same one from the MAC, but not where addr_gen_mode
// says otherwise), without duplicate address detection. It runs before
// the container end is up, so the kernel's own link-local address, made
// when the link gets its carrier, is not tentative either.
func (c *workloadCall) ensureHostIPv6(host netlink.Link, fresh bool) error {
	if err := ensureSysctls(c.nodeNS, nodeSysctls6); err != nil {
		return err
	}
	if err := setSysctls(c.nodeNS, hostIfSysctls6(c.spec.HostIfName), !fresh); err != nil {
		return err
	}
	gw := &netlink.Addr{IPNet: &net.IPNet{IP: GatewayAddr6.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD, Scope: unix.RT_SCOPE_LINK}
	if err := c.node.AddrAdd(host, gw); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("adding the gateway address %s: %w", GatewayAddr6, err)
	}
	return nil
}

// ensureHostRoutes adds the node's /32 route to each address; one for the
// same /32 through another interface is replaced. On a pair that existed
// before, routes through it to addresses the workload no longer has go.
func (c *workloadCall) ensureHostRoutes(host netlink.Link, existed bool, undo *[]func() error) error {
	if existed {
		extra, err := c.extraHostRoutes(host)
		if err != nil {
			return err
		}
		for _, rt := range extra {
			if err := deleteRoute(c.node, rt); err != nil {
				return err
			}
		}
	}
	for _, rt := range HostRoutes(c.spec) {
		created, err := replaceRoute(c.node, rt)
		if err != nil {
			return err
		}
		if created {
			*undo = append(*undo, func() error { return deleteRoute(c.node, rt) })
		}
	}
	return nil
}

// extraHostRoutes returns the proto 80 routes through the host interface
// that the spec does not ask for. The kernel filters the dump by output
// interface (strict checking, Linux 4.20 on), so that a re-setup does not
// read every workload route of the node; where it cannot, the node's proto
// 80 routes are listed and filtered here.
func (c *workloadCall) extraHostRoutes(host netlink.Link) ([]Route, error) {
	routes, err := listRoutesVia(c.node, RouteProtoWorkload, host.Attrs().Index, c.spec.HostIfName)
	if err != nil {
		return nil, err
	}
	want := HostRoutes(c.spec)
	var extra []Route
	for _, rt := range routes {
		if rt.Dev == c.spec.HostIfName && !slices.ContainsFunc(want, func(w Route) bool { return w.Satisfies(rt) }) {
			extra = append(extra, rt)
		}
	}
	return extra, nil
}

// status reports the pair Setup converged, from the links it read or made
// and the attributes it set: no request to the kernel.
func (c *workloadCall) status(host, cont netlink.Link) WorkloadStatus {
	contMAC := cont.Attrs().HardwareAddr.String()
	if c.spec.MAC != "" {
		mac, _ := net.ParseMAC(c.spec.MAC) // validated
		contMAC = mac.String()
	}
	return WorkloadStatus{
		HostIfIndex:      host.Attrs().Index,
		HostMAC:          hostHWAddr.String(),
		ContainerIfIndex: cont.Attrs().Index,
		ContainerMAC:     contMAC,
	}
}

// Teardown implements Workloads: it deletes the container end (if the netns
// still exists), the host routes and the host end. Whatever is already
// gone counts as done; it keeps going after a failure and joins the errors.
func (w *NetlinkWorkloads) Teardown(ctx context.Context, spec WorkloadSpec) error {
	if spec.HostIfName == "" {
		return errors.New("tearing down workload: host interface name is empty")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("tearing down %s: %w", spec.HostIfName, err)
	}
	c, contGone, err := w.open(spec)
	if err != nil {
		return fmt.Errorf("tearing down %s: %w", spec.HostIfName, err)
	}
	defer c.close()
	var errs []error

	if !contGone && spec.IfName != "" {
		cont, err := linkByName(c.cont, spec.IfName)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("looking up %s in %s: %w", spec.IfName, spec.NetNS, err))
		case cont != nil && cont.Type() == "veth":
			if err := c.cont.LinkDel(cont); err != nil && !isNotFound(err) {
				errs = append(errs, fmt.Errorf("deleting %s in %s: %w", spec.IfName, spec.NetNS, err))
			}
		}
	}

	host, err := linkByName(c.node, spec.HostIfName)
	if err != nil {
		errs = append(errs, fmt.Errorf("looking up %s: %w", spec.HostIfName, err))
	}
	if host != nil && !spec.SkipHostRoutes {
		for _, rt := range HostRoutes(spec) {
			if err := deleteRoute(c.node, rt); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if host != nil {
		if err := c.node.LinkDel(host); err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting %s: %w", spec.HostIfName, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tearing down %s: %w", spec.HostIfName, err)
	}
	return nil
}
