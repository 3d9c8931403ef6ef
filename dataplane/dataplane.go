// Package dataplane owns everything that touches the kernel's network stack:
// network namespaces, the veth pair of each workload and its sysctls, and the
// routes Tabby programs. Callers see small interfaces (Workloads, Routes) in
// net/netip terms; the Linux implementations (NewWorkloads, NewRoutes) speak
// netlink, and dataplane/fake holds in-memory fakes for unit tests.
//
// Ownership: Tabby's routes carry the kernel route protocol numbers
// RouteProtoWorkload and RouteProtoBGP. Nothing here changes or deletes a
// route with any other protocol number.
//
// No other Tabby package imports netlink, netns or go-iptables.
package dataplane

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/tabbynet/tabby/api"
)

// Kernel route protocol numbers owned by Tabby.
const (
	// RouteProtoWorkload marks workload /32 routes and blackhole block routes.
	RouteProtoWorkload = api.RouteProtoWorkload
	// RouteProtoBGP marks routes learned over BGP.
	RouteProtoBGP = api.RouteProtoBGP
)

// Names and addresses of the Calico-style point-to-point wiring.
const (
	// HostMAC is the MAC address of every host-side workload interface.
	HostMAC = api.WorkloadHostMAC
	// DefaultMTU is used when WorkloadSpec.MTU is 0.
	DefaultMTU = 1500
)

// GatewayAddr is the fake next hop every workload routes through; the host
// side answers ARP for it by proxy ARP.
var GatewayAddr = netip.MustParseAddr(api.WorkloadGatewayIPv4)

// GatewayAddr6 is the IPv6 next hop of every workload: the host side's
// link-local address.
var GatewayAddr6 = netip.MustParseAddr(api.WorkloadGatewayIPv6)

// ErrForeignRoute is returned (wrapped) when an operation would change or
// delete a route whose protocol number is not one of Tabby's.
var ErrForeignRoute = errors.New("route not owned by tabby")

// ErrNoDevice is returned (wrapped) by Replace when a route's device does
// not exist, e.g. a workload interface removed while a reconcile pass ran.
var ErrNoDevice = errors.New("no such device")

// OwnedProto reports whether proto is one of Tabby's route protocol numbers.
func OwnedProto(proto int) bool {
	return proto == RouteProtoWorkload || proto == RouteProtoBGP
}

// WorkloadSpec describes one workload's interface.
type WorkloadSpec struct {
	NetNS      string         // path, e.g. /var/run/netns/x or /proc/<pid>/ns/net
	IfName     string         // container side, "eth0"
	HostIfName string         // "cali0123456789a"
	Addrs      []netip.Prefix // /32s and /128s
	MTU        int            // 0 = 1500
	MAC        string         // container side MAC, "" = random
	// SkipHostRoutes leaves the node's routes to the workload to the
	// caller: the agent's route owner, the one writer of protocol
	// RouteProtoWorkload routes, installs HostRoutes(spec) itself. Setup
	// then adds none and Teardown deletes none (the kernel drops routes
	// through a link with the link).
	SkipHostRoutes bool
}

// WorkloadStatus reports what Setup created.
type WorkloadStatus struct {
	HostIfIndex      int
	HostMAC          string
	ContainerIfIndex int
	ContainerMAC     string
	// Existed: the pair was already there and right (a repeated Setup);
	// the caller must not tear it down if its own request fails.
	Existed bool
}

// Prepared is what Prepare made ahead of a workload's addresses.
type Prepared struct {
	// Created: Prepare made a new pair, which the caller owns (it must
	// Complete it or tear it down). False: it changed nothing.
	Created          bool
	HostIfIndex      int
	ContainerIfIndex int
	ContainerMAC     string
}

// Workloads creates and removes workload interfaces. Implementations are safe
// for concurrent use on different workloads; callers serialise calls for the
// same workload.
type Workloads interface {
	// Setup wires the workload; it is idempotent and replaces a stale host
	// link of the same name. On failure it removes what it created.
	Setup(ctx context.Context, spec WorkloadSpec) (WorkloadStatus, error)
	// Prepare does the part of Setup that needs no address, so that it
	// can run while the addresses are being assigned (spec.Addrs may be
	// empty): when neither end of the workload's pair exists, it creates
	// the pair with its names, MTU and MACs, the host end's settings and
	// the host end up, and the container's lo up; the container end stays
	// down, without addresses or routes. When either end exists it
	// changes nothing (Created false) and Complete does all of Setup, as
	// it does for a repeated or stale pair. On failure it removes what it
	// created.
	Prepare(ctx context.Context, spec WorkloadSpec) (Prepared, error)
	// Complete finishes a workload Prepare began, spec now with its
	// addresses: for a pair Prepare created, the addresses, the container
	// end up and its routes (and the host end's IPv6 settings); otherwise
	// it is Setup. On failure it removes a pair Prepare created.
	Complete(ctx context.Context, spec WorkloadSpec, p Prepared) (WorkloadStatus, error)
	// Teardown removes the workload's links and host routes; a missing
	// netns, link or route is success.
	Teardown(ctx context.Context, spec WorkloadSpec) error
	// Check compares the kernel with spec and returns errors.Join of every
	// difference (nil when they agree).
	Check(ctx context.Context, spec WorkloadSpec) error
}

