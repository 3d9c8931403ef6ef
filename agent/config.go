// Package agent wires Tabby's per-node agent: node registration, the CNI
// server, workload wiring, the BGP speaker and the reconcile loops that keep
// the kernel's routes equal to what the datastore and BGP say, plus health,
// metrics and a status API.
package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/flowlog"
	"github.com/tabbynet/tabby/policy"
)

// Config is the agent's configuration, parsed once from flags and env: no
// field is a string that is parsed again at run time.
type Config struct {
	NodeName string
	// NodeIP is the node's IPv4 address with its subnet; invalid =
	// autodetect with AutodetectMethod.
	NodeIP netip.Prefix
	// NodeIP6 is the node's IPv6 underlay address with its subnet, the next
	// hop of its IPv6 pod routes; invalid = the node has no IPv6 underlay
	// (its pods' IPv6 addresses are reachable on the node only).
	NodeIP6          netip.Prefix
	AutodetectMethod AutodetectMethod
	// NoIPv4 makes the node IPv6-only (Calico's IP=none): no IPv4 address,
	// no IPv4 autodetection, IPv6 BGP sessions, IPv6 pools only. It needs
	// NodeIP6 or AutodetectIPv6.
	NoIPv4 bool
	// AutodetectIPv6 finds NodeIP6 with AutodetectMethod6 (Calico's
	// IP6=autodetect) when NodeIP6 is not set.
	AutodetectIPv6    bool
	AutodetectMethod6 AutodetectMethod6
	// RouterID is the node's 32-bit BGP router ID (Calico's BGP routerID);
	// invalid = the IPv4 address, or on an IPv6-only node the Node's
	// spec.bgp.routerID, else one derived from the name (bgp.RouterIDFor).
	RouterID     netip.Addr
	Etcd         datastore.Config
	CNISocket    string
	StatusSocket string
	HTTPListen   netip.AddrPort // invalid = off
	StateDir     string
	GoBGPAPI     netip.AddrPort // invalid = off; loopback only
	// DebugPprof serves Go's net/http/pprof profiles on this loopback
	// address:port (invalid = off; docs/scale.md, "Profiling an agent").
	DebugPprof      netip.AddrPort
	DefaultPoolCIDR netip.Prefix // invalid = do not create a pool
	// DefaultPoolCIDR6 is an IPv6 pool to create when no IPv6 pool exists.
	DefaultPoolCIDR6 netip.Prefix
	ResyncInterval   time.Duration
	// LeaseTTL is the liveness lease of the node's status keys.
	LeaseTTL time.Duration
	// BGPSettleTime bounds how long stale learned routes are kept after a
	// start before BGP has converged.
	BGPSettleTime time.Duration
	// FirewallBackend chooses the packet filter; the other backend's Tabby
	// rules are removed at start.
	FirewallBackend FirewallBackend
	// EndpointToHostAction is what traffic from a pod to this node meets
	// after the pod's anti-spoofing check and egress policy. The etcd
	// client ports and the GoBGP API are unreachable from pods whatever it
	// is.
	EndpointToHostAction EndpointToHostAction
	// NodeGCGrace is how long a node must be gone (no Node record, no
	// liveness record) before node GC releases what it held; see
	// DefaultNodeGCGrace (5 minutes). Labs and tests shorten it;
	// production keeps minutes, so that a node briefly without its record
	// loses nothing.
	NodeGCGrace time.Duration
	// NodeGCMaxPerPass caps how many nodes one node GC pass releases; see
	// DefaultNodeGCMaxPerPass.
	NodeGCMaxPerPass int
	// FlowLog configures flow logs (docs/flows.md); off by default.
	FlowLog flowlog.Config
}

// FirewallBackend names the packet filter that enforces policy.
type FirewallBackend string

// The firewall backends.
const (
	// FirewallAuto is nftables where the kernel has it, else iptables.
	FirewallAuto     FirewallBackend = "auto"
	FirewallNFTables FirewallBackend = "nftables"
	FirewallIPTables FirewallBackend = "iptables"
)

func (b FirewallBackend) valid() bool {
	switch b {
	case "", FirewallAuto, FirewallNFTables, FirewallIPTables:
		return true
	}
	return false
}

// MarshalText implements encoding.TextMarshaler.
func (b FirewallBackend) MarshalText() ([]byte, error) { return []byte(b), nil }

// UnmarshalText implements encoding.TextUnmarshaler; it accepts only the
// backends' names.
func (b *FirewallBackend) UnmarshalText(t []byte) error {
	v := FirewallBackend(t)
	if !v.valid() {
		return fmt.Errorf("firewall backend: %q is not auto, nftables or iptables", v)
	}
	*b = v
	return nil
}

// EndpointToHostAction is what traffic from a pod to its node meets after
// the pod's egress policy (Calico's DefaultEndpointToHostAction).
type EndpointToHostAction string

