package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// RouteType is the kernel route type of a Route.
type RouteType int

// Route types Tabby programs.
const (
	RouteUnicast RouteType = iota
	RouteBlackhole
)

func (t RouteType) String() string {
	switch t {
	case RouteUnicast:
		return "unicast"
	case RouteBlackhole:
		return "blackhole"
	}
	return fmt.Sprintf("RouteType(%d)", int(t))
}

// Route is one IPv4 or IPv6 route in the main table.
//
// A unicast route has a Dev, Gateways, or both. With several Gateways it is an
// ECMP (multipath) route, one next hop per gateway. With Gateways and no Dev
// the kernel resolves the device of each next hop. A blackhole route has
// neither.
type Route struct {
	Dst      netip.Prefix
	Type     RouteType
	Dev      string
	Gateways []netip.Addr
	Proto    int
	// Onlink makes the kernel take the gateways as reachable on Dev
	// without a route to them (a tunnel route "via <remote tunnel
	// address> dev vxlan.tabby onlink"); it needs a Dev and Gateways.
	Onlink bool
}

// Routes reads and writes routes in the main table. Implementations never
// change a route whose protocol number is not Tabby's (see ErrForeignRoute).
type Routes interface {
	// List returns the main-table routes of both families with protocol
	// proto, sorted by Dst, each with its Gateways sorted.
	List(proto int) ([]Route, error)
	// Replace adds the route or replaces the route with the same Dst.
	Replace(Route) error
	// Delete removes the route; a missing route is success.
	Delete(Route) error
	// NodeRoutes returns the destinations of the main table's routes of
	// both families that are not Tabby's (connected routes, a default
	// route from DHCP, static routes, routes of other daemons): the
	// node's own routes, which no learned route may take the place of.
	// Sorted, without duplicates.
	NodeRoutes() ([]netip.Prefix, error)
}

// Normalized returns r with Dst masked and Gateways sorted and de-duplicated,
// never sharing the Gateways slice with r.
func (r Route) Normalized() Route {
	r.Dst = r.Dst.Masked()
	gws := slices.Clone(r.Gateways)
	slices.SortFunc(gws, netip.Addr.Compare)
	r.Gateways = slices.Compact(gws)
	if len(r.Gateways) == 0 {
		r.Gateways = nil
	}
	return r
}

// Validate reports every problem that stops r from being programmed.
func (r Route) Validate() error {
	var errs []error
	if !r.Dst.IsValid() || r.Dst.Addr().Zone() != "" || r.Dst.Addr().Is4In6() {
		errs = append(errs, fmt.Errorf("destination %v is not an IPv4 or IPv6 prefix", r.Dst))
	}
	switch r.Type {
	case RouteUnicast:
		if r.Dev == "" && len(r.Gateways) == 0 {
			errs = append(errs, errors.New("unicast route needs a device or a gateway"))
		}
	case RouteBlackhole:
		if r.Dev != "" || len(r.Gateways) > 0 {
			errs = append(errs, errors.New("blackhole route with a device or gateway"))
		}
	default:
		errs = append(errs, fmt.Errorf("unsupported route type %v", r.Type))
	}
	if r.Onlink && (r.Dev == "" || len(r.Gateways) == 0) {
		errs = append(errs, errors.New("onlink route needs a device and a gateway"))
	}
	for _, gw := range r.Gateways {
		if r.Dst.IsValid() && gw.Is4() != r.Dst.Addr().Is4() {
			errs = append(errs, fmt.Errorf("gateway %v is not of the destination's family", gw))
		}
	}
	if r.Proto <= 0 || r.Proto > 255 {
		errs = append(errs, fmt.Errorf("protocol %d out of range 1-255", r.Proto))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid route %v: %w", r, err)
	}
	return nil
}

// Satisfies reports whether the route actual (as listed) fulfils the desired
// route r: same destination, type, protocol and gateways, and the same device
// unless r leaves the device to the kernel (Gateways without Dev).
func (r Route) Satisfies(actual Route) bool {
	d, actual := r.Normalized(), actual.Normalized()
	if d.Dst != actual.Dst || d.Type != actual.Type || d.Proto != actual.Proto ||
		!slices.Equal(d.Gateways, actual.Gateways) || d.Onlink != actual.Onlink {
		return false
	}
	if d.Dev == "" && len(d.Gateways) > 0 {
		return true
	}
	return d.Dev == actual.Dev
}

