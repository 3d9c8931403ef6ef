package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/ctl"
	"github.com/tabbynet/tabby/ipam"
)

func (a *app) ipamCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ipam",
		Short: "Show, check and repair IP address management",
	}
	cmd.AddCommand(a.ipamShowCmd(), a.ipamCheckCmd(), a.ipamReleaseCmd())
	return cmd
}

func (a *app) ipamShowCmd() *cobra.Command {
	var o ctl.IPAMShowOptions
	cmd := &cobra.Command{
		Use:   "show",
		Short: "Show address usage per pool, per block, borrowed addresses, or who holds an address",
		Example: `  tabbyctl ipam show
  tabbyctl ipam show --show-blocks --show-borrowed
  tabbyctl ipam show --ip 10.244.0.5`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			return c.IPAMShow(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	cmd.Flags().BoolVar(&o.ShowBlocks, "show-blocks", false, "show every block with its affinity")
	cmd.Flags().BoolVar(&o.ShowBorrowed, "show-borrowed", false, "list addresses borrowed from other nodes' blocks")
	cmd.Flags().StringVar(&o.IP, "ip", "", "say who holds this address")
	return cmd
}

func (a *app) ipamCheckCmd() *cobra.Command {
	var o ctl.IPAMCheckOptions
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Find leaked addresses, orphan handles and inconsistent IPAM records",
		Long: `Cross-check IPAM's blocks, affinities and handles with the workload endpoints.
Exits non-zero when anything is wrong. With -o, writes a JSON report that
'tabbyctl ipam release --from-report' can act on.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			return c.IPAMCheck(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	cmd.Flags().StringVarP(&o.Output, "output", "o", "", "write the report as JSON to this file")
	cmd.Flags().DurationVar(&o.LeakGrace, "leak-grace", ipam.DefaultLeakGrace, "allocations younger than this are not leaks yet")
	return cmd
}

func (a *app) ipamReleaseCmd() *cobra.Command {
	var o ctl.IPAMReleaseOptions
	var grace time.Duration
	cmd := &cobra.Command{
		Use:   "release (--ip ADDR... --handle HANDLE | --ip ADDR... --force | --from-report FILE)",
		Short: "Release addresses",
		Long: `Release the named addresses if the named handle still holds them (checked in the
release's own transaction; refused while a workload endpoint uses one), or with
--force whoever holds them, endpoint or not; or release the leaks of an
'ipam check -o' report that a fresh check still finds leaked under the same handle.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("leak-grace") {
				o.LeakGrace = &grace
			}
			return c.IPAMRelease(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	cmd.Flags().StringSliceVar(&o.IPs, "ip", nil, "address to release; repeatable or comma separated")
	cmd.Flags().StringVar(&o.Handle, "handle", "", "the handle that must hold the addresses ('ipam show --ip' prints it)")
	cmd.Flags().BoolVar(&o.Force, "force", false, "release whoever holds the address, even while a workload endpoint uses it")
	cmd.Flags().StringVar(&o.FromReport, "from-report", "", "release the leaks of this ipam check report")
	cmd.Flags().DurationVar(&grace, "leak-grace", 0, "grace of the fresh check --from-report compares with (default: the report's)")
	return cmd
}