// The endpoint-to-host actions.
const (
	// EndpointToHostDrop is the default, as Calico's.
	EndpointToHostDrop EndpointToHostAction = policy.EndpointToHostDrop
	// EndpointToHostAccept accepts the traffic.
	EndpointToHostAccept EndpointToHostAction = policy.EndpointToHostAccept
	// EndpointToHostReturn hands it on to the node's own INPUT rules.
	EndpointToHostReturn EndpointToHostAction = policy.EndpointToHostReturn
)

func (a EndpointToHostAction) valid() bool {
	switch a {
	case "", EndpointToHostDrop, EndpointToHostAccept, EndpointToHostReturn:
		return true
	}
	return false
}

// MarshalText implements encoding.TextMarshaler.
func (a EndpointToHostAction) MarshalText() ([]byte, error) { return []byte(a), nil }

// UnmarshalText implements encoding.TextUnmarshaler; it accepts only the
// actions' names.
func (a *EndpointToHostAction) UnmarshalText(t []byte) error {
	v := EndpointToHostAction(t)
	if !v.valid() {
		return fmt.Errorf("endpoint to host action: %q is not Drop, Accept or Return", v)
	}
	*a = v
	return nil
}

// HostProtectedPorts are the node's ports no pod may reach: every etcd
// and watch relay endpoint's port (2379 when an http(s) endpoint names none) and the GoBGP
// API's.
func (c *Config) HostProtectedPorts() []policy.HostPort {
	var out []policy.HostPort
	for _, ep := range slices.Concat(c.Etcd.Endpoints, c.Etcd.WatchEndpoints) {
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
			continue
		}
		port := uint64(2379)
		if p := u.Port(); p != "" {
			if port, err = strconv.ParseUint(p, 10, 16); err != nil {
				continue
			}
		}
		out = append(out, policy.HostPort{Proto: "tcp", Port: uint16(port)})
	}
	if c.GoBGPAPI.IsValid() {
		out = append(out, policy.HostPort{Proto: "tcp", Port: c.GoBGPAPI.Port()})
	}
	return out
}

// AgentPorts are the agent's own TCP ports, which the node guard keeps
// workloads from reaching on any node (policy.NodeGuard): the health,
// metrics and status port and the GoBGP API's. A loopback listener is
// listed too: another node's agent may listen elsewhere, and a guard
// that depends on the address is easy to get wrong.
func (c *Config) AgentPorts() []uint16 {
	var out []uint16
	if c.HTTPListen.IsValid() {
		out = append(out, c.HTTPListen.Port())
	}
	if c.GoBGPAPI.IsValid() {
		out = append(out, c.GoBGPAPI.Port())
	}
	if c.DebugPprof.IsValid() {
		out = append(out, c.DebugPprof.Port())
	}
	return out
}

// Default returns the defaults of a production node.
func Default() Config {
	host, _ := os.Hostname()
	return Config{
		NodeName:          host,
		AutodetectMethod:  AutodetectMethod{Kind: "first-found"},
		AutodetectMethod6: AutodetectMethod6{AutodetectMethod{Kind: "first-found"}},
		Etcd:              datastore.Config{Endpoints: []string{"http://127.0.0.1:2379"}},
		CNISocket:         "/var/run/tabby/cni.sock",
		StatusSocket:      "/var/run/tabby/status.sock",
		HTTPListen:        netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), 9099),
		StateDir:          "/var/lib/tabby",
		ResyncInterval:    30 * time.Second,
		LeaseTTL:          20 * time.Second,
		BGPSettleTime:     30 * time.Second,
		FirewallBackend:   FirewallAuto,
		// Calico's default: a pod reaches its node only where the node's
		// own rules (Return) or the operator (Accept) say so. Replies to
		// the node's connections (kubelet probes) pass; DNS goes to the
		// cluster DNS pods, not to the node.
		EndpointToHostAction: EndpointToHostDrop,
		NodeGCGrace:          DefaultNodeGCGrace,
		NodeGCMaxPerPass:     DefaultNodeGCMaxPerPass,
		FlowLog:              flowlog.Default(),
	}
}

// validateFamilies reports the problems of the node's addresses: an
// IPv6-only node (NoIPv4) needs an IPv6 address and no IPv4 one, nor an
// IPv4 default pool; the router ID is a dotted IPv4 identifier.
func (c *Config) validateFamilies() []error {
	var errs []error
	if !c.NodeIP.IsValid() && !c.NoIPv4 {
		// Flags and env parse it; this catches one built in code.
		if _, err := ParseAutodetectMethod(c.AutodetectMethod.String()); err != nil {
			errs = append(errs, err)
		}
	}
	if c.AutodetectIPv6 && !c.NodeIP6.IsValid() {
		if _, err := parseAutodetect(c.AutodetectMethod6.String(), true); err != nil {
			errs = append(errs, fmt.Errorf("ipv6 autodetection: %w", err))
		}
	}
	if c.NoIPv4 {
		if c.NodeIP.IsValid() {
			errs = append(errs, fmt.Errorf("node ip: none (IPv6-only) and an address %s given together", c.NodeIP))
		}
		if !c.NodeIP6.IsValid() && !c.AutodetectIPv6 {
			errs = append(errs, errors.New("node ip: none needs an IPv6 address: set --node-ip6 to a CIDR or autodetect (env IP6); a node needs an address of one family at least"))
		}
		if c.DefaultPoolCIDR.IsValid() {
			errs = append(errs, fmt.Errorf("default ipv4 pool: %s on an IPv6-only node (node ip none): its pods could not be routed; create IPv6 pools only", c.DefaultPoolCIDR))
		}
	}
	if r := c.RouterID; r.IsValid() && (!r.Is4() || r.IsUnspecified()) {
		errs = append(errs, fmt.Errorf("router id: %s is not a dotted IPv4 router ID like 240.0.0.1 (and not 0.0.0.0)", r))
	}
	return errs
}

