// Command tabby-agent is Tabby's per-node agent (run as a DaemonSet).
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/agent"
	"github.com/tabbynet/tabby/internal/version"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "tabby-agent:", err)
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func newRootCmd() *cobra.Command {
	cfg := agent.Default()
	cfg.NodeName = env("NODENAME", cfg.NodeName)
	cfg.NodeIP = env("IP", "")
	cfg.AutodetectMethod = env("IP_AUTODETECTION_METHOD", cfg.AutodetectMethod)
	cfg.DefaultPoolCIDR = env("TABBY_IPV4POOL_CIDR", "")
	cfg.NodeIP6 = env("IP6", "")
	cfg.DefaultPoolCIDR6 = env("TABBY_IPV6POOL_CIDR", "")
	endpoints := env("TABBY_ETCD_ENDPOINTS", strings.Join(cfg.Etcd.Endpoints, ","))
	cfg.Etcd.CAFile = env("TABBY_ETCD_CA_FILE", "")
	cfg.Etcd.CertFile = env("TABBY_ETCD_CERT_FILE", "")
	cfg.Etcd.KeyFile = env("TABBY_ETCD_KEY_FILE", "")
	logLevel := env("TABBY_LOG_LEVEL", "info")
	var envErr error
	if v := env("TABBY_NODE_GC_GRACE", ""); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			envErr = fmt.Errorf("TABBY_NODE_GC_GRACE: %w", err)
		}
		cfg.NodeGCGrace = d
	}

	cmd := &cobra.Command{
		Use:           "tabby-agent",
		Short:         "Tabby's per-node agent: pod networking, routes and BGP",
		Version:       version.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if envErr != nil && !cmd.Flags().Changed("node-gc-grace") {
				return envErr
			}
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
			cfg.Etcd.Endpoints = splitList(endpoints)
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return agent.Run(ctx, cfg, log)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.NodeName, "node-name", cfg.NodeName, "this node's name (env NODENAME; default: hostname)")
	f.StringVar(&cfg.NodeIP, "node-ip", cfg.NodeIP, "this node's IPv4 address as a CIDR (env IP; default: autodetect)")
	f.StringVar(&cfg.NodeIP6, "node-ip6", cfg.NodeIP6, "this node's IPv6 underlay address as a CIDR, the next hop of its IPv6 pod routes (env IP6; default: none)")
	f.StringVar(&cfg.DefaultPoolCIDR6, "default-ipv6-pool", cfg.DefaultPoolCIDR6, "create this IPv6 pool when no IPv6 pool exists (env TABBY_IPV6POOL_CIDR)")
	f.StringVar(&cfg.AutodetectMethod, "ip-autodetection-method", cfg.AutodetectMethod, "first-found, interface=RE, skip-interface=RE, can-reach=ADDR or cidr=CIDR (env IP_AUTODETECTION_METHOD)")
	f.StringVar(&endpoints, "etcd-endpoints", endpoints, "etcd endpoints, comma separated (env TABBY_ETCD_ENDPOINTS)")
	f.StringVar(&cfg.Etcd.CAFile, "etcd-ca-file", cfg.Etcd.CAFile, "CA bundle for etcd TLS (env TABBY_ETCD_CA_FILE)")
	f.StringVar(&cfg.Etcd.CertFile, "etcd-cert-file", cfg.Etcd.CertFile, "client certificate for etcd mTLS (env TABBY_ETCD_CERT_FILE)")
	f.StringVar(&cfg.Etcd.KeyFile, "etcd-key-file", cfg.Etcd.KeyFile, "client key for etcd mTLS (env TABBY_ETCD_KEY_FILE)")
	f.StringVar(&cfg.CNISocket, "cni-socket", cfg.CNISocket, "unix socket the CNI plugin talks to")
	f.StringVar(&cfg.StatusSocket, "status-socket", cfg.StatusSocket, "unix socket of the status API (HTTP: /status, /healthz, /readyz, /metrics)")
	f.StringVar(&cfg.HTTPListen, "http-listen", cfg.HTTPListen, "address of the HTTP health and metrics endpoints (\"\" = off)")
	f.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "directory for the agent's state")
	f.StringVar(&cfg.GoBGPAPI, "gobgp-api", cfg.GoBGPAPI, "expose GoBGP's gRPC API on this loopback address:port for the gobgp CLI (\"\" = off)")
	f.StringVar(&cfg.DefaultPoolCIDR, "default-ipv4-pool", cfg.DefaultPoolCIDR, "create this IPv4 pool when no pool exists (env TABBY_IPV4POOL_CIDR)")
	f.StringVar(&cfg.EndpointToHostAction, "endpoint-to-host-action", env("TABBY_ENDPOINT_TO_HOST_ACTION", cfg.EndpointToHostAction), "what pod traffic to this node meets after the pod's egress policy: Drop, Accept or Return (to the node's own INPUT rules); etcd and the GoBGP API stay unreachable (env TABBY_ENDPOINT_TO_HOST_ACTION)")
	f.StringVar(&cfg.FirewallBackend, "firewall-backend", env("TABBY_FIREWALL_BACKEND", cfg.FirewallBackend), "auto (nftables where the kernel has it), nftables or iptables (env TABBY_FIREWALL_BACKEND)")
	f.DurationVar(&cfg.ResyncInterval, "resync-interval", cfg.ResyncInterval, "period of full reconcile passes")
	f.DurationVar(&cfg.NodeGCGrace, "node-gc-grace", cfg.NodeGCGrace, "how long a node must be gone (no Node record, no liveness record) before its endpoints, addresses and blocks are released (1s to 24h; env TABBY_NODE_GC_GRACE)")
	f.StringVar(&logLevel, "log-level", logLevel, "debug, info, warn or error (env TABBY_LOG_LEVEL)")
	cmd.AddCommand(newInstallCNICmd(), newCleanupCmd())
	return cmd
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
