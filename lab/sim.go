package lab

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tabbynet/tabby/api"
)

// SimOptions configure Sim, the scale harness behind `tabby-lab sim`
// (docs/scale.md): a small real lab (reflectors and client agents, real
// kernels) plus simulated nodes in this process.
type SimOptions struct {
	Name, RunDir, BinDir string
	// Sizes are the simulated node counts, ascending: the harness grows
	// the same lab from one to the next and measures at each.
	Sizes []int
	// RealNodes real agents are route-reflector clients with a pod each;
	// RouteReflectors real agents reflect (per zone with Zones). Defaults
	// 2 (with Zones, max(2, Zones)) and 2.
	RealNodes, RouteReflectors int
	// Zones, when set, runs the cluster in zones as a deployment of that
	// size would (docs/scale.md, "Reflector zones"): routeReflectorMode
	// Auto with RouteReflectors per zone, elected by the real agents among
	// the first RouteReflectors × Zones real nodes (the candidates); every
	// node, real or simulated, carries a zone label (round robin) and a
	// client peers with its zone's reflectors only. 0 (default): the first
	// RouteReflectors real nodes reflect, by hand, for every node.
	Zones int
	// ReflectorPeering is the routeReflectorPeering of a run in Zones:
	// NonClient (default) or Client (Calico's rule: the reflectors of
	// different zones are each other's clients).
	ReflectorPeering string
	// EndpointsPerNode endpoints on each simulated node (default 30);
	// Policies NetworkPolicies (default 1,000).
	EndpointsPerNode, Policies int
	// ChurnEvents pod events (an add and a delete are one event each) at
	// ChurnRate per second, for ChurnWindow at most; a rest of IdleWindow
	// precedes and follows them. Defaults 400, 20/s, 10 min, 60 s: the
	// rest spans two of the agents' 30 s resync passes, which a shorter
	// window would catch or miss by chance.
	ChurnEvents             int
	ChurnRate               float64
	ChurnWindow, IdleWindow time.Duration
	// Samples of each latency per size (default 10).
	Samples int
	// Watch: every simulated node holds a watch of the whole prefix during
	// the measurements, as an agent does.
	Watch bool
	// EtcdProxy: agents and simulated nodes reach etcd through the etcd
	// project's gRPC proxy (Options.EtcdProxy).
	EtcdProxy bool
	// Relay: the real agents' views watch through a watch relay
	// (Options.Relay); the simulated nodes do not.
	Relay bool
	// RelayWindow is the relay's batching window (Options.RelayWindow; 0:
	// the relay's default).
	RelayWindow time.Duration
	// AgentArgs are appended to every real agent's command line
	// (Options.AgentArgs), e.g. --debug-pprof 127.0.0.1:6060 to profile
	// them at a size (docs/scale.md, "Profiling an agent").
	AgentArgs []string
	// ClientAgentArgs are appended to the client agents' command lines
	// only, not the reflectors' (Options.ClientAgentArgs): e.g. --max-procs 1.
	ClientAgentArgs []string
	// Out receives results.md, results.json and scale.png ("" = none).
	Out string
	Log io.Writer
}

// MaxSimNodes is the most simulated nodes: their addresses fill simSubnet.
const MaxSimNodes = 1000

// maxSimRealAgents bounds the real agents (reflectors and clients) the
// harness runs next to a thousand simulated nodes on the 2-core host;
// maxSimZones is the most zones (ZoneName's letters).
const (
	maxSimRealAgents = 20
	maxSimZones      = 26
)

// reflectors is how many real agents reflect: RouteReflectors, per zone
// with Zones.
func (o *SimOptions) reflectors() int { return o.RouteReflectors * max(o.Zones, 1) }

// Memory the harness needs, calibrated on the sweep (docs/scale.md): the
// real lab, and per simulated node its etcd client, sessions and records
// (in this process, the reflectors and etcd).
const (
	simFixedMiB   = 1024
	simPerNodeMiB = 6
)

// Default fills unset fields.
func (o *SimOptions) Default() {
	if o.Name == "" {
		o.Name = "sim"
	}
	if o.RunDir == "" {
		o.RunDir = DefaultRunDir
	}
	if len(o.Sizes) == 0 {
		o.Sizes = []int{10}
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.RealNodes, max(2, o.Zones))
	def(&o.RouteReflectors, 2)
	def(&o.EndpointsPerNode, 30)
	def(&o.Policies, 1000)
	def(&o.Samples, 10)
	if o.ChurnRate == 0 {
		o.ChurnRate = 20
	}
	def(&o.ChurnEvents, 400)
	if o.ChurnWindow == 0 {
		o.ChurnWindow = 10 * time.Minute
	}
	if o.IdleWindow == 0 {
		o.IdleWindow = 60 * time.Second
	}
}

