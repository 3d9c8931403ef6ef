package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/ctl"
)

func (a *app) explainCmd() *cobra.Command {
	var o ctl.ExplainOptions
	cmd := &cobra.Command{
		Use:   "explain pod (NAMESPACE/NAME | NAME | IP)",
		Short: "Tell a pod's path: endpoint, routes, block, BGP, other nodes' routes, policies",
		Long: `Explain how packets reach a pod, from the datastore: its workload endpoint
(address, host veth, node), the node's /32 route, the block and the node that owns
it, whether the address is borrowed, the BGP sessions that carry it (from the
node's published status), the route every other node should have, and the
policies that select the pod.

With --live, run on a node (or with --netns PATH), it also reads the kernel's
routes and says where they disagree with the datastore (non-zero exit).`,
		Example: `  tabbyctl explain pod shop/web-0
  tabbyctl explain pod 10.244.0.48
  tabbyctl explain pod shop/web-0 --live --netns /run/netns/node-2`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch args[0] {
			case "pod", "pods", "po":
			default:
				return fmt.Errorf("explain: %q: only pods can be explained (tabbyctl explain pod NAMESPACE/NAME)", args[0])
			}
			o.Target = args[1]
			if o.NetNS != "" {
				o.Live = true
			}
			o.Runner = a.runner
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			return c.Explain(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	cmd.Flags().StringVarP(&o.Namespace, "namespace", "n", "", "namespace of a pod given by NAME (default \"default\")")
	cmd.Flags().BoolVar(&o.Live, "live", false, "compare with this node's kernel routes")
	cmd.Flags().StringVar(&o.NetNS, "netns", "", "with --live: the node's network namespace (path); implies --live")
	cmd.Flags().StringVar(&o.Node, "node", "", "with --live: the node this runs on (default: found by its addresses)")
	return cmd
}
