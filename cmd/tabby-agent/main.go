// Command tabby-agent is Tabby's per-node agent (run as a DaemonSet).
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/agent"
	"github.com/tabbynet/tabby/internal/cmdutil"
	"github.com/tabbynet/tabby/internal/version"
)

func main() {
	cmdutil.Main("tabby-agent", func(ctx context.Context) error { return newRootCmd().ExecuteContext(ctx) })
}

// agentEnv names the environment variable of each flag (Calico's names
// where Calico has one).
var agentEnv = map[string]string{
	"node-name":                "NODENAME",
	"node-ip":                  "IP",
	"node-ip6":                 "IP6",
	"ip-autodetection-method":  "IP_AUTODETECTION_METHOD",
	"ip6-autodetection-method": "IP6_AUTODETECTION_METHOD",
	"router-id":                "TABBY_ROUTER_ID",
	"default-ipv4-pool":        "TABBY_IPV4POOL_CIDR",
	"default-ipv6-pool":        "TABBY_IPV6POOL_CIDR",
	"etcd-endpoints":           "TABBY_ETCD_ENDPOINTS",
	"watch-endpoints":          "TABBY_WATCH_ENDPOINTS",
	"etcd-ca-file":             "TABBY_ETCD_CA_FILE",
	"etcd-cert-file":           "TABBY_ETCD_CERT_FILE",
	"etcd-key-file":            "TABBY_ETCD_KEY_FILE",
	"endpoint-to-host-action":  "TABBY_ENDPOINT_TO_HOST_ACTION",
	"firewall-backend":         "TABBY_FIREWALL_BACKEND",
	"flow-logs":                "TABBY_FLOW_LOGS",
	"node-gc-grace":            "TABBY_NODE_GC_GRACE",
	"max-procs":                "TABBY_MAX_PROCS",
	"log-level":                "TABBY_LOG_LEVEL",
}

