package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
)

// Check implements Workloads: it compares the links, addresses, routes and
// sysctls of the workload with spec and returns errors.Join of every
// difference, or nil.
func (w *NetlinkWorkloads) Check(ctx context.Context, spec WorkloadSpec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("checking %s: %w", spec.HostIfName, err)
	}
	c, contGone, err := w.open(spec)
	if err != nil {
		return fmt.Errorf("checking %s: %w", spec.HostIfName, err)
	}
	defer c.close()

	var errs []error
	host := c.checkHost(&errs)
	if contGone {
		errs = append(errs, fmt.Errorf("netns %s does not exist", spec.NetNS))
	} else {
		c.checkContainer(host, &errs)
	}
	if host != nil {
		c.checkHostRoutes(&errs)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("checking %s: %w", spec.HostIfName, err)
	}
	return nil
}

// checkLink reports how l differs in type, MTU, MAC (if mac is set) and state.
func checkLink(l netlink.Link, where string, mtu int, mac net.HardwareAddr, errs *[]error) {
	a := l.Attrs()
	if l.Type() != "veth" {
		*errs = append(*errs, fmt.Errorf("%s is a %s, want veth", where, l.Type()))
	}
	if a.MTU != mtu {
		*errs = append(*errs, fmt.Errorf("%s has mtu %d, want %d", where, a.MTU, mtu))
	}
	if mac != nil && a.HardwareAddr.String() != mac.String() {
		*errs = append(*errs, fmt.Errorf("%s has mac %s, want %s", where, a.HardwareAddr, mac))
	}
	if a.Flags&net.FlagUp == 0 {
		*errs = append(*errs, fmt.Errorf("%s is down", where))
	}
}

func (c *workloadCall) checkHost(errs *[]error) netlink.Link {
	spec := c.spec
	host, err := linkByName(c.node, spec.HostIfName)
	switch {
	case err != nil:
		*errs = append(*errs, fmt.Errorf("looking up %s: %w", spec.HostIfName, err))
		return nil
	case host == nil:
		*errs = append(*errs, fmt.Errorf("host interface %s does not exist", spec.HostIfName))
		return nil
	}
	checkLink(host, "host interface "+spec.HostIfName, spec.EffectiveMTU(), hostHWAddr, errs)
	if err := checkSysctls(c.nodeNS, hostIfSysctls(spec.HostIfName)); err != nil {
		*errs = append(*errs, err)
	}
	if err := checkHardening6(c.nodeNS, spec.HostIfName); err != nil {
		*errs = append(*errs, err)
	}
	return host
}

func (c *workloadCall) checkContainer(host netlink.Link, errs *[]error) {
	spec := c.spec
	where := fmt.Sprintf("interface %s in %s", spec.IfName, spec.NetNS)
	cont, err := linkByName(c.cont, spec.IfName)
	switch {
	case err != nil:
		*errs = append(*errs, fmt.Errorf("looking up %s: %w", where, err))
		return
	case cont == nil:
		*errs = append(*errs, fmt.Errorf("%s does not exist", where))
		return
	}
	var mac net.HardwareAddr
	if spec.MAC != "" {
		mac, _ = net.ParseMAC(spec.MAC) // validated
	}
	checkLink(cont, where, spec.EffectiveMTU(), mac, errs)
	if host != nil && !c.isPair(host, cont) {
		*errs = append(*errs, fmt.Errorf("%s is not the peer of %s", where, spec.HostIfName))
	}

	have, err := retryDump(func() ([]netlink.Addr, error) { return c.cont.AddrList(cont, netlink.FAMILY_ALL) })
	if err != nil {
		*errs = append(*errs, fmt.Errorf("listing addresses of %s: %w", where, err))
	} else {
		var got []netip.Prefix
		for _, a := range have {
			if a.IP.IsLinkLocalUnicast() {
				continue // the kernel's own IPv6 link-local address
			}
			if p, ok := prefixOf(a.IPNet); ok {
				got = append(got, p)
			}
		}
		want := slices.Clone(spec.Addrs)
		slices.SortFunc(got, netip.Prefix.Compare)
		slices.SortFunc(want, netip.Prefix.Compare)
		if !slices.Equal(got, want) {
			*errs = append(*errs, fmt.Errorf("%s has addresses %v, want %v", where, got, want))
		}
	}

	lo, err := c.cont.LinkByName("lo")
	if err != nil {
		*errs = append(*errs, fmt.Errorf("looking up lo in %s: %w", spec.NetNS, err))
	} else if lo.Attrs().Flags&net.FlagUp == 0 {
		*errs = append(*errs, fmt.Errorf("lo in %s is down", spec.NetNS))
	}

	missing, err := c.missingContainerRoutes(cont)
	if err != nil {
		*errs = append(*errs, fmt.Errorf("%s: %w", where, err))
	}
	for _, r := range missing {
		dst := r.Dst.String()
		if r.Gw != nil {
			dst = "default via " + r.Gw.String()
		}
		*errs = append(*errs, fmt.Errorf("route %s dev %s missing in %s", dst, spec.IfName, spec.NetNS))
	}
}

func (c *workloadCall) checkHostRoutes(errs *[]error) {
	routes, err := listRoutes(c.node, RouteProtoWorkload)
	if err != nil {
		*errs = append(*errs, err)
		return
	}
	want := HostRoutes(c.spec)
	for _, w := range want {
		if !slices.ContainsFunc(routes, w.Satisfies) {
			*errs = append(*errs, fmt.Errorf("host route %v missing", w))
		}
	}
	for _, rt := range routes {
		if rt.Dev == c.spec.HostIfName && !slices.ContainsFunc(want, func(w Route) bool { return w.Satisfies(rt) }) {
			*errs = append(*errs, fmt.Errorf("unexpected host route %v", rt))
		}
	}
}
