package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/etcdmain"

	"github.com/tabbynet/tabby/lab"
)

// simCmd runs the scale harness (docs/scale.md).
func simCmd(g *globalFlags) *cobra.Command {
	var (
		o     lab.SimOptions
		sizes string
	)
	c := &cobra.Command{
		Use:   "sim",
		Short: "Scale harness: real agents and reflectors plus N simulated nodes; reports cost against N",
		Long: `sim brings up a lab of real route reflectors and real client agents, then
grows it through --sizes simulated nodes (each a real etcd client writing its
Node, blocks, affinities and endpoints, and a real BGP session to each of its
reflectors) and measures at each size: agent CPU per remote pod event, RSS and
idle CPU; reflector RSS and CPU per client; new block to route in every real
kernel; agent restart to Ready; a one-label policy change to the kernel; etcd
CPU and watchers. With --zones the nodes are spread over zones, each with its
own elected reflectors, as a deployment of that size is. Writes results.md, results.json and scale.png to --out.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			var err error
			if o.Sizes, err = lab.ParseSizes(sizes); err != nil {
				return err
			}
			o.Name, o.RunDir, o.Log = g.name, g.runDir, os.Stderr
			if o.BinDir == "" {
				o.BinDir = os.Getenv("TABBY_BIN")
			}
			res, err := lab.Sim(c.Context(), o)
			if len(res) > 0 {
				fmt.Print(lab.SimTable(res))
			}
			return err
		},
	}
	f := c.Flags()
	f.StringVar(&sizes, "sizes", "10", "simulated node counts, ascending, comma-separated (at most 1000)")
	f.IntVar(&o.RealNodes, "real-nodes", 0, "real agents that are reflector clients (a pod each; default 2, with --zones the larger of 2 and the zones)")
	f.IntVar(&o.RouteReflectors, "route-reflectors", 2, "real agents in route-reflector mode (per zone with --zones)")
	f.IntVar(&o.Zones, "zones", 0, "run the cluster in this many zones: routeReflectorMode Auto, --route-reflectors elected per zone among dedicated real nodes, every node (real or simulated) labelled with a zone and peering with its zone's reflectors (0: no zones, the reflectors serve every node)")
	f.StringVar(&o.ReflectorPeering, "reflector-peering", "", "with --zones: routeReflectorPeering, how the reflectors of different zones peer: NonClient (the default) or Client (Calico's rule: each the other's client)")
	f.IntVar(&o.EndpointsPerNode, "endpoints-per-node", 30, "endpoints on every simulated node")
	f.IntVar(&o.Policies, "policies", 1000, "NetworkPolicies")
	f.IntVar(&o.ChurnEvents, "churn-events", 400, "pod events the churn makes (each measured once every client agent's view has it)")
	f.Float64Var(&o.ChurnRate, "churn", 20, "pod events per second during the churn")
	f.DurationVar(&o.ChurnWindow, "churn-window", 10*time.Minute, "the longest the churn may take (it ends sooner once --churn-events are made)")
	f.DurationVar(&o.IdleWindow, "idle-window", 60*time.Second, "how long each of the rests before and after the churn is measured (at least two of the agents' 30 s resync passes)")
	f.IntVar(&o.Samples, "samples", 10, "latency samples per size")
	f.BoolVar(&o.Watch, "watch", true, "simulated nodes watch the whole prefix during the measurements, as agents do")
	f.BoolVar(&o.EtcdProxy, "etcd-proxy", false, "agents and simulated nodes reach etcd through etcd's gRPC proxy")
	f.BoolVar(&o.Relay, "relay", false, "the real agents' views watch through a watch relay (tabby-relay) in front of etcd")
	f.DurationVar(&o.RelayWindow, "relay-window", 0, "the watch relay's batching window (tabby-relay --batch-window; 0: its default)")
	f.StringArrayVar(&o.ClientAgentArgs, "client-agent-arg", nil, "argument appended to the client agents' command lines only, not the reflectors' (repeat; e.g. --client-agent-arg=--max-procs=1)")
	f.StringArrayVar(&o.AgentArgs, "agent-arg", nil, "argument appended to every real agent's command line (repeat; e.g. --agent-arg=--debug-pprof --agent-arg=127.0.0.1:6060)")
	f.StringVar(&o.Out, "out", "", "directory for results.md, results.json and scale.png")
	f.StringVar(&o.BinDir, "bin-dir", "", "directory with tabby-agent and tabby (default $TABBY_BIN, else go build)")
	return c
}

// etcdProxyCmd runs the etcd project's own `etcd grpc-proxy` (the
// etcdmain of the etcd server release go.mod names) with the arguments
// after "--"; the lab starts it with --etcd-proxy.
func etcdProxyCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "etcd-proxy -- grpc-proxy start [etcd flags]",
		Short:              "Run etcd's gRPC proxy (etcd grpc-proxy start)",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 && args[0] == "--" {
				args = args[1:]
			}
			if len(args) == 0 || args[0] != "grpc-proxy" {
				return fmt.Errorf("etcd-proxy: want grpc-proxy start [flags], got %q", args)
			}
			// etcdmain parses os.Args itself (cobra's default).
			os.Args = append([]string{"etcd"}, args...)
			etcdmain.Main(os.Args)
			return nil
		},
	}
}

// floorWatchCmd runs the sim's bare etcd watcher (lab.RunFloorWatch), the
// reference of the agents' per-event CPU; the sim starts it.
func floorWatchCmd() *cobra.Command {
	var etcd []string
	c := &cobra.Command{
		Use:    "floor-watch --etcd URL...",
		Short:  "Watch what an agent's view watches and only count the events (the sim's reference)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return lab.RunFloorWatch(c.Context(), etcd)
		},
	}
	c.Flags().StringArrayVar(&etcd, "etcd", nil, "etcd client URL (repeat)")
	_ = c.MarkFlagRequired("etcd")
	return c
}
