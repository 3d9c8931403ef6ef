package lab

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"regexp"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore/relay"
)

// Addresses of the lab's underlay. Everything lives in 198.18.0.0/24, inside
// the lab's own namespaces.
var (
	fabricNet = netip.MustParsePrefix("198.18.0.0/24")
	torAddr   = netip.MustParseAddr("198.18.0.1")
	// etcdAddr is the first etcd member's address; member i (0-based)
	// has etcdAddr + i, all on the etcd namespace's eth0.
	etcdAddr = netip.MustParseAddr("198.18.0.2")
	// The IPv6 underlay of a dual-stack lab, from the documentation range
	// 2001:db8::/32: the ToR is ::1, node k's address ends in its IPv4
	// address's last octet.
	fabricNet6 = netip.MustParsePrefix("2001:db8::/64")
	torAddr6   = netip.MustParseAddr("2001:db8::1")
	// etcdAddr6 is the first etcd member's address in a lab with an
	// IPv6-only fabric (Options.IPv6OnlyFabric).
	etcdAddr6 = netip.MustParseAddr("2001:db8::2")
	podPool   = netip.MustParsePrefix(PodPool)
)

const (
	// firstNodeHost is the last octet of node1's address (198.18.0.11).
	firstNodeHost = 11
	// maxNodeHost is the last octet of the last possible node address.
	maxNodeHost = 254
	// PodPool is the IPv4 pool the agents create.
	PodPool = "10.244.0.0/16"
	// PodPool6 is the IPv6 pool the agents of a dual-stack lab create
	// (unique local addresses).
	PodPool6 = "fd00:10:244::/48"
	// etcdClientPort and etcdPeerPort are every etcd member's ports.
	etcdClientPort = 2379
	etcdPeerPort   = 2380
	// MaxEtcdMembers is the most members the lab's etcd cluster can have:
	// their addresses, from 198.18.0.2 on, end below the first node's.
	MaxEtcdMembers = firstNodeHost - 2
	// DefaultRunDir holds one directory per lab.
	DefaultRunDir = "/run/tabby-lab"
	// DefaultName is the lab's name when none is given.
	DefaultName = "lab"
	// AgentHTTPListen is the agents' TCP status listener, on the node's own
	// loopback.
	AgentHTTPListen = "127.0.0.1:9099"
	// DefaultConvergeTimeout is Options.ConvergeTimeout's default.
	DefaultConvergeTimeout = 90 * time.Second
	// rrClusterID is the route-reflector cluster ID of the reflector nodes.
	rrClusterID = "244.0.0.1"
)

