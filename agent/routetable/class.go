// Package routetable is the one owner of Tabby's routes in the kernel's
// main table (Felix's route table, one writer per table). Other parts of the
// agent compute the routes of their class — workload, blackhole, aggregate,
// learned, tunnel (service is reserved for later) — and hand them over
// with SetClass; the table picks one winner per destination by class and
// programs only what changed since it last did (Apply). A full diff against
// the kernel runs at the first Apply and then once per resync interval, so
// that orphans from an earlier run and changes made behind its back are
// repaired without dumping every route on every pass.
//
// Invariants, in both address families:
//   - a learned (or tunnel) route never replaces local state (a workload's
//     host route, a block's blackhole, a pool aggregate) for its
//     destination: the local class wins;
//   - a learned (or tunnel) route is never programmed over one of the
//     node's own routes (any main-table route without a Tabby protocol:
//     connected subnets, a DHCP default route, static routes);
//   - when the winning route of a destination goes, the next class's route
//     for it takes its place (a learned /32 comes back once the local pod
//     with that address is gone).
package routetable

import (
	"fmt"

	"github.com/tabbynet/tabby/dataplane"
)

// Class is a kind of route. When several classes want a route to the same
// destination, the one with the higher priority wins.
type Class int

// The classes, lowest priority first.
const (
	// Learned routes come from BGP: another node's blocks, borrowed
	// addresses and external routes. Protocol RouteProtoBGP.
	Learned Class = iota + 1
	// Tunnel routes go through a VXLAN device to another node's tunnel
	// address (`via <addr> dev vxlan.tabby onlink`; agent/tunnel.go,
	// docs/vxlan.md). Protocol RouteProtoWorkload.
	Tunnel
	// Service is reserved for Service address routes of a later issue.
	Service
	// Aggregate is a pool aggregate's blackhole (see the agent's
	// aggregateBlackholes).
	Aggregate
	// Blackhole is an affine block's blackhole route.
	Blackhole
	// Workload is a local workload's host route (/32 or /128 dev cali…).
	Workload
)

// byPriority lists the classes, highest priority first.
var byPriority = []Class{Workload, Blackhole, Aggregate, Service, Tunnel, Learned}

func (c Class) String() string {
	switch c {
	case Learned:
		return "learned"
	case Tunnel:
		return "tunnel"
	case Service:
		return "service"
	case Aggregate:
		return "aggregate"
	case Blackhole:
		return "blackhole"
	case Workload:
		return "workload"
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// Proto is the route protocol number the class's routes carry in the
// kernel: RouteProtoBGP for learned routes (so that `ip route` tells them
// apart), RouteProtoWorkload for the rest.
func (c Class) Proto() int {
	if c == Learned {
		return dataplane.RouteProtoBGP
	}
	return dataplane.RouteProtoWorkload
}

// Remote reports whether the class's routes point away from the node
// (learned, tunnel): such a route never takes the place of the node's own
// route for its destination.
func (c Class) Remote() bool { return c == Learned || c == Tunnel }

func (c Class) valid() bool { return c >= Learned && c <= Workload }

// classOfProto is the class a route found in the kernel is taken to be of
// when no class wants it any more (an orphan), which decides whether a
// hold on deletes keeps it.
func classOfProto(proto int) Class {
	if proto == dataplane.RouteProtoBGP {
		return Learned
	}
	return Workload
}
