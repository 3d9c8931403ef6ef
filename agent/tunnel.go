package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tabbynet/tabby/agent/routetable"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/policy"
	"github.com/tabbynet/tabby/syncer"
)

// tunnelOwner keeps this node's VXLAN tunnels (docs/vxlan.md), one per
// family in which an enabled pool encapsulates: the tunnel address from
// the pool through IPAM (handle ipam.TunnelHandle), the device, the
// device's MAC and address on the Node record, the static neighbour and
// forwarding entries of every other node's tunnel and the route table's
// Tunnel class. All of it comes from the cluster view; no BGP is needed.
// In a family no pool encapsulates any more, the device goes, the address
// is released and the Node's fields are cleared.
type tunnelOwner struct {
	node string
	// underlay are the node's IPv4 and IPv6 underlay addresses (invalid:
	// none in that family).
	underlay [2]netip.Prefix
	view     *syncer.Syncer
	store    *datastore.Store
	ipam     *ipam.Allocator
	vxlan    dataplane.VXLAN
	table    *routetable.Table
	log      *slog.Logger
	sub      *syncer.Signal
	kick     chan struct{}

	// drain is tunnelDrain (tests shorten it).
	drain time.Duration

	mu     sync.Mutex
	states [2]api.TunnelStatus
	// drainUntil is when a family's tunnel being torn down may go;
	// cleaned, that it went (and its address was released) since it was
	// last wanted or since the start.
	drainUntil [2]time.Time
	cleaned    [2]bool
}

func newTunnelOwner(node string, v4, v6 netip.Prefix, view *syncer.Syncer, store *datastore.Store, al *ipam.Allocator,
	vx dataplane.VXLAN, table *routetable.Table, log *slog.Logger) *tunnelOwner {
	o := &tunnelOwner{drain: tunnelDrain, node: node, underlay: [2]netip.Prefix{v4, v6}, view: view, store: store, ipam: al, vxlan: vx, table: table, log: log, kick: make(chan struct{}, 1)}
	// Remote blocks and claims (routes), nodes (tunnel ends, addresses,
	// labels), pools (modes) and the VNI and port.
	o.sub = view.Notify("tunnel",
		syncer.On[api.IPPool](nil), syncer.On[api.Node](nil), syncer.On[api.BGPConfiguration](nil),
		syncer.On[ipam.BlockSummary](nil), syncer.On[ipam.Affinity](nil))
	return o
}

func (o *tunnelOwner) loop(every time.Duration, m *metrics) loop {
	return loop{name: "tunnel", every: every, wake: [2]<-chan struct{}{o.sub.C(), o.kick}, pass: o.pass, observe: m.observeReconcile, log: o.log}
}

// pass reconciles both families and hands the Tunnel class to the table.
// A family that fails (a VNI clash, IPAM exhausted) gets no tunnel routes:
// its traffic keeps the native path, and the error is reported.
func (o *tunnelOwner) pass(ctx context.Context) error {
	self, _ := o.view.Node(o.node)
	var labels map[string]string
	if self != nil {
		labels = self.Metadata.Labels
	}
	vni, port := o.view.BGPConfiguration().VXLANSettings()
	in := tunnelInputs{node: o.node, labels: labels, pools: o.view.Pools(), borrowed: map[string][]ipam.BorrowedAddr{}}
	// The cluster's nodes, blocks and borrowed addresses matter only to a
	// node that tunnels: without a pool that encapsulates for it, a pass
	// (woken by every block claim and node in the cluster) reads none of
	// them, instead of O(nodes + blocks) per claim on every agent.
	if slices.ContainsFunc(in.pools, func(p *api.IPPool) bool { return tunnels(p, labels) }) {
		in.nodes, in.blocks = o.view.Nodes(), o.view.Blocks()
		for _, n := range in.nodes {
			if n.Metadata.Name != o.node {
				in.borrowed[n.Metadata.Name] = o.view.BorrowedBy(n.Metadata.Name)
			}
		}
	}
	var routes []dataplane.Route
	var errs []error
	for i, is6 := range []bool{false, true} {
		in.underlay, in.ready = o.underlay[i], false
		st, rts, err := o.family(ctx, in, self, is6, vni, port)
		if err != nil {
			st.Error = err.Error()
			errs = append(errs, err)
		}
		o.mu.Lock()
		o.states[i] = st
		o.mu.Unlock()
		routes = append(routes, rts...)
	}
	errs = append(errs, o.table.SetClass(routetable.Tunnel, routes), o.table.Apply(routetable.Tunnel))
	return errors.Join(errs...)
}

