package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/ctl"
)

func (a *app) nodeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Node commands",
	}
	cmd.AddCommand(a.nodeStatusCmd())
	return cmd
}

func (a *app) nodeStatusCmd() *cobra.Command {
	var o ctl.NodeStatusOptions
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show a node's BGP sessions, as its agent publishes them in etcd",
		Example: `  tabbyctl node status               # this host's node (by hostname)
  tabbyctl node status --node node-2
  tabbyctl node status --all`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.All && o.Node != "" {
				return errors.New("give --node or --all, not both")
			}
			if !o.All && o.Node == "" {
				h, err := a.hostname()
				if err != nil {
					return fmt.Errorf("finding this node's name (give --node): %w", err)
				}
				o.Node = h
			}
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			return c.NodeStatus(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	cmd.Flags().StringVar(&o.Node, "node", "", "node to show (default: this host's name)")
	cmd.Flags().BoolVar(&o.All, "all", false, "show every node's sessions")
	return cmd
}
