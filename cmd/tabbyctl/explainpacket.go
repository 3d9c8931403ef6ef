package main

import (
	"encoding/json"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/ctl"
)

// packetFlags are explain packet's flags.
type packetFlags struct {
	o      ctl.PacketOptions
	agent  string
	output string
}

func (f *packetFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.o.From, "from", "", "explain packet: the source, pod/NAMESPACE/NAME or an address")
	cmd.Flags().StringVar(&f.o.To, "to", "", "explain packet: the destination, pod/NAMESPACE/NAME, svc/NAMESPACE/NAME or an address")
	cmd.Flags().StringVar(&f.o.Port, "port", "", "explain packet: PORT/PROTO (80/tcp, 53/udp) or icmp")
	cmd.Flags().IntVar(&f.o.Family, "family", 0, "explain packet: 4 or 6 for pods of both families (default: IPv4 when both ends have it)")
	cmd.Flags().StringVar(&f.agent, "agent", ctl.DefaultAgentAddress,
		"explain packet: the agents' status API, unix:///PATH or http://HOST:PORT; {node} is a node's name, {addr} its address")
	cmd.Flags().StringVarP(&f.output, "output", "o", "", "explain packet: \"json\" for the explanation as JSON")
}

func (a *app) explainPacket(cmd *cobra.Command, f *packetFlags) error {
	c, err := a.connect(cmd.Context())
	if err != nil {
		return err
	}
	f.o.Agents = agentsOf(c, f.agent)
	xs, err := c.ExplainPacket(cmd.Context(), f.o)
	if err != nil {
		return err
	}
	if f.output == "json" {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		return enc.Encode(xs)
	}
	return ctl.WritePacketExplanations(cmd.OutOrStdout(), xs)
}

// agentsOf reaches the agents at template, with the nodes' addresses from
// the datastore for {addr}.
func agentsOf(c *ctl.Client, template string) ctl.Agents {
	return ctl.AgentTemplate{Template: template, Addr: c.NodeAddr}
}
