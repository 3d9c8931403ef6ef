package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/agent/installcni"
	"github.com/tabbynet/tabby/internal/cmdutil"
)

// newInstallCNICmd is `tabby-agent install-cni`, the DaemonSet's init
// container: it installs the tabby shim and the network configuration list
// on the node (or removes them with --uninstall) and exits.
func newInstallCNICmd() *cobra.Command {
	cfg := installcni.Default()
	cfg.Template = ""
	var uninstall bool
	var env cmdutil.Env
	var logLevel *slog.Level

	cmd := &cobra.Command{
		Use:   "install-cni",
		Short: "Install the tabby CNI plugin and network configuration on this node (Kubernetes init container)",
		Long: "install-cni copies the tabby binary into the host's CNI bin directory, copies chained\n" +
			"plugins (portmap) the host lacks, and writes the network configuration list rendered from\n" +
			"the template (env CNI_NETWORK_CONFIG; placeholders " + installcni.PlaceholderMTU + " and " + installcni.PlaceholderAgentSocket + ").\n" +
			"Files are replaced atomically and only when they differ. With --uninstall it removes the\n" +
			"tabby binary and the configuration list.",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := env.Err(cmd.Flags()); err != nil {
				return err
			}
			log := cmdutil.NewLogger(os.Stderr, *logLevel)
			if uninstall {
				rep, err := installcni.Uninstall(cfg)
				logReport(log, rep)
				return err
			}
			if cfg.SourceBinary == "" {
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("finding the tabby binary (set --source-binary): %w", err)
				}
				cfg.SourceBinary = filepath.Join(filepath.Dir(exe), installcni.PluginName)
			}
			rep, err := installcni.Install(cfg)
			logReport(log, rep)
			return err
		},
	}
	f := cmd.Flags()
	cfg.AddFlags(f)
	f.BoolVar(&uninstall, "uninstall", false, "remove the tabby binary and the configuration list instead")
	logLevel = cmdutil.LogLevel(f, "debug, info, warn or error (env TABBY_LOG_LEVEL)")
	env.Apply(f, map[string]string{
		"cni-network-config": "CNI_NETWORK_CONFIG",
		"conflist-name":      "CNI_CONF_NAME",
		"mtu":                "CNI_MTU",
		"log-level":          "TABBY_LOG_LEVEL",
	})
	return cmd
}

func logReport(log *slog.Logger, rep *installcni.Report) {
	if rep == nil {
		return
	}
	for _, p := range rep.Written {
		log.Info("installed", "path", p)
	}
	for _, p := range rep.Unchanged {
		log.Info("unchanged", "path", p)
	}
	for _, p := range rep.Removed {
		log.Info("removed", "path", p)
	}
	for _, p := range rep.Shadowed {
		log.Warn("configuration sorts before ours: the runtime uses it instead of tabby until it is removed", "path", p)
	}
}