// Validate reports every problem of the options, including a size that
// does not fit this host's memory (with the largest one that does).
func (o *SimOptions) Validate() error {
	var errs []error
	if !nameRE.MatchString(o.Name) {
		errs = append(errs, fmt.Errorf("name %q: want 1-20 characters [a-z0-9-], starting with a letter", o.Name))
	}
	for i, n := range o.Sizes {
		if n < 1 || n > MaxSimNodes {
			errs = append(errs, fmt.Errorf("sizes[%d]: %d out of range 1-%d (the simulated nodes' subnet %s)", i, n, MaxSimNodes, simSubnet))
		}
		if i > 0 && n <= o.Sizes[i-1] {
			errs = append(errs, fmt.Errorf("sizes[%d]: %d not above %d: sizes grow", i, n, o.Sizes[i-1]))
		}
	}
	if o.Zones < 0 || o.Zones > maxSimZones {
		errs = append(errs, fmt.Errorf("zones: %d out of range 0-%d (0: no zones)", o.Zones, maxSimZones))
	}
	if o.RealNodes < 1 || o.RouteReflectors < 1 || o.RealNodes+o.reflectors() > maxSimRealAgents {
		per := ""
		if o.Zones > 0 {
			per = fmt.Sprintf(" per zone × %d zones = %d reflectors", o.Zones, o.reflectors())
		}
		errs = append(errs, fmt.Errorf("real nodes %d, route reflectors %d%s: want at least 1 of each, %d real agents together at most",
			o.RealNodes, o.RouteReflectors, per, maxSimRealAgents))
	}
	switch {
	case o.ReflectorPeering == "":
	case o.ReflectorPeering != api.ReflectorPeeringNonClient && o.ReflectorPeering != api.ReflectorPeeringClient:
		errs = append(errs, fmt.Errorf("reflector peering %q: want NonClient or Client", o.ReflectorPeering))
	case o.Zones == 0:
		errs = append(errs, fmt.Errorf("reflector peering %s: only with zones (routeReflectorMode Auto)", o.ReflectorPeering))
	}
	if o.Zones > 0 && o.RouteReflectors > 16 {
		errs = append(errs, fmt.Errorf("route reflectors: %d per zone out of range 1-16 (routeReflectorsPerZone)", o.RouteReflectors))
	}
	if o.Zones > 0 && o.RealNodes < o.Zones {
		errs = append(errs, fmt.Errorf("real nodes: %d for %d zones: every zone needs a real client agent (its kernel times the block → route samples of the zone)", o.RealNodes, o.Zones))
	}
	if o.EndpointsPerNode < 1 || o.EndpointsPerNode > 60 {
		errs = append(errs, fmt.Errorf("endpoints per node: %d out of range 1-60 (one /26 block)", o.EndpointsPerNode))
	}
	if o.Policies < 1 || o.Policies > 10000 {
		errs = append(errs, fmt.Errorf("policies: %d out of range 1-10000", o.Policies))
	}
	if o.ChurnRate <= 0 || o.ChurnRate > 1000 || o.ChurnWindow < time.Second || o.IdleWindow < time.Second {
		errs = append(errs, fmt.Errorf("churn rate %g/s (want 0-1000), churn window %s, idle window %s (at least 1s)", o.ChurnRate, o.ChurnWindow, o.IdleWindow))
	}
	if o.ChurnEvents < 2 || o.ChurnEvents > 100000 {
		errs = append(errs, fmt.Errorf("churn events: %d out of range 2-100000", o.ChurnEvents))
	}
	if o.Samples < 1 || o.Samples > 100 {
		errs = append(errs, fmt.Errorf("samples: %d out of range 1-100", o.Samples))
	}
	if len(o.Sizes) > 0 {
		if avail, err := memAvailableMiB(); err == nil {
			errs = append(errs, checkSimMemory(slices.Max(o.Sizes), avail))
		}
	}
	return errors.Join(errs...)
}

// checkSimMemory refuses n simulated nodes when they would not fit
// availMiB, naming the largest count that does.
func checkSimMemory(n int, availMiB int) error {
	need := simFixedMiB + n*simPerNodeMiB
	if need <= availMiB {
		return nil
	}
	fit := max((availMiB-simFixedMiB)/simPerNodeMiB, 0)
	return fmt.Errorf("sizes: %d simulated nodes need about %d MiB (%d MiB for the real lab, %d MiB per simulated node), this host has %d MiB available: at most %d simulated nodes fit",
		n, need, simFixedMiB, simPerNodeMiB, availMiB, fit)
}

// memAvailableMiB is /proc/meminfo's MemAvailable.
func memAvailableMiB() (int, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return kb / 1024, err
		}
	}
	return 0, errors.New("no MemAvailable in /proc/meminfo")
}

// ParseSizes parses "10,100,300".
func ParseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("sizes %q: %w", s, err)
		}
		out = append(out, n)
	}
	return out, nil
}