// family reconciles one family's tunnel and returns its routes.
func (o *tunnelOwner) family(ctx context.Context, in tunnelInputs, self *api.Node, is6 bool, vni uint32, port uint16) (api.TunnelStatus, []dataplane.Route, error) {
	dev := dataplane.VXLANDeviceName(is6)
	st := api.TunnelStatus{Device: dev, Mode: "off"}
	plan := desiredTunnel(in, is6)
	if !plan.wanted {
		return st, nil, o.teardown(ctx, self, boolIndex(is6))
	}
	o.mu.Lock()
	o.cleaned[boolIndex(is6)], o.drainUntil[boolIndex(is6)] = false, time.Time{}
	o.mu.Unlock()
	st.Mode, st.Pools = o.modes(in.pools, plan.pools), plan.pools
	addr, fresh, err := o.tunnelAddr(ctx, self, is6, plan.pools)
	if err != nil {
		return st, nil, err
	}
	spec := dataplane.VXLANSpec{Name: dev, VNI: vni, Port: port, Local: in.underlay.Addr(), MAC: dataplane.TunnelMAC(o.node, is6), Addr: addr}
	dst, err := o.vxlan.Ensure(spec)
	if err != nil {
		err = fmt.Errorf("%s tunnel: %w", familyLabel(is6), err)
		if fresh { // nothing half-made: the address goes back too
			err = errors.Join(err, o.release(ctx, addr))
		}
		// Peers must not tunnel to a device that is not as they think
		// (a VNI changed to one another device holds): withdrawn from the
		// Node, this node's traffic takes the native path, if any. The
		// address stays held for the next attempt.
		if self != nil {
			if a, m := tunnelFields(self, is6); a != "" || m != "" {
				err = errors.Join(err, o.record(ctx, self, is6, netip.Addr{}, ""))
			}
		}
		return st, nil, err
	}
	st.Addr, st.MAC, st.MTU, st.VNI, st.Port = addr, dst.MAC.String(), dst.MTU, dst.VNI, dst.Port
	if dst.Created {
		// The kernel took the routes of a device made again (a VNI or
		// port change) with it: the table must read what is left.
		o.table.Resync()
		o.log.Info("vxlan device ready", "device", dev, "vni", vni, "port", port, "addr", addr, "mac", dst.MAC.String(), "mtu", dst.MTU)
	}
	if err := o.record(ctx, self, is6, addr, dst.MAC.String()); err != nil {
		return st, nil, err
	}
	in.ready = true
	plan = desiredTunnel(in, is6)
	st.Peers, st.Routes, st.Native, st.Direct = len(plan.peers), len(plan.routes), plan.native, plan.direct
	for _, r := range plan.routes[:min(len(plan.routes), maxStatusPaths)] {
		st.Paths = append(st.Paths, api.TunnelPath{Dst: r.Dst, Via: r.Gateways[0], Node: plan.owners[r.Dst]})
	}
	if err := o.vxlan.SetPeers(dev, plan.peers); err != nil {
		// Routes through peers not programmed would be black holes: keep
		// only those via a peer the device has.
		return st, routesViaPeers(o.vxlan, dev, plan.routes), fmt.Errorf("%s tunnel peers: %w", familyLabel(is6), err)
	}
	return st, plan.routes, nil
}

// routesViaPeers are the routes whose gateway is a peer the device has
// programmed as wanted (none when they cannot be read).
func routesViaPeers(vx dataplane.VXLAN, dev string, routes []dataplane.Route) []dataplane.Route {
	have, err := vx.Peers(dev)
	if err != nil {
		return nil
	}
	ok := map[netip.Addr]bool{}
	for _, p := range have {
		ok[p.TunnelAddr] = true
	}
	var out []dataplane.Route
	for _, r := range routes {
		if len(r.Gateways) == 1 && ok[r.Gateways[0]] {
			out = append(out, r)
		}
	}
	return out
}

// modes names the modes of the encapsulating pools, e.g. "Always" or
// "Always,CrossSubnet".
func (o *tunnelOwner) modes(pools []*api.IPPool, names []string) string {
	var ms []string
	for _, p := range pools {
		if slices.Contains(names, p.Metadata.Name) && !slices.Contains(ms, string(p.Spec.VXLANMode)) {
			ms = append(ms, string(p.Spec.VXLANMode))
		}
	}
	slices.Sort(ms)
	return strings.Join(ms, ",")
}