// Options configure Up.
type Options struct {
	// Name prefixes every namespace of the lab ("lab" → lab-fabric,
	// lab-node1, …); short and unique per concurrently running lab.
	Name string
	// Nodes is how many nodes Up creates (node1 … nodeN).
	Nodes int
	// RouteReflectors makes node1 … nodeK route reflectors and turns the
	// node-to-node mesh off.
	RouteReflectors int
	// AutoReflectors, when set, turns the mesh off and has the agents
	// elect this many route reflectors per zone (routeReflectorMode Auto);
	// the nodes are spread round robin over Zones zones (default 2) by the
	// label topology.kubernetes.io/zone. lab/autorr.go.
	AutoReflectors int
	Zones          int
	// ReflectorCandidates, in an AutoReflectors lab, lets only node1 …
	// nodeN be elected: they carry the label ReflectorCandidateLabel,
	// which routeReflectorNodeSelector requires, as the dedicated
	// reflector nodes of a large deployment do (with round-robin zones,
	// N = AutoReflectors × Zones gives each zone exactly its reflectors).
	// 0 lets every node be elected.
	ReflectorCandidates int
	// ReflectorGrace is the routeReflectorGracePeriod of an
	// AutoReflectors lab; 0 keeps the default.
	ReflectorGrace time.Duration
	// ReflectorPeering is the routeReflectorPeering of an AutoReflectors
	// lab: NonClient (the default, "") or Client (Calico's rule).
	ReflectorPeering string
	// PodsPerNode pods are added on every node after the agents started.
	PodsPerNode int
	// RunDir holds the lab's directory RunDir/Name (state, logs, sockets,
	// etcd data). Default DefaultRunDir.
	RunDir string
	// BinDir holds tabby-agent, tabby and tabby-lab. Default $TABBY_BIN;
	// when that is unset too, they are built into <lab dir>/bin with `go
	// build` (which needs the sources: the working directory must be inside
	// the module).
	BinDir string
	// LabBinary is the tabby-lab executable that runs etcd and the CNI
	// calls inside namespaces. Default BinDir/tabby-lab.
	LabBinary string
	// EtcdMembers is the size of the lab's etcd cluster: one member
	// (default) or several, each its own process and data directory, as
	// users run etcd. Agents and the lab get every member's endpoint.
	EtcdMembers int
	// EtcdProxy runs the etcd project's gRPC proxy (`etcd grpc-proxy
	// start`) in front of etcd and points the agents at it
	// (lab/etcdproxy.go).
	EtcdProxy bool
	// Relay runs a watch relay (cmd/tabby-relay) in front of etcd and
	// points the agents' --watch-endpoints at it (lab/relay.go).
	Relay bool
	// RelayWindow is the relay's batching window (tabby-relay
	// --batch-window; 0: the relay's default).
	RelayWindow time.Duration
	// NoAgents brings up the fabric, ToR, etcd and node namespaces only.
	NoAgents bool
	// DualStack gives the fabric an IPv6 underlay (2001:db8::/64), every
	// node an IPv6 address, the agents an IPv6 pool (PodPool6) and the
	// network configuration assign_ipv6: every pod gets an address of each
	// family.
	DualStack bool
	// IPv6Only is DualStack with IPv6-only pods: every pod gets an IPv6
	// address and no IPv4 one. The underlay keeps its IPv4 addresses for
	// etcd and the BGP sessions, which carry IPv6 (MP-BGP).
	IPv6Only bool
	// IPv6OnlyFabric builds a fabric without IPv4: the ToR, etcd and every
	// node have an address from 2001:db8::/64 only, the agents run with
	// --node-ip none (IPv6-only nodes: IPv6 BGP sessions, router IDs
	// derived from the node names), the pool is PodPool6 and every pod is
	// IPv6-only (tabby-lab up --ipv6-only).
	IPv6OnlyFabric bool
	// TwoSubnets puts the nodes in two underlay subnets joined by the ToR,
	// which routes only the underlay (no BGP, no pod routes): node1,
	// node3, … in 198.18.0.0/24, node2, node4, … in 198.18.1.0/24. See
	// lab/subnets.go.
	TwoSubnets bool
	// VXLANMode, when set, is the vxlanMode of the pools the lab creates
	// before the agents start (Never, Always, CrossSubnet).
	VXLANMode api.VXLANMode
	// IPv4Pool is the agents' default IPv4 pool, a prefix inside PodPool;
	// invalid (unset) is PodPool. A narrower pool leaves the rest of
	// PodPool to something else in the nodes' namespaces (`tabby-lab bench
	// cni` gives the reference plugins a range of it).
	IPv4Pool netip.Prefix
	// AgentArgs are appended to every tabby-agent command line, also of
	// agents started later (node add, restarts): the lab records them.
	AgentArgs []string
	// ClientAgentArgs are appended after AgentArgs to the command line of
	// every agent that is neither a route reflector (node1 … nodeK of
	// RouteReflectors) nor a reflector candidate (ReflectorCandidates).
	ClientAgentArgs []string
	// ConvergeTimeout bounds how long Up waits, after the agents serve, for
	// every expected BGP session to be Established; Up fails when they are
	// not. Default DefaultConvergeTimeout.
	ConvergeTimeout time.Duration
	// KeepUnconverged leaves the lab up (and returns it with the error)
	// when BGP did not converge, so that it can be inspected; by default
	// Up removes it like after any other failure.
	KeepUnconverged bool
	// Log receives progress lines; nil = silent.
	Log io.Writer
}

var (
	nameRE     = regexp.MustCompile(`^[a-z][a-z0-9-]{0,19}$`)
	nodeNameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,12}$`) // "v-" + name ≤ 15 chars
	podNameRE  = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,30}$`)
)

// Default fills unset fields.
func (o *Options) Default() {
	if o.Name == "" {
		o.Name = DefaultName
	}
	if o.RunDir == "" {
		o.RunDir = DefaultRunDir
	}
	if o.ConvergeTimeout == 0 {
		o.ConvergeTimeout = DefaultConvergeTimeout
	}
	if o.EtcdMembers == 0 {
		o.EtcdMembers = 1
	}
	if o.AutoReflectors > 0 && o.Zones == 0 {
		o.Zones = 2
	}
}