// Validate reports every problem with the configuration.
func (c *Config) Validate() error {
	var errs []error
	if c.NodeName == "" {
		errs = append(errs, errors.New("node name: empty (set --node-name or NODENAME)"))
	}
	if p := c.NodeIP6; p.IsValid() && (!p.Addr().Is6() || p.Addr().Is4In6() || p.Addr().IsLinkLocalUnicast() || p.Addr().Zone() != "") {
		errs = append(errs, fmt.Errorf("node ipv6: %s is not a global IPv6 CIDR like 2001:db8::11/64", p))
	}
	if p := c.DefaultPoolCIDR6; p.IsValid() && (!p.Addr().Is6() || p.Addr().Is4In6()) {
		errs = append(errs, fmt.Errorf("default ipv6 pool: %s is not an IPv6 CIDR", p))
	}
	if p := c.NodeIP; p.IsValid() && !p.Addr().Is4() {
		errs = append(errs, fmt.Errorf("node ip: %s is not an IPv4 CIDR like 198.18.0.11/24", p))
	}
	errs = append(errs, c.validateFamilies()...)
	if !c.EndpointToHostAction.valid() {
		errs = append(errs, fmt.Errorf("endpoint to host action: %q is not Drop, Accept or Return", c.EndpointToHostAction))
	}
	if !c.FirewallBackend.valid() {
		errs = append(errs, fmt.Errorf("firewall backend: %q is not auto, nftables or iptables", c.FirewallBackend))
	}
	if c.NodeGCMaxPerPass < 1 {
		errs = append(errs, fmt.Errorf("node gc max per pass: %d must be at least 1", c.NodeGCMaxPerPass))
	}
	if len(c.Etcd.Endpoints) == 0 {
		errs = append(errs, errors.New("etcd endpoints: none (set --etcd-endpoints or TABBY_ETCD_ENDPOINTS)"))
	}
	if c.CNISocket == "" || !filepath.IsAbs(c.CNISocket) {
		errs = append(errs, fmt.Errorf("cni socket: %q must be an absolute path", c.CNISocket))
	}
	if c.StatusSocket != "" && !filepath.IsAbs(c.StatusSocket) {
		errs = append(errs, fmt.Errorf("status socket: %q must be an absolute path", c.StatusSocket))
	}
	if ap := c.GoBGPAPI; ap.IsValid() && !ap.Addr().IsLoopback() {
		errs = append(errs, fmt.Errorf("gobgp api: %s must be a loopback address:port (the API has no authentication)", ap))
	}
	if ap := c.DebugPprof; ap.IsValid() && !ap.Addr().IsLoopback() {
		errs = append(errs, fmt.Errorf("debug pprof: %s must be a loopback address:port (profiles have no authentication)", ap))
	}
	if p := c.DefaultPoolCIDR; p.IsValid() && (!p.Addr().Is4() || p.Addr().Is4In6()) {
		errs = append(errs, fmt.Errorf("default ipv4 pool: %s is not an IPv4 CIDR", p))
	}
	// Bounds: a value far outside them is a mistake (a wrong unit) that
	// would overflow (etcd lease TTLs are seconds in an int64) or stall.
	for _, b := range []struct {
		name     string
		v        time.Duration
		min, max time.Duration
	}{
		{"resync interval", c.ResyncInterval, time.Second, time.Hour},
		{"lease ttl", c.LeaseTTL, 2 * time.Second, 10 * time.Minute},
		{"bgp settle time", c.BGPSettleTime, 0, 10 * time.Minute},
		// Seconds are for labs and tests (a node whose record an operator
		// re-creates, or whose agent restarts, could lose its addresses);
		// above a day dead nodes hold addresses for too long to be an
		// intent.
		{"node gc grace", c.NodeGCGrace, time.Second, 24 * time.Hour},
	} {
		if b.v < b.min || b.v > b.max {
			errs = append(errs, fmt.Errorf("%s: %s must be between %s and %s", b.name, b.v, b.min, b.max))
		}
	}
	if err := c.FlowLog.Validate(); err != nil {
		errs = append(errs, err)
	}
	etcd := c.Etcd
	etcd.Default()
	if err := etcd.Validate(); err != nil && len(c.Etcd.Endpoints) > 0 {
		errs = append(errs, fmt.Errorf("etcd: %w", err))
	}
	return errors.Join(errs...)
}
