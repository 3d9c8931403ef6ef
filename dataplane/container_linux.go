package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The container side of a workload: its interface, addresses and routes.

// ensureContainerLink converges the container end. On a pair this call
// created (fresh) there is nothing to list: the new link has no IPv4
// address and no route of its own yet.
func (c *workloadCall) ensureContainerLink(cont netlink.Link, fresh bool) error {
	spec := c.spec
	var mac net.HardwareAddr
	if spec.MAC != "" {
		mac, _ = net.ParseMAC(spec.MAC) // validated
	}
	if err := ensureLinkAttrs(c.cont, cont, spec.EffectiveMTU(), mac); err != nil {
		return err
	}
	if err := c.ensureAddrs(cont, fresh); err != nil {
		return err
	}
	if err := ensureUp(c.cont, cont); err != nil {
		return err
	}
	if err := c.ensureLoUp(); err != nil {
		return err
	}
	// The routes need the link up (it is now) and only its index.
	return c.ensureContainerRoutes(cont, fresh)
}

// ensureLoUp sets the container's loopback interface up.
func (c *workloadCall) ensureLoUp() error {
	lo, err := c.cont.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("looking up lo: %w", err)
	}
	return ensureUp(c.cont, lo)
}

// ensureAddrs makes the IPv4 and global IPv6 addresses of cont exactly
// spec.Addrs (the kernel's own link-local address stays). IPv6 addresses
// skip duplicate address detection: IPAM made them unique, and a tentative
// address would hold the pod's first packets for a second.
func (c *workloadCall) ensureAddrs(cont netlink.Link, fresh bool) error {
	var have []netlink.Addr
	if !fresh {
		var err error
		if have, err = retryDump(func() ([]netlink.Addr, error) { return c.cont.AddrList(cont, netlink.FAMILY_ALL) }); err != nil {
			return fmt.Errorf("listing addresses: %w", err)
		}
		have = slices.DeleteFunc(have, func(a netlink.Addr) bool { return a.IP.IsLinkLocalUnicast() })
	}
	haveSet := map[netip.Prefix]bool{}
	for _, a := range have {
		p, ok := prefixOf(a.IPNet)
		if ok && !slices.Contains(c.spec.Addrs, p) {
			if err := c.cont.AddrDel(cont, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
				return fmt.Errorf("removing address %v: %w", p, err)
			}
			continue
		}
		haveSet[p] = true
	}
	for _, p := range c.spec.Addrs {
		if haveSet[p.Masked()] {
			continue
		}
		a := &netlink.Addr{IPNet: ipNet(p)}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := c.cont.AddrAdd(cont, a); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("adding address %v: %w", p, err)
		}
	}
	return nil
}

// containerRoutes are the routes inside the workload. IPv4: the gateway
// on the link, then the default route through it. IPv6: the default route
// through the host side's link-local address.
func containerRoutes(index int, spec WorkloadSpec) []*netlink.Route {
	var out []*netlink.Route
	if spec.HasIPv4() {
		gw := net.IP(GatewayAddr.AsSlice())
		out = append(out,
			&netlink.Route{LinkIndex: index, Dst: &net.IPNet{IP: gw, Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_LINK, Table: unix.RT_TABLE_MAIN, Family: netlink.FAMILY_V4},
			&netlink.Route{LinkIndex: index, Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Gw: gw, Table: unix.RT_TABLE_MAIN, Family: netlink.FAMILY_V4})
	}
	if spec.HasIPv6() {
		// The kernel gives IPv6 routes metric 1024 when none is set.
		out = append(out, &netlink.Route{LinkIndex: index, Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)},
			Gw: net.IP(GatewayAddr6.AsSlice()), Table: unix.RT_TABLE_MAIN, Family: netlink.FAMILY_V6, Priority: 1024})
	}
	return out
}

// missingContainerRoutes returns the container routes that cont lacks.
func (c *workloadCall) missingContainerRoutes(cont netlink.Link) ([]*netlink.Route, error) {
	filter := &netlink.Route{LinkIndex: cont.Attrs().Index, Table: unix.RT_TABLE_MAIN}
	have, err := retryDump(func() ([]netlink.Route, error) {
		return c.cont.RouteListFiltered(netlink.FAMILY_ALL, filter, netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return nil, fmt.Errorf("listing routes: %w", err)
	}
	var missing []*netlink.Route
	for _, want := range containerRoutes(cont.Attrs().Index, c.spec) {
		found := slices.ContainsFunc(have, func(r netlink.Route) bool {
			dst := r.Dst
			if dst == nil {
				dst = ipNet(netip.PrefixFrom(unspecified(r.Family), 0))
			}
			return r.Type == unix.RTN_UNICAST && dst.String() == want.Dst.String() &&
				r.Gw.Equal(want.Gw) && r.Scope == want.Scope && r.Priority == want.Priority
		})
		if !found {
			missing = append(missing, want)
		}
	}
	return missing, nil
}

func (c *workloadCall) ensureContainerRoutes(cont netlink.Link, fresh bool) error {
	missing := containerRoutes(cont.Attrs().Index, c.spec)
	if !fresh {
		var err error
		if missing, err = c.missingContainerRoutes(cont); err != nil {
			return err
		}
	}
	for _, r := range missing {
		if err := c.cont.RouteReplace(r); err != nil {
			return fmt.Errorf("adding route %v: %w", r, err)
		}
	}
	return nil
}