// Validate reports every problem of the options.
func (o *Options) Validate() error {
	var errs []error
	if !nameRE.MatchString(o.Name) {
		errs = append(errs, fmt.Errorf("name %q: want 1-20 characters [a-z0-9-], starting with a letter", o.Name))
	}
	if o.Nodes < 0 || o.Nodes > maxNodeHost-firstNodeHost+1 {
		errs = append(errs, fmt.Errorf("nodes: %d out of range 0-%d", o.Nodes, maxNodeHost-firstNodeHost+1))
	}
	if o.RouteReflectors < 0 || o.RouteReflectors > o.Nodes {
		errs = append(errs, fmt.Errorf("route reflectors: %d out of range 0-%d (the number of nodes)", o.RouteReflectors, o.Nodes))
	}
	if o.AutoReflectors < 0 || o.AutoReflectors > 16 {
		errs = append(errs, fmt.Errorf("auto reflectors: %d out of range 0-16 (routeReflectorsPerZone)", o.AutoReflectors))
	}
	switch o.ReflectorPeering {
	case "":
	case api.ReflectorPeeringNonClient, api.ReflectorPeeringClient:
		if o.AutoReflectors == 0 {
			errs = append(errs, fmt.Errorf("reflector peering %s: only with auto reflectors (routeReflectorMode Auto)", o.ReflectorPeering))
		}
	default:
		errs = append(errs, fmt.Errorf("reflector peering %q: want NonClient or Client", o.ReflectorPeering))
	}
	if o.AutoReflectors > 0 && o.RouteReflectors > 0 {
		errs = append(errs, errors.New("auto reflectors: not with route reflectors chosen by hand"))
	}
	if o.ReflectorCandidates < 0 || o.ReflectorCandidates > o.Nodes {
		errs = append(errs, fmt.Errorf("reflector candidates: %d out of range 0-%d (the number of nodes)", o.ReflectorCandidates, o.Nodes))
	}
	if o.ReflectorCandidates > 0 && o.AutoReflectors == 0 {
		errs = append(errs, errors.New("reflector candidates: only with auto reflectors"))
	}
	if o.Zones < 0 || o.Zones > 26 {
		errs = append(errs, fmt.Errorf("zones: %d out of range 0-26", o.Zones))
	}
	if o.EtcdMembers < 1 || o.EtcdMembers > MaxEtcdMembers {
		errs = append(errs, fmt.Errorf("etcd members: %d out of range 1-%d", o.EtcdMembers, MaxEtcdMembers))
	}
	if o.PodsPerNode < 0 {
		errs = append(errs, fmt.Errorf("pods per node: %d is negative", o.PodsPerNode))
	}
	if o.NoAgents && o.PodsPerNode > 0 {
		errs = append(errs, errors.New("pods need agents: pods per node must be 0 without agents"))
	}
	if o.ConvergeTimeout < 0 {
		errs = append(errs, fmt.Errorf("converge timeout: %v is negative", o.ConvergeTimeout))
	}
	switch o.VXLANMode {
	case "", api.VXLANModeNever, api.VXLANModeAlways, api.VXLANModeCrossSubnet:
	default:
		errs = append(errs, fmt.Errorf("vxlan mode %q: want Never, Always or CrossSubnet", o.VXLANMode))
	}
	if o.IPv6OnlyFabric {
		// Both build on IPv4 underlay addresses.
		if o.TwoSubnets {
			errs = append(errs, errors.New("two subnets: not available with an IPv6-only fabric"))
		}
		if o.EtcdProxy {
			errs = append(errs, errors.New("etcd proxy: not available with an IPv6-only fabric"))
		}
		if o.Relay {
			errs = append(errs, errors.New("relay: not available with an IPv6-only fabric"))
		}
	}
	if o.RelayWindow != 0 {
		if !o.Relay {
			errs = append(errs, fmt.Errorf("relay window %s: wants a relay", o.RelayWindow))
		} else if err := relay.CheckWindow(o.RelayWindow); err != nil {
			errs = append(errs, fmt.Errorf("relay window: %w", err))
		}
	}
	if o.IPv4Pool.IsValid() && (!o.IPv4Pool.Addr().Is4() || o.IPv4Pool.Bits() < podPool.Bits() || !podPool.Contains(o.IPv4Pool.Addr()) || o.IPv4Pool.Bits() > 26) {
		errs = append(errs, fmt.Errorf("ipv4 pool %s: want a prefix of %s between /%d and /26", o.IPv4Pool, PodPool, podPool.Bits()))
	}
	if o.RunDir != "" && !filepath.IsAbs(o.RunDir) {
		errs = append(errs, fmt.Errorf("run dir %q must be absolute", o.RunDir))
	}
	return errors.Join(errs...)
}

// NodeName is the name of the i-th node (1-based).
func NodeName(i int) string { return fmt.Sprintf("node%d", i) }

// podName is the name of the j-th pod (1-based) Up adds to node i.
func podName(i, j int) string { return fmt.Sprintf("n%dp%d", i, j) }

// nodePrefix6 is the IPv6 fabric address of the node with the given
// last octet.
func nodePrefix6(host int) netip.Prefix {
	a := fabricNet6.Addr().As16()
	a[15] = byte(host)
	return netip.PrefixFrom(netip.AddrFrom16(a), fabricNet6.Bits())
}

// nodePrefix is the fabric address of the node with the given last octet.
func nodePrefix(host int) netip.Prefix {
	a := fabricNet.Addr().As4()
	a[3] = byte(host)
	return netip.PrefixFrom(netip.AddrFrom4(a), fabricNet.Bits())
}
