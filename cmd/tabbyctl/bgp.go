package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func (a *app) bgpCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bgp",
		Short: "Cluster-wide BGP commands",
	}
	cmd.AddCommand(a.bgpRotateMeshKeyCmd())
	return cmd
}

// bgpRotateMeshKeyCmd replaces the cluster's generated mesh key; every
// agent's view sees it and re-creates its cluster sessions with it
// (docs/bgp.md, "Mesh authentication").
func (a *app) bgpRotateMeshKeyCmd() *cobra.Command {
	var key string
	cmd := &cobra.Command{
		Use:   "rotate-mesh-key",
		Short: "Replace the cluster's BGP mesh key (TCP MD5 of the sessions between nodes)",
		Long: `Replace the cluster's generated BGP mesh key with a new random one (or --key).
Every agent re-creates its sessions with the other nodes once, as the new key
reaches it: each session is down for about the BGP connect-retry time, while
the agents keep the routes they learned over it (docs/bgp.md, "Rotation").
A nodeMeshPassword in the BGPConfiguration, when set, is used instead of the key.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := a.connect(cmd.Context()); err != nil {
				return err
			}
			if _, err := a.store.SetBGPMeshKey(cmd.Context(), key); err != nil {
				return err
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), "mesh key rotated: agents re-create their cluster sessions with it")
			return err
		},
	}
	cmd.Flags().StringVar(&key, "key", "", "the new key (default: 32 random bytes, base64)")
	return cmd
}
