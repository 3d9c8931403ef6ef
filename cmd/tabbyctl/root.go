package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/ctl"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/cmdutil"
	"github.com/tabbynet/tabby/internal/version"
)

// app holds what the commands share: the configuration flags, the
// environment and, once a command needs it, the datastore connection.
type app struct {
	getenv   func(string) string
	hostname func() (string, error)
	now      func() time.Time
	stdin    io.Reader
	// runner runs ip and friends for explain --live.
	runner ctl.Runner
	// version is what `tabbyctl version` prints.
	version string

	endpoints, caFile, certFile, keyFile string
	configFile                           string
	// defaultConfig is read when --config is not given and it exists.
	defaultConfig string
	timeout       time.Duration

	store  *datastore.Store
	client *ctl.Client
}

func newApp() *app {
	return &app{
		getenv:   os.Getenv,
		hostname: os.Hostname,
		now:      time.Now,
		stdin:    os.Stdin,
		runner:   ctl.ExecRunner{},
		version:  version.String(),

		defaultConfig: ctl.DefaultConfig,
	}
}

// connect returns the client, connecting on first use: commands that do not
// need etcd (validate, version, completion) never connect.
func (a *app) connect(ctx context.Context) (*ctl.Client, error) {
	if a.client != nil {
		return a.client, nil
	}
	src := ctl.ConfigSources{
		Flags:  ctl.Config{Endpoints: cmdutil.SplitList(a.endpoints), CAFile: a.caFile, CertFile: a.certFile, KeyFile: a.keyFile},
		Getenv: a.getenv,
		File:   a.configFile,

		DefaultFile: a.defaultConfig,
	}
	cfg, err := src.Resolve()
	if err != nil {
		return nil, err
	}
	cfg.DialTimeout, cfg.RequestTimeout = a.timeout, a.timeout
	s, err := ctl.Connect(ctx, cfg)
	if err != nil {
		return nil, err
	}
	a.store = s
	a.client = ctl.NewClient(s, a.now)
	return a.client, nil
}

func (a *app) close() error {
	if a.store == nil {
		return nil
	}
	err := a.store.Close()
	a.store, a.client = nil, nil
	return err
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "tabbyctl",
		Short: "Inspect and configure a Tabby cluster",
		Long: `tabbyctl reads and writes Tabby's resources in etcd, reports IPAM usage and
problems, shows the BGP sessions each agent publishes, and explains a pod's path.

etcd is found through --etcd-endpoints (and the TLS flags), else the environment
(` + ctl.EnvEndpoints + `, ` + ctl.EnvCAFile + `, ` + ctl.EnvCertFile + `, ` + ctl.EnvKeyFile + `),
else the config file (--config, default ` + ctl.DefaultConfig + ` if present; YAML
with the flags' names as keys), else ` + ctl.DefaultEndpoint + `.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.endpoints, "etcd-endpoints", "", "etcd endpoints, comma separated (env "+ctl.EnvEndpoints+")")
	pf.StringVar(&a.caFile, "etcd-ca-file", "", "CA certificate that signed etcd's (env "+ctl.EnvCAFile+")")
	pf.StringVar(&a.certFile, "etcd-cert-file", "", "client certificate for etcd (env "+ctl.EnvCertFile+")")
	pf.StringVar(&a.keyFile, "etcd-key-file", "", "client key for etcd (env "+ctl.EnvKeyFile+")")
	pf.StringVar(&a.configFile, "config", "", "config file (default "+ctl.DefaultConfig+" if it exists)")
	pf.DurationVar(&a.timeout, "timeout", ctl.DefaultTimeout, "timeout of connecting to etcd and of each request")

	root.AddCommand(
		a.getCmd(), a.applyCmd(), a.createCmd(), a.deleteCmd(), a.labelCmd(), a.validateCmd(), a.ipamCmd(), a.nodeCmd(), a.explainCmd(), a.bgpCmd(), a.flowsCmd(), a.uiCmd(),
		&cobra.Command{
			Use:   "version",
			Short: "Print the version",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, args []string) error {
				_, err := fmt.Fprintln(cmd.OutOrStdout(), "tabbyctl", a.version)
				return err
			},
		},
	)
	return root
}

// kindArgs completes kind names.
func kindArgs(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, k := range api.Kinds() {
		if strings.HasPrefix(k.Plural, toComplete) {
			out = append(out, k.Plural)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

func kindsHelp() string { return "Kinds (with short names): " + ctl.KnownKinds() + "." }
