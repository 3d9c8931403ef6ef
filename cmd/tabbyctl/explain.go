package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/ctl"
)

func (a *app) explainCmd() *cobra.Command {
	var o ctl.ExplainOptions
	var pf packetFlags
	cmd := &cobra.Command{
		Use:   "explain (pod (NAMESPACE/NAME | NAME | IP) | packet --from FROM --to TO --port PORT/PROTO)",
		Short: "Tell a pod's path, or what the rules do to a packet (what-if)",
		Long: `Explain how packets reach a pod, from the datastore: its workload endpoint
(address, host veth, node), the node's /32 route, the block and the node that owns
it, whether the address is borrowed, the BGP sessions that carry it (from the
node's published status), the route every other node should have, and the
policies that select the pod.

With --live, run on a node (or with --netns PATH), it also reads the kernel's
routes and says where they disagree with the datastore (non-zero exit).
With explain packet --live, the source pod's agent sends one probe (TCP or
UDP, to a cluster address only, rate-limited) and the deciding rules' kernel
counters on each node say whether the kernel agrees with the what-if.

explain packet asks the agents of the nodes a packet crosses (the source
pod's node for its egress, the destination's for its ingress) to evaluate
the rules they applied, and prints each node's verdict, the rule that
decided, every chain and rule on the way, and the route (docs/explain.md).
The agents are reached at --agent: by default this node's status socket;
on a lab, unix:///run/tabby-lab/NAME/{node}/status.sock.`,
		Example: `  tabbyctl explain pod shop/web-0
  tabbyctl explain pod 10.244.0.48
  tabbyctl explain pod shop/web-0 --live --netns /run/netns/node-2
  tabbyctl explain packet --from pod/shop/client --to pod/shop/web-0 --port 80/tcp
  tabbyctl explain packet --live --from pod/shop/client --to pod/shop/web-0 --port 80/tcp
  tabbyctl explain packet --from 198.51.100.7 --to svc/shop/web --port 8080/tcp -o json`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] == "packet" {
				if len(args) != 1 || pf.o.From == "" || pf.o.To == "" || pf.o.Port == "" {
					return fmt.Errorf("explain packet: want --from, --to and --port, and no argument")
				}
				pf.o.Live = o.Live // one --live flag: the probe and counters for a packet
				return a.explainPacket(cmd, &pf)
			}
			if len(args) != 2 {
				return fmt.Errorf("explain %s: want one argument", args[0])
			}
			switch args[0] {
			case "pod", "pods", "po":
			default:
				return fmt.Errorf("explain: %q: only pods and packets can be explained (tabbyctl explain pod NAMESPACE/NAME, tabbyctl explain packet)", args[0])
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
	cmd.Flags().BoolVar(&o.Live, "live", false, "explain pod: compare with this node's kernel routes; explain packet: also send one probe from the source pod "+
		"(TCP connect or UDP datagram, to a cluster address only) and check the deciding rules' kernel counters moved")
	cmd.Flags().StringVar(&o.NetNS, "netns", "", "with --live: the node's network namespace (path); implies --live")
	cmd.Flags().StringVar(&o.Node, "node", "", "with --live: the node this runs on (default: found by its addresses)")
	pf.add(cmd)
	return cmd
}
