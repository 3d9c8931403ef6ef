package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetlinkRoutes implements Routes over netlink in one network namespace.
// It is safe for concurrent use.
type NetlinkRoutes struct {
	mu sync.Mutex // serialises use of h's socket
	h  *netlink.Handle
}

var _ Routes = (*NetlinkRoutes)(nil)

var errClosed = errors.New("dataplane handle is closed")

// NewRoutes returns Routes acting in the network namespace at netnsPath
// ("" = the namespace of the calling thread). The caller must Close it.
func NewRoutes(netnsPath string) (*NetlinkRoutes, error) {
	nsh, err := openNetNS(netnsPath)
	if err != nil {
		return nil, err
	}
	defer nsh.Close()
	return newRoutesAt(nsh)
}

func newRoutesAt(nsh netns.NsHandle) (*NetlinkRoutes, error) {
	h, err := newHandleAt(nsh)
	if err != nil {
		return nil, err
	}
	return &NetlinkRoutes{h: h}, nil
}

// Close releases the netlink socket.
func (r *NetlinkRoutes) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.h != nil {
		r.h.Close()
		r.h = nil
	}
	return nil
}

// List implements Routes. Route types other than unicast and blackhole are
// left out.
func (r *NetlinkRoutes) List(proto int) ([]Route, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.h == nil {
		return nil, errClosed
	}
	return listRoutes(r.h, proto)
}

func listRoutes(h *netlink.Handle, proto int) ([]Route, error) {
	filter := &netlink.Route{Table: unix.RT_TABLE_MAIN, Protocol: netlink.RouteProtocol(proto)}
	nrs, err := retryDump(func() ([]netlink.Route, error) {
		return h.RouteListFiltered(netlink.FAMILY_ALL, filter, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
	})
	if err != nil {
		return nil, fmt.Errorf("listing routes with protocol %d: %w", proto, err)
	}
	names := map[int]string{}
	var out []Route
	for _, nr := range nrs {
		rt, ok, err := fromNetlink(h, nr, names)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, rt)
		}
	}
	slices.SortFunc(out, CompareRoutes)
	return out, nil
}

// listRoutesVia returns the main table's routes with protocol proto whose
// device is the link ifindex (named name), asking the kernel to filter the
// dump (NETLINK_GET_STRICT_CHK) and filtering again here in case it did not.
func listRoutesVia(h *netlink.Handle, proto, ifindex int, name string) ([]Route, error) {
	filter := &netlink.Route{Table: unix.RT_TABLE_MAIN, Protocol: netlink.RouteProtocol(proto), LinkIndex: ifindex}
	mask := uint64(netlink.RT_FILTER_TABLE | netlink.RT_FILTER_PROTOCOL | netlink.RT_FILTER_OIF)
	strict := h.SetStrictCheck(true) == nil
	nrs, err := retryDump(func() ([]netlink.Route, error) { return h.RouteListFiltered(netlink.FAMILY_ALL, filter, mask) })
	if strict {
		if serr := h.SetStrictCheck(false); serr != nil && err == nil {
			err = serr
		}
	}
	if err != nil {
		return nil, fmt.Errorf("listing routes with protocol %d via %s: %w", proto, name, err)
	}
	names := map[int]string{ifindex: name}
	var out []Route
	for _, nr := range nrs {
		rt, ok, err := fromNetlink(h, nr, names)
		if err != nil {
			return nil, err
		}
		if ok && rt.Dev == name {
			out = append(out, rt)
		}
	}
	slices.SortFunc(out, CompareRoutes)
	return out, nil
}