// String prints r the way `ip route` does, e.g.
// "10.244.0.5/32 dev cali1234 scope link proto 80",
// "blackhole 10.244.0.0/26 proto 80" or
// "10.244.1.0/26 proto 81 nexthop via 198.18.0.3 nexthop via 198.18.0.4".
func (r Route) String() string {
	var b strings.Builder
	if r.Type == RouteBlackhole {
		b.WriteString("blackhole ")
	} else if r.Type != RouteUnicast {
		fmt.Fprintf(&b, "%v ", r.Type)
	}
	if r.Dst.IsValid() && r.Dst.Bits() == 0 {
		b.WriteString("default")
	} else {
		b.WriteString(r.Dst.String())
	}
	switch {
	case len(r.Gateways) == 1:
		fmt.Fprintf(&b, " via %v", r.Gateways[0])
		if r.Dev != "" {
			fmt.Fprintf(&b, " dev %s", r.Dev)
		}
		fmt.Fprintf(&b, " proto %d", r.Proto)
		if r.Onlink {
			b.WriteString(" onlink")
		}
	case len(r.Gateways) > 1:
		fmt.Fprintf(&b, " proto %d", r.Proto)
		for _, gw := range r.Gateways {
			fmt.Fprintf(&b, " nexthop via %v", gw)
			if r.Dev != "" {
				fmt.Fprintf(&b, " dev %s", r.Dev)
			}
			if r.Onlink {
				b.WriteString(" onlink")
			}
		}
	case r.Dev != "":
		fmt.Fprintf(&b, " dev %s scope link proto %d", r.Dev, r.Proto)
	default:
		fmt.Fprintf(&b, " proto %d", r.Proto)
	}
	return b.String()
}

// CompareRoutes orders routes by destination, then by their text.
func CompareRoutes(a, b Route) int {
	if c := a.Dst.Compare(b.Dst); c != 0 {
		return c
	}
	return strings.Compare(a.String(), b.String())
}

// SyncRoutes makes the routes with protocol proto equal desired. Routes are
// matched by Dst: a missing or different route is replaced, then every listed
// route whose Dst is not desired is deleted (replace before delete, so that
// traffic never loses a route it will have again). It keeps going after a
// failure and returns errors.Join of all of them. A desired route with Proto
// 0 gets proto; one with another protocol is an error.
func SyncRoutes(r Routes, proto int, desired []Route) error {
	if !OwnedProto(proto) {
		return fmt.Errorf("syncing routes with protocol %d: %w", proto, ErrForeignRoute)
	}
	var errs []error
	want := make(map[netip.Prefix]Route, len(desired))
	var order []netip.Prefix
	for _, d := range desired {
		d = d.Normalized()
		if d.Proto == 0 {
			d.Proto = proto
		}
		if d.Proto != proto {
			errs = append(errs, fmt.Errorf("desired route %v: protocol is not %d", d, proto))
			continue
		}
		if prev, dup := want[d.Dst]; dup {
			if !prev.Satisfies(d) || !d.Satisfies(prev) {
				errs = append(errs, fmt.Errorf("desired routes %v and %v share a destination; keeping the first", prev, d))
			}
			continue
		}
		want[d.Dst] = d
		order = append(order, d.Dst)
	}

	current, err := r.List(proto)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("listing routes with protocol %d: %w", proto, err))...)
	}
	have := make(map[netip.Prefix][]Route, len(current))
	for _, c := range current {
		c = c.Normalized()
		have[c.Dst] = append(have[c.Dst], c)
	}

	slices.SortFunc(order, func(a, b netip.Prefix) int {
		return CompareRoutes(Route{Dst: a}, Route{Dst: b})
	})
	for _, dst := range order {
		d := want[dst]
		if slices.ContainsFunc(have[dst], d.Satisfies) {
			continue
		}
		if err := r.Replace(d); err != nil {
			errs = append(errs, fmt.Errorf("replacing route %v: %w", d, err))
		}
	}
	for _, c := range current {
		if _, ok := want[c.Dst.Masked()]; ok {
			continue
		}
		if err := r.Delete(c); err != nil {
			errs = append(errs, fmt.Errorf("deleting route %v: %w", c, err))
		}
	}
	return errors.Join(errs...)
}
