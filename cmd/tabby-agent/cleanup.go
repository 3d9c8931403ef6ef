package main

import (
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/agent"
	"github.com/tabbynet/tabby/agent/cleanup"
	"github.com/tabbynet/tabby/agent/installcni"
	"github.com/tabbynet/tabby/internal/cmdutil"
)

// newCleanupCmd is `tabby-agent cleanup`: the node side of uninstalling
// Tabby (see manifests/tabby-uninstall.yaml and package cleanup).
func newCleanupCmd() *cobra.Command {
	def := agent.Default()
	cfg := cleanup.Config{CNI: installcni.Default(), StateDir: def.StateDir, CNISocket: def.CNISocket}
	var env cmdutil.Env
	var logLevel *slog.Level
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove everything Tabby installed on this node (after the agent stopped for good)",
		Long: "cleanup removes Tabby's routes (proto 80 and 81), its iptables chains, jumps and ipsets (both\n" +
			"backends), the CNI configuration list and the tabby binary, and the agent's state directory.\n" +
			"With --remove-workloads it also deletes the cali… interfaces of pods, which lose their network.\n" +
			"net.ipv4.ip_forward stays on unless --reset-sysctls. It refuses to run while an agent answers on\n" +
			"its CNI socket (--force overrides). Running it again removes nothing more.",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := env.Err(cmd.Flags()); err != nil {
				return err
			}
			log := cmdutil.NewLogger(os.Stderr, *logLevel)
			rep, err := cleanup.Cleanup(cmd.Context(), cfg, log)
			if rep != nil {
				log.Info("cleanup done", "routes", len(rep.Routes), "links", len(rep.Links), "files", len(rep.Files), "firewall", rep.Firewall)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.NetNS, "netns", "", "network namespace path of the node (default: this process's)")
	f.StringVar(&cfg.CNI.BinDir, "cni-bin-dir", cfg.CNI.BinDir, "the host's CNI plugin directory, as mounted")
	f.StringVar(&cfg.CNI.ConfDir, "cni-conf-dir", cfg.CNI.ConfDir, "the host's CNI configuration directory, as mounted")
	f.StringVar(&cfg.CNI.ConflistName, "conflist-name", cfg.CNI.ConflistName, "file name of the configuration list (env CNI_CONF_NAME)")
	f.BoolVar(&cfg.SkipCNI, "skip-cni", false, "leave the CNI configuration and binary")
	f.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "the agent's state directory to remove (\"\" = keep)")
	f.StringVar(&cfg.CNISocket, "cni-socket", cfg.CNISocket, "the agent's CNI socket: refuse while an agent answers there")
	f.BoolVar(&cfg.Force, "force", false, "run even while an agent answers on its CNI socket")
	f.BoolVar(&cfg.RemoveWorkloads, "remove-workloads", false, "also delete pods' cali… interfaces (running pods lose their network)")
	f.BoolVar(&cfg.ResetSysctls, "reset-sysctls", false, "also set net.ipv4.ip_forward=0 (only if the node had it off before Tabby)")
	logLevel = cmdutil.LogLevel(f, "debug, info, warn or error (env TABBY_LOG_LEVEL)")
	env.Apply(f, map[string]string{"conflist-name": "CNI_CONF_NAME", "log-level": "TABBY_LOG_LEVEL"})
	return cmd
}