// fromNetlink converts a kernel route; ok is false for route types Route
// cannot express.
func fromNetlink(h *netlink.Handle, nr netlink.Route, names map[int]string) (_ Route, ok bool, _ error) {
	rt := Route{Proto: int(nr.Protocol)}
	switch nr.Type {
	case unix.RTN_UNICAST:
		rt.Type = RouteUnicast
	case unix.RTN_BLACKHOLE:
		rt.Type = RouteBlackhole
	default:
		return Route{}, false, nil
	}
	if nr.Dst == nil {
		rt.Dst = netip.PrefixFrom(unspecified(nr.Family), 0)
	} else if rt.Dst, ok = prefixOf(nr.Dst); !ok {
		return Route{}, false, fmt.Errorf("route with bad destination %v", nr.Dst)
	}
	devIndex := nr.LinkIndex
	rt.Onlink = nr.Flags&unix.RTNH_F_ONLINK != 0
	if gw, ok := addrOf(nr.Gw); ok {
		rt.Gateways = append(rt.Gateways, gw)
	}
	for i, nh := range nr.MultiPath {
		if gw, ok := addrOf(nh.Gw); ok {
			rt.Gateways = append(rt.Gateways, gw)
		}
		rt.Onlink = rt.Onlink || nh.Flags&unix.RTNH_F_ONLINK != 0
		switch {
		case i == 0:
			devIndex = nh.LinkIndex
		case devIndex != nh.LinkIndex:
			devIndex = 0 // next hops on several devices: no single Dev
		}
	}
	if devIndex > 0 {
		name, err := linkName(h, devIndex, names)
		if err != nil {
			return Route{}, false, err
		}
		rt.Dev = name
	}
	return rt.Normalized(), true, nil
}

func linkName(h *netlink.Handle, index int, cache map[int]string) (string, error) {
	if name, ok := cache[index]; ok {
		return name, nil
	}
	l, err := h.LinkByIndex(index)
	if err != nil {
		return "", fmt.Errorf("looking up link %d: %w", index, err)
	}
	cache[index] = l.Attrs().Name
	return l.Attrs().Name, nil
}

// Replace implements Routes. It adds the route, or replaces the route for the
// same destination in the main table if that route is Tabby's; a foreign
// route there is left alone and ErrForeignRoute returned.
func (r *NetlinkRoutes) Replace(rt Route) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.h == nil {
		return errClosed
	}
	_, err := replaceRoute(r.h, rt)
	return err
}

// replaceRoute adds or replaces rt; created says whether no route for the
// destination existed before.
func replaceRoute(h *netlink.Handle, rt Route) (created bool, _ error) {
	rt = rt.Normalized()
	if err := rt.Validate(); err != nil {
		return false, err
	}
	if !OwnedProto(rt.Proto) {
		return false, fmt.Errorf("replacing route %v: %w", rt, ErrForeignRoute)
	}
	nr, err := toNetlink(h, rt)
	if err != nil {
		return false, fmt.Errorf("replacing route %v: %w", rt, err)
	}
	err = h.RouteAdd(nr)
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, unix.EEXIST) {
		return false, fmt.Errorf("adding route %v: %w", rt, err)
	}
	// A route for the destination exists: replace it only if it is ours.
	if err := checkOwned(h, rt.Dst); err != nil {
		return false, fmt.Errorf("replacing route %v: %w", rt, err)
	}
	if err := h.RouteReplace(nr); err != nil {
		return false, fmt.Errorf("replacing route %v: %w", rt, err)
	}
	return false, nil
}

// checkOwned fails with ErrForeignRoute if the route for dst that a replace
// would overwrite (main table, TOS 0, the family's default metric: 0 for
// IPv4, 1024 for IPv6, where the kernel turns a metric of 0 into 1024) is
// not Tabby's.
func checkOwned(h *netlink.Handle, dst netip.Prefix) error {
	filter := &netlink.Route{Table: unix.RT_TABLE_MAIN, Dst: ipNet(dst)}
	nrs, err := retryDump(func() ([]netlink.Route, error) {
		return h.RouteListFiltered(familyOf(dst.Addr()), filter, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_DST)
	})
	if err != nil {
		return fmt.Errorf("listing routes to %v: %w", dst, err)
	}
	metric := 0
	if dst.Addr().Is6() {
		metric = ip6DefaultMetric
	}
	for _, nr := range nrs {
		if nr.Priority == metric && nr.Tos == 0 && !OwnedProto(int(nr.Protocol)) {
			return fmt.Errorf("route to %v has protocol %d: %w", dst, int(nr.Protocol), ErrForeignRoute)
		}
	}
	return nil
}

// ip6DefaultMetric is the metric the kernel gives an IPv6 route added
// without one (IP6_RT_PRIO_USER), Tabby's own included.
const ip6DefaultMetric = 1024