// tunnelAddr returns the family's tunnel address: the one the Node records
// if the handle still holds it, else one assigned now (IPAM returns the
// handle's address of the family when it already has one).
func (o *tunnelOwner) tunnelAddr(ctx context.Context, self *api.Node, is6 bool, pools []string) (_ netip.Addr, fresh bool, _ error) {
	if self != nil {
		if a, _, ok := self.VXLANTunnel(is6); ok {
			return a, false, nil
		}
	}
	fam := 4
	if is6 {
		fam = 6
	}
	cctx, cancel := context.WithTimeout(ctx, storeCallTimeout)
	defer cancel()
	as, err := o.ipam.Assign(cctx, ipam.AssignRequest{Node: o.node, Handle: ipam.TunnelHandle(o.node), Family: fam, Pools: pools, Use: api.UseTunnel, Attrs: ipam.Attributes{Node: o.node}})
	if err != nil {
		return netip.Addr{}, false, fmt.Errorf("%s tunnel address from %v: %w", familyLabel(is6), pools, err)
	}
	if !as.Existing {
		o.log.Info("assigned a tunnel address", "addr", as.Addr, "pool", as.Pool, "handle", ipam.TunnelHandle(o.node))
	}
	return as.Addr, !as.Existing, nil
}

// release frees a tunnel address of this node's handle.
func (o *tunnelOwner) release(ctx context.Context, a netip.Addr) error {
	cctx, cancel := context.WithTimeout(ctx, storeCallTimeout)
	defer cancel()
	if err := o.ipam.ReleaseAddrHeldBy(cctx, a, ipam.TunnelHandle(o.node)); err != nil {
		return fmt.Errorf("releasing tunnel address %v: %w", a, err)
	}
	return nil
}

// maxStatusPaths bounds the tunnelled paths the status lists (Routes
// counts them all), so that a large cluster's status record stays small.
const maxStatusPaths = 64

// tunnelDrain is how long a tunnel no pool wants any more stays after its
// Node fields are cleared, so that peers, which see the change a moment
// later, move their traffic to the native path before the device goes.
const tunnelDrain = 2 * time.Second

