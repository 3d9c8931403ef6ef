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
	"strconv"
	"time"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/policy"
)

// Config is the agent's configuration, parsed once from flags and env.
type Config struct {
	NodeName string
	NodeIP   string // CIDR; "" = autodetect
	// NodeIP6 is the node's IPv6 underlay address as a CIDR, the next hop
	// of its IPv6 pod routes; "" = the node has no IPv6 underlay (its
	// pods' IPv6 addresses are reachable on the node only).
	NodeIP6          string
	AutodetectMethod string
	Etcd             datastore.Config
	CNISocket        string
	StatusSocket     string
	HTTPListen       string // "" = off
	StateDir         string
	GoBGPAPI         string // "" = off; loopback only
	DefaultPoolCIDR  string // "" = do not create a pool
	// DefaultPoolCIDR6 is an IPv6 pool to create when no IPv6 pool exists.
	DefaultPoolCIDR6 string
	ResyncInterval   time.Duration
	// LeaseTTL is the liveness lease of the node's status keys.
	LeaseTTL time.Duration
	// BGPSettleTime bounds how long stale learned routes are kept after a
	// start before BGP has converged.
	BGPSettleTime time.Duration
	// FirewallBackend is "auto" (nftables where the kernel has it, else
	// iptables), "nftables" or "iptables"; the other backend's Tabby rules
	// are removed at start.
	FirewallBackend string
	// EndpointToHostAction is what traffic from a pod to this node meets
	// after the pod's anti-spoofing check and egress policy: "Drop"
	// (default, as Calico's DefaultEndpointToHostAction), "Accept" or
	// "Return" (on to the node's own INPUT rules). The etcd client ports and
	// the GoBGP API are unreachable from pods whatever it is.
	EndpointToHostAction string
	// NodeGCGrace is how long a node must be gone (no Node record, no
	// liveness record) before node GC releases what it held; see
	// DefaultNodeGCGrace (5 minutes). Labs and tests shorten it;
	// production keeps minutes, so that a node briefly without its record
	// loses nothing.
	NodeGCGrace time.Duration
}

// HostProtectedPorts are the node's ports no pod may reach: every etcd
// endpoint's port (2379 when an http(s) endpoint names none) and the GoBGP
// API's.
func (c *Config) HostProtectedPorts() []policy.HostPort {
	var out []policy.HostPort
	for _, ep := range c.Etcd.Endpoints {
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
	if ap, err := netip.ParseAddrPort(c.GoBGPAPI); err == nil {
		out = append(out, policy.HostPort{Proto: "tcp", Port: ap.Port()})
	}
	return out
}

// Default returns the defaults of a production node.
func Default() Config {
	host, _ := os.Hostname()
	return Config{
		NodeName:         host,
		AutodetectMethod: "first-found",
		Etcd:             datastore.Config{Endpoints: []string{"http://127.0.0.1:2379"}},
		CNISocket:        "/var/run/tabby/cni.sock",
		StatusSocket:     "/var/run/tabby/status.sock",
		HTTPListen:       "127.0.0.1:9099",
		StateDir:         "/var/lib/tabby",
		ResyncInterval:   30 * time.Second,
		LeaseTTL:         20 * time.Second,
		BGPSettleTime:    30 * time.Second,
		FirewallBackend:  "auto",
		// Calico's default: a pod reaches its node only where the node's
		// own rules (Return) or the operator (Accept) say so. Replies to
		// the node's connections (kubelet probes) pass; DNS goes to the
		// cluster DNS pods, not to the node.
		EndpointToHostAction: policy.EndpointToHostDrop,
		NodeGCGrace:          DefaultNodeGCGrace,
	}
}

// Validate reports every problem with the configuration.
func (c *Config) Validate() error {
	var errs []error
	if c.NodeName == "" {
		errs = append(errs, errors.New("node name: empty (set --node-name or NODENAME)"))
	}
	if c.NodeIP6 != "" {
		if p, err := netip.ParsePrefix(c.NodeIP6); err != nil || !p.Addr().Is6() || p.Addr().Is4In6() || p.Addr().IsLinkLocalUnicast() || p.Addr().Zone() != "" {
			errs = append(errs, fmt.Errorf("node ipv6: %q is not a global IPv6 CIDR like 2001:db8::11/64", c.NodeIP6))
		}
	}
	if c.DefaultPoolCIDR6 != "" {
		if p, err := netip.ParsePrefix(c.DefaultPoolCIDR6); err != nil || !p.Addr().Is6() {
			errs = append(errs, fmt.Errorf("default ipv6 pool: %q is not an IPv6 CIDR", c.DefaultPoolCIDR6))
		}
	}
	if c.NodeIP != "" {
		if p, err := netip.ParsePrefix(c.NodeIP); err != nil || !p.Addr().Is4() {
			errs = append(errs, fmt.Errorf("node ip: %q is not an IPv4 CIDR like 198.18.0.11/24", c.NodeIP))
		}
	} else if _, err := ParseAutodetectMethod(c.AutodetectMethod); err != nil {
		errs = append(errs, err)
	}
	switch c.EndpointToHostAction {
	case "", policy.EndpointToHostDrop, policy.EndpointToHostAccept, policy.EndpointToHostReturn:
	default:
		errs = append(errs, fmt.Errorf("endpoint to host action: %q is not Drop, Accept or Return", c.EndpointToHostAction))
	}
	switch c.FirewallBackend {
	case "", "auto", "nftables", "iptables":
	default:
		errs = append(errs, fmt.Errorf("firewall backend: %q is not auto, nftables or iptables", c.FirewallBackend))
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
	if c.GoBGPAPI != "" {
		ap, err := netip.ParseAddrPort(c.GoBGPAPI)
		if err != nil || !ap.Addr().IsLoopback() {
			errs = append(errs, fmt.Errorf("gobgp api: %q must be a loopback address:port (the API has no authentication)", c.GoBGPAPI))
		}
	}
	if c.DefaultPoolCIDR != "" {
		if p, err := netip.ParsePrefix(c.DefaultPoolCIDR); err != nil || !p.Addr().Is4() {
			errs = append(errs, fmt.Errorf("default ipv4 pool: %q is not an IPv4 CIDR", c.DefaultPoolCIDR))
		}
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
	etcd := c.Etcd
	etcd.Default()
	if err := etcd.Validate(); err != nil && len(c.Etcd.Endpoints) > 0 {
		errs = append(errs, fmt.Errorf("etcd: %w", err))
	}
	return errors.Join(errs...)
}