func newRootCmd() *cobra.Command {
	cfg := agent.Default()
	var env cmdutil.Env
	var logLevel *slog.Level
	var maxProcs int
	cmd := &cobra.Command{
		Use:           "tabby-agent",
		Short:         "Tabby's per-node agent: pod networking, routes and BGP",
		Version:       version.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := env.Err(cmd.Flags()); err != nil {
				return err
			}
			log := cmdutil.NewLogger(os.Stderr, *logLevel)
			if err := setMaxProcs(log, maxProcs); err != nil {
				return err
			}
			setGCPercent(log, os.LookupEnv)
			setMemoryLimit(log)
			return agent.Run(cmd.Context(), cfg, log)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.NodeName, "node-name", cfg.NodeName, "this node's name (env NODENAME; default: hostname)")
	f.Var(agent.NodeIPFlag{Cfg: &cfg}, "node-ip", "this node's IPv4 address as a CIDR, autodetect, or none for an IPv6-only node (env IP)")
	f.Var(agent.NodeIPFlag{Cfg: &cfg, V6: true}, "node-ip6", "this node's IPv6 underlay address as a CIDR, the next hop of its IPv6 pod routes, autodetect, or none (env IP6)")
	f.TextVar(&cfg.AutodetectMethod6, "ip6-autodetection-method", cfg.AutodetectMethod6, "how --node-ip6 autodetect finds the address: first-found, interface=RE, skip-interface=RE, can-reach=ADDR6 or cidr=CIDR6 (env IP6_AUTODETECTION_METHOD)")
	f.TextVar(&cfg.RouterID, "router-id", cfg.RouterID, "BGP router ID, dotted IPv4 (env TABBY_ROUTER_ID; default: the IPv4 address, or on an IPv6-only node the Node's spec.bgp.routerID or one derived from the node name)")
	f.TextVar(&cfg.DefaultPoolCIDR6, "default-ipv6-pool", cfg.DefaultPoolCIDR6, "create this IPv6 pool when no IPv6 pool exists (env TABBY_IPV6POOL_CIDR)")
	f.TextVar(&cfg.AutodetectMethod, "ip-autodetection-method", cfg.AutodetectMethod, "first-found, interface=RE, skip-interface=RE, can-reach=ADDR or cidr=CIDR (env IP_AUTODETECTION_METHOD)")
	f.TextVar((*cmdutil.List)(&cfg.Etcd.Endpoints), "etcd-endpoints", cmdutil.List(cfg.Etcd.Endpoints), "etcd endpoints, comma separated (env TABBY_ETCD_ENDPOINTS)")
	f.TextVar((*cmdutil.List)(&cfg.Etcd.WatchEndpoints), "watch-endpoints", cmdutil.List(cfg.Etcd.WatchEndpoints), "watch relay (tabby-relay) endpoints, comma separated: the view's watch runs there, in batches, with the etcd TLS files; the rest stays on etcd (env TABBY_WATCH_ENDPOINTS; default: none, watch etcd)")
	f.StringVar(&cfg.Etcd.CAFile, "etcd-ca-file", cfg.Etcd.CAFile, "CA bundle for etcd TLS (env TABBY_ETCD_CA_FILE)")
	f.StringVar(&cfg.Etcd.CertFile, "etcd-cert-file", cfg.Etcd.CertFile, "client certificate for etcd mTLS (env TABBY_ETCD_CERT_FILE)")
	f.StringVar(&cfg.Etcd.KeyFile, "etcd-key-file", cfg.Etcd.KeyFile, "client key for etcd mTLS (env TABBY_ETCD_KEY_FILE)")
	f.StringVar(&cfg.CNISocket, "cni-socket", cfg.CNISocket, "unix socket the CNI plugin talks to")
	f.StringVar(&cfg.StatusSocket, "status-socket", cfg.StatusSocket, "unix socket of the status API (HTTP: /status, /healthz, /readyz, /metrics)")
	f.TextVar(&cfg.HTTPListen, "http-listen", cfg.HTTPListen, "address:port of the HTTP health and metrics endpoints (\"\" = off)")
	f.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "directory for the agent's state")
	f.TextVar(&cfg.GoBGPAPI, "gobgp-api", cfg.GoBGPAPI, "expose GoBGP's gRPC API on this loopback address:port for the gobgp CLI (\"\" = off)")
	f.TextVar(&cfg.DebugPprof, "debug-pprof", cfg.DebugPprof, "serve Go's pprof profiles (/debug/pprof/) on this loopback address:port, for profiling (\"\" = off)")
	f.TextVar(&cfg.DefaultPoolCIDR, "default-ipv4-pool", cfg.DefaultPoolCIDR, "create this IPv4 pool when no pool exists (env TABBY_IPV4POOL_CIDR)")
	f.TextVar(&cfg.EndpointToHostAction, "endpoint-to-host-action", cfg.EndpointToHostAction, "what pod traffic to this node meets after the pod's egress policy: Drop, Accept or Return (to the node's own INPUT rules); etcd and the GoBGP API stay unreachable (env TABBY_ENDPOINT_TO_HOST_ACTION)")
	f.TextVar(&cfg.FirewallBackend, "firewall-backend", cfg.FirewallBackend, "auto (nftables where the kernel has it), nftables or iptables (env TABBY_FIREWALL_BACKEND)")
	f.DurationVar(&cfg.ResyncInterval, "resync-interval", cfg.ResyncInterval, "period of full reconcile passes")
	f.DurationVar(&cfg.NodeGCGrace, "node-gc-grace", cfg.NodeGCGrace, "how long a node must be gone (no Node record, no liveness record) before its endpoints, addresses and blocks are released (1s to 24h; env TABBY_NODE_GC_GRACE)")
	f.Var(&cfg.FlowLog.Mode, "flow-logs", "flow logs: off, deny (denied flows, NFLOG) or all (also allowed flows, conntrack events) (env TABBY_FLOW_LOGS)")
	f.Uint16Var(&cfg.FlowLog.Group, "flow-log-group", cfg.FlowLog.Group, "NFLOG group of the flow logs")
	f.DurationVar(&cfg.FlowLog.Interval, "flow-log-interval", cfg.FlowLog.Interval, "flow log aggregation interval (100ms to 1m)")
	f.IntVar(&cfg.FlowLog.MaxFlows, "flow-log-max-flows", cfg.FlowLog.MaxFlows, "flows tracked at once; new flows beyond are counted as dropped")
	f.IntVar(&cfg.FlowLog.MaxRecords, "flow-log-max-records", cfg.FlowLog.MaxRecords, "flow records kept for GET /flows; the oldest are evicted")
	f.IntVar(&maxProcs, "max-procs", 0, "how many threads run Go code at once (GOMAXPROCS); 0: the runtime's choice (the GOMAXPROCS variable, else the container's CPU limit, else the CPUs); 1 costs a quiet agent less per watch event and shares one thread among its passes (env TABBY_MAX_PROCS; docs/scale.md)")
	logLevel = cmdutil.LogLevel(f, "debug, info, warn or error (env TABBY_LOG_LEVEL)")
	env.Apply(f, agentEnv)
	cmd.AddCommand(newInstallCNICmd(), newCleanupCmd())
	return cmd
}