func toNetlink(h *netlink.Handle, rt Route) (*netlink.Route, error) {
	nr := &netlink.Route{
		Dst:      ipNet(rt.Dst),
		Table:    unix.RT_TABLE_MAIN,
		Protocol: netlink.RouteProtocol(rt.Proto),
		Family:   familyOf(rt.Dst.Addr()),
	}
	if rt.Type == RouteBlackhole {
		nr.Type = unix.RTN_BLACKHOLE
		return nr, nil
	}
	nr.Type = unix.RTN_UNICAST
	if rt.Dev != "" {
		l, err := h.LinkByName(rt.Dev)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) {
				return nil, fmt.Errorf("looking up device %s: %w", rt.Dev, ErrNoDevice)
			}
			return nil, fmt.Errorf("looking up device %s: %w", rt.Dev, err)
		}
		nr.LinkIndex = l.Attrs().Index
	}
	switch len(rt.Gateways) {
	case 0:
		nr.Scope = netlink.SCOPE_LINK
	case 1:
		nr.Gw = net.IP(rt.Gateways[0].AsSlice())
		if rt.Onlink {
			nr.Flags |= unix.RTNH_F_ONLINK
		}
	default:
		for _, gw := range rt.Gateways {
			nh := &netlink.NexthopInfo{LinkIndex: nr.LinkIndex, Gw: net.IP(gw.AsSlice())}
			if rt.Onlink {
				nh.Flags |= unix.RTNH_F_ONLINK
			}
			nr.MultiPath = append(nr.MultiPath, nh)
		}
		nr.LinkIndex = 0
	}
	return nr, nil
}

// Delete implements Routes. Only a route with rt's destination, protocol and
// type (and device, if rt names one) is deleted; a missing one is success.
func (r *NetlinkRoutes) Delete(rt Route) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.h == nil {
		return errClosed
	}
	return deleteRoute(r.h, rt)
}

func deleteRoute(h *netlink.Handle, rt Route) error {
	rt = rt.Normalized()
	if !OwnedProto(rt.Proto) {
		return fmt.Errorf("deleting route %v: %w", rt, ErrForeignRoute)
	}
	if !rt.Dst.IsValid() {
		return fmt.Errorf("deleting route %v: no destination", rt)
	}
	nr := &netlink.Route{
		Dst:      ipNet(rt.Dst),
		Table:    unix.RT_TABLE_MAIN,
		Protocol: netlink.RouteProtocol(rt.Proto),
		Family:   familyOf(rt.Dst.Addr()),
		Scope:    netlink.SCOPE_NOWHERE, // any scope
		Type:     unix.RTN_UNICAST,
	}
	if rt.Type == RouteBlackhole {
		nr.Type = unix.RTN_BLACKHOLE
	}
	if rt.Dev != "" && len(rt.Gateways) < 2 {
		l, err := h.LinkByName(rt.Dev)
		if errors.As(err, new(netlink.LinkNotFoundError)) {
			return nil // the device is gone, and its routes with it
		}
		if err != nil {
			return fmt.Errorf("deleting route %v: looking up device: %w", rt, err)
		}
		nr.LinkIndex = l.Attrs().Index
	}
	if len(rt.Gateways) == 1 {
		nr.Gw = net.IP(rt.Gateways[0].AsSlice())
	}
	err := h.RouteDel(nr)
	if err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("deleting route %v: %w", rt, err)
	}
	return nil
}

// NodeRoutes implements Routes, for both families.
func (r *NetlinkRoutes) NodeRoutes() ([]netip.Prefix, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.h == nil {
		return nil, errClosed
	}
	nrs, err := retryDump(func() ([]netlink.Route, error) {
		return r.h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return nil, fmt.Errorf("listing the node's routes: %w", err)
	}
	var out []netip.Prefix
	for _, nr := range nrs {
		if OwnedProto(int(nr.Protocol)) {
			continue
		}
		dst := netip.PrefixFrom(unspecified(nr.Family), 0)
		if nr.Dst != nil {
			p, ok := prefixOf(nr.Dst)
			if !ok {
				continue
			}
			dst = p.Masked()
		}
		out = append(out, dst)
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return slices.Compact(out), nil
}

// familyOf is the netlink family of a.
func familyOf(a netip.Addr) int {
	if a.Is6() {
		return netlink.FAMILY_V6
	}
	return netlink.FAMILY_V4
}

// unspecified is the all-zeros address of a netlink family.
func unspecified(family int) netip.Addr {
	if family == netlink.FAMILY_V6 {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}