// teardown removes a family's tunnel no pool wants any more, in two
// steps: first the Node's fields are cleared (peers drop their routes and
// entries; this pass withdraws this node's own tunnel routes), then, once
// tunnelDrain has passed, the device goes and the handle's address of the
// family is released. After a restart the second step runs once, so that
// a device or address an earlier run left is cleaned up too.
func (o *tunnelOwner) teardown(ctx context.Context, self *api.Node, i int) error {
	is6 := i == 1
	if self != nil {
		if addr, mac := tunnelFields(self, is6); addr != "" || mac != "" {
			if err := o.record(ctx, self, is6, netip.Addr{}, ""); err != nil {
				return err
			}
			o.mu.Lock()
			o.drainUntil[i], o.cleaned[i] = time.Now().Add(o.drain), false
			o.mu.Unlock()
			time.AfterFunc(o.drain, func() { kick(o.kick) })
			return nil
		}
	}
	o.mu.Lock()
	wait, cleaned := time.Until(o.drainUntil[i]), o.cleaned[i]
	o.mu.Unlock()
	if cleaned || wait > 0 {
		return nil
	}
	var errs []error
	if err := o.vxlan.Remove(dataplane.VXLANDeviceName(is6)); err != nil {
		errs = append(errs, err)
	}
	cctx, cancel := context.WithTimeout(ctx, storeCallTimeout)
	held, err := o.ipam.AddressesByHandle(cctx, ipam.TunnelHandle(o.node))
	cancel()
	if err != nil {
		errs = append(errs, fmt.Errorf("reading the tunnel handle: %w", err))
	}
	for _, a := range held {
		if a.Is6() != is6 {
			continue
		}
		if err := o.release(ctx, a); err != nil {
			errs = append(errs, err)
		} else {
			o.log.Info("released the tunnel address; no pool encapsulates", "addr", a)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	o.mu.Lock()
	o.cleaned[i] = true
	o.mu.Unlock()
	return nil
}

// tunnelFields are the node's recorded tunnel address and MAC of a family.
func tunnelFields(n *api.Node, is6 bool) (addr, mac string) {
	if is6 {
		return n.Spec.IPv6VXLANTunnelAddr, n.Spec.VXLANTunnelMACAddrV6
	}
	return n.Spec.IPv4VXLANTunnelAddr, n.Spec.VXLANTunnelMACAddr
}

// record writes the family's tunnel address and MAC on this node's Node
// (compare-and-swap, retried on conflict) unless the view shows them.
func (o *tunnelOwner) record(ctx context.Context, self *api.Node, is6 bool, addr netip.Addr, mac string) error {
	want := ""
	if addr.IsValid() {
		want = addr.String()
	}
	fields := func(n *api.Node) (*string, *string) {
		if is6 {
			return &n.Spec.IPv6VXLANTunnelAddr, &n.Spec.VXLANTunnelMACAddrV6
		}
		return &n.Spec.IPv4VXLANTunnelAddr, &n.Spec.VXLANTunnelMACAddr
	}
	if self != nil {
		if a, m := fields(self); *a == want && *m == mac {
			return nil
		}
	}
	for range 10 {
		cctx, cancel := context.WithTimeout(ctx, storeCallTimeout)
		n, err := datastore.GetAs[*api.Node](cctx, o.store, api.KindNode, "", o.node)
		if err != nil {
			cancel()
			return fmt.Errorf("reading node %s to record its tunnel: %w", o.node, err)
		}
		a, m := fields(n)
		if *a == want && *m == mac {
			cancel()
			return nil
		}
		*a, *m = want, mac
		_, err = datastore.UpdateAs(cctx, o.store, n)
		cancel()
		if errors.Is(err, datastore.ErrConflict) {
			continue
		}
		if err != nil {
			return fmt.Errorf("recording the %s tunnel on node %s: %w", familyLabel(is6), o.node, err)
		}
		return nil
	}
	return fmt.Errorf("recording the %s tunnel on node %s: too many concurrent updates", familyLabel(is6), o.node)
}

// status returns both families' tunnel states (IPv4 first).
func (o *tunnelOwner) status() []api.TunnelStatus {
	o.mu.Lock()
	defer o.mu.Unlock()
	return []api.TunnelStatus{o.states[0], o.states[1]}
}

func familyLabel(is6 bool) string {
	if is6 {
		return "IPv6"
	}
	return "IPv4"
}

// tunnelGuard is the policy input that drops VXLAN packets from anything
// but a cluster node's underlay address, nil while no pool encapsulates
// (then the port is none of Tabby's business).
func tunnelGuard(view *syncer.Syncer) *policy.TunnelGuard {
	pools := view.Pools()
	if !slices.ContainsFunc(pools, func(p *api.IPPool) bool { return p.Spec.VXLANMode.Encapsulated() }) {
		return nil
	}
	_, port := view.BGPConfiguration().VXLANSettings()
	g := &policy.TunnelGuard{Port: port}
	for _, n := range view.Nodes() {
		for _, is6 := range []bool{false, true} {
			if p, ok := nodeUnderlay(n, is6); ok {
				g.Nodes = append(g.Nodes, p.Addr())
			}
		}
	}
	return g
}

// tunnelGuardChanged takes the node updates that change the tunnel
// guard's sets: a node's underlay addresses.
func tunnelGuardChanged(u syncer.Update[api.Node]) bool {
	if u.Old == nil || u.New == nil {
		return true
	}
	for _, is6 := range []bool{false, true} {
		a, _ := nodeUnderlay(u.Old, is6)
		b, _ := nodeUnderlay(u.New, is6)
		if a != b {
			return true
		}
	}
	return false
}

// podMTU is the MTU pods get when their network config sets none: while
// an enabled pool encapsulates for this node in a family, the tunnel
// device's MTU (the underlay's minus 50, or 70 over IPv6; the dataplane's
// default minus that before the device exists), the smaller of the two
// families'; else 0 (the dataplane's default). A pod in a pool that does
// not encapsulate gets it too: its traffic may still meet the tunnel's
// (borrowed addresses, a pool switched later), and the difference costs
// little.
func (o *tunnelOwner) podMTU() int {
	self, _ := o.view.Node(o.node)
	var labels map[string]string
	if self != nil {
		labels = self.Metadata.Labels
	}
	pools := o.view.Pools()
	mtu := 0
	for i, is6 := range []bool{false, true} {
		if !o.underlay[i].IsValid() || !slices.ContainsFunc(pools, func(p *api.IPPool) bool {
			pr, err := p.Prefix()
			return err == nil && pr.Addr().Is6() == is6 && p.Spec.VXLANMode.Encapsulated() && !p.Spec.Disabled && poolSelects(p, labels)
		}) {
			continue
		}
		o.mu.Lock()
		m := o.states[i].MTU
		o.mu.Unlock()
		if m == 0 {
			m = dataplane.DefaultMTU - dataplane.VXLANOverhead(is6)
		}
		if mtu == 0 || m < mtu {
			mtu = m
		}
	}
	return mtu
}

func boolIndex(is6 bool) int {
	if is6 {
		return 1
	}
	return 0
}