// HostIfName returns the host-side interface name for a workload:
// "cali" followed by the first 11 hex characters of sha1(workloadID), 15
// characters in all (the kernel limit).
func HostIfName(workloadID string) string {
	sum := sha1.Sum([]byte(workloadID))
	return api.WorkloadIfacePrefix + hex.EncodeToString(sum[:])[:11]
}

// HostRoutes returns the node's routes to the workload's addresses,
// "<addr>/32 dev <HostIfName> scope link proto 80", which Setup installs.
// A caller that syncs protocol RouteProtoWorkload with SyncRoutes must
// include them in its desired set.
func HostRoutes(spec WorkloadSpec) []Route {
	out := make([]Route, 0, len(spec.Addrs))
	for _, a := range spec.Addrs {
		out = append(out, Route{Dst: a.Masked(), Type: RouteUnicast, Dev: spec.HostIfName, Proto: RouteProtoWorkload})
	}
	return out
}

// HasIPv6 reports whether the workload has an IPv6 address.
func (s WorkloadSpec) HasIPv6() bool {
	return slices.ContainsFunc(s.Addrs, func(p netip.Prefix) bool { return p.Addr().Is6() })
}

// HasIPv4 reports whether the workload has an IPv4 address.
func (s WorkloadSpec) HasIPv4() bool {
	return slices.ContainsFunc(s.Addrs, func(p netip.Prefix) bool { return p.Addr().Is4() })
}

// EffectiveMTU returns the MTU the workload's interfaces get.
func (s WorkloadSpec) EffectiveMTU() int {
	if s.MTU == 0 {
		return DefaultMTU
	}
	return s.MTU
}

// Validate reports every problem with the spec.
func (s WorkloadSpec) Validate() error {
	return s.validate(true)
}

// ValidateLinks is Validate without the addresses (Prepare's spec).
func (s WorkloadSpec) ValidateLinks() error {
	return s.validate(false)
}

func (s WorkloadSpec) validate(withAddrs bool) error {
	var errs []error
	if s.IfName == "" {
		errs = append(errs, errors.New("container interface name is empty"))
	} else if err := validIfName(s.IfName); err != nil {
		errs = append(errs, fmt.Errorf("container interface name: %w", err))
	}
	if s.HostIfName == "" {
		errs = append(errs, errors.New("host interface name is empty"))
	} else if err := validIfName(s.HostIfName); err != nil {
		errs = append(errs, fmt.Errorf("host interface name: %w", err))
	}
	if s.NetNS == "" {
		errs = append(errs, errors.New("netns path is empty"))
	}
	if withAddrs && len(s.Addrs) == 0 {
		errs = append(errs, errors.New("no addresses"))
	}
	seen := map[netip.Prefix]bool{}
	for _, p := range s.Addrs {
		switch {
		case !p.IsValid():
			errs = append(errs, fmt.Errorf("invalid address %v", p))
		case p.Addr().Zone() != "" || p.Addr().Is4In6() || p.Bits() != p.Addr().BitLen() || p.Addr().IsLinkLocalUnicast():
			errs = append(errs, fmt.Errorf("address %v is not an IPv4 /32 or a global IPv6 /128", p))
		case seen[p]:
			errs = append(errs, fmt.Errorf("address %v listed twice", p))
		}
		seen[p] = true
	}
	if s.MTU < 0 || s.MTU > 65535 || (s.MTU != 0 && s.MTU < 68) {
		errs = append(errs, fmt.Errorf("mtu %d out of range 68-65535", s.MTU))
	} else if s.HasIPv6() && s.EffectiveMTU() < 1280 {
		errs = append(errs, fmt.Errorf("mtu %d is below IPv6's minimum of 1280", s.MTU))
	}
	if s.MAC != "" {
		if hw, err := net.ParseMAC(s.MAC); err != nil || len(hw) != 6 {
			errs = append(errs, fmt.Errorf("invalid mac %q", s.MAC))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid workload spec: %w", err)
	}
	return nil
}

func validIfName(name string) error {
	if len(name) > 15 {
		return fmt.Errorf("%q is longer than 15 characters", name)
	}
	if name == "." || name == ".." {
		return fmt.Errorf("%q is not allowed", name)
	}
	for _, c := range name {
		if c == '/' || c == ':' || c <= ' ' || c == 0x7f {
			return fmt.Errorf("%q contains %q", name, c)
		}
	}
	return nil
}
