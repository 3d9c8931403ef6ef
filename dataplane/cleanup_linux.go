package dataplane

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tabbynet/tabby/api"
)

// This file removes what Tabby installed in a node's network namespace, for
// `tabby-agent cleanup` (RemoveFirewalls, in firewall_linux.go, removes the
// firewall state of both backends). Every function is idempotent: what is already gone
// is success, and each keeps going after a failure and returns every error.

// RemoveRoutes deletes every main-table route, IPv4 and IPv6, whose
// protocol is Tabby's (RouteProtoWorkload, RouteProtoBGP) in the node's
// network namespace, and returns them as `ip route` would show them.
func RemoveRoutes(nodeNetNSPath string) (removed []string, err error) {
	h, closeH, err := handleIn(nodeNetNSPath)
	if err != nil {
		return nil, err
	}
	defer closeH()
	var errs []error
	for _, proto := range []int{RouteProtoWorkload, RouteProtoBGP} {
		filter := &netlink.Route{Table: unix.RT_TABLE_MAIN, Protocol: netlink.RouteProtocol(proto)}
		nrs, err := retryDump(func() ([]netlink.Route, error) {
			return h.RouteListFiltered(netlink.FAMILY_ALL, filter, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("listing proto %d routes: %w", proto, err))
			continue
		}
		for _, nr := range nrs {
			text := routeText(nr)
			if err := h.RouteDel(&nr); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("deleting route %s: %w", text, err))
				continue
			}
			removed = append(removed, text)
		}
	}
	return removed, errors.Join(errs...)
}

// handleIn returns a netlink handle in the network namespace at path ("" =
// the caller's) and the function that closes it.
func handleIn(path string) (*netlink.Handle, func(), error) {
	nsh, err := openNetNS(path)
	if err != nil {
		return nil, nil, err
	}
	h, err := newHandleAt(nsh)
	if err != nil {
		nsh.Close()
		return nil, nil, err
	}
	return h, func() { h.Close(); nsh.Close() }, nil
}

// routeText renders a netlink route for a report.
func routeText(nr netlink.Route) string {
	dst := "default"
	if nr.Dst != nil {
		dst = nr.Dst.String()
	}
	s := dst
	if nr.Type == unix.RTN_BLACKHOLE {
		s = "blackhole " + dst
	}
	if nr.Gw != nil {
		s += " via " + nr.Gw.String()
	}
	for _, nh := range nr.MultiPath {
		s += " nexthop via " + net.IP(nh.Gw).String()
	}
	return fmt.Sprintf("%s proto %d", s, nr.Protocol)
}

// RemoveWorkloadLinks deletes every veth named cali… in the node's network
// namespace (their pod ends and routes go with them) and returns their
// names. The pods lose their network: call it only when no pod on the
// node should keep Tabby's.
func RemoveWorkloadLinks(nodeNetNSPath string) (removed []string, err error) {
	h, closeH, err := handleIn(nodeNetNSPath)
	if err != nil {
		return nil, err
	}
	defer closeH()
	links, err := retryDump(h.LinkList)
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	var errs []error
	for _, l := range links {
		name := l.Attrs().Name
		if !strings.HasPrefix(name, api.WorkloadIfacePrefix) || l.Type() != "veth" {
			continue
		}
		if err := h.LinkDel(l); err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting link %s: %w", name, err))
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}

// ResetNodeSysctls turns off what EnsureNodeSysctls turned on
// (net.ipv4.ip_forward=0) in the node's network namespace. Tabby does not
// record the value it found, so this is for nodes known to have had
// forwarding off; a Kubernetes node normally needs it on whatever its
// network. Per-interface settings of workload links go with the links.
func ResetNodeSysctls(nodeNetNSPath string) error {
	nsh, err := openNetNS(nodeNetNSPath)
	if err != nil {
		return err
	}
	defer nsh.Close()
	off := make([]sysctl, len(nodeSysctls))
	for i, s := range nodeSysctls {
		off[i] = sysctl{Path: s.Path, Value: "0"}
	}
	return ensureSysctls(nsh, off)
}
