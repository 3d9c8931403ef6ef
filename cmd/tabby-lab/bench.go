package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/lab"
)

func benchCmd(g *globalFlags) *cobra.Command {
	c := &cobra.Command{Use: "bench", Short: "Benchmarks in a lab against a reference measured in the same run"}
	c.AddCommand(benchCNICmd(g))
	return c
}

// benchCNICmd measures CNI ADD and DEL through the tabby plugin against
// ptp + host-local in a lab (docs/benchmarks.md).
func benchCNICmd(g *globalFlags) *cobra.Command {
	var (
		o        lab.CNIBenchOptions
		nodes    int
		useLab   bool
		asJSON   bool
		bin      string
		agentArg []string
	)
	c := &cobra.Command{
		Use:   "cni",
		Short: "CNI ADD+DEL through tabby against ptp + host-local, interleaved on one node of a lab",
		Long: `cni brings up a lab (--nodes nodes, its etcd fsyncing, agents whose pool is
` + lab.CNIBenchPool.String() + `), then on --node adds and deletes --pods pods per run through the
node's tabby plugin and through Debian's ptp + host-local (range ` + lab.CNIBenchRefSubnet.String() + `),
alternating, each call made through libcni from inside the node's namespace
as a runtime there makes it. It prints p50/p90/p99 of ADD and DEL per plugin
and run, the plugin processes' and the agent's share, the ratios and their
medians over the runs, checks that every deleted pod left nothing, and takes
the lab down (also on failure or Ctrl-C). With --use-lab it runs in the lab
--name names instead and leaves it up.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) (err error) {
			o.Log = os.Stderr
			var l *lab.Lab
			if useLab {
				if l, err = lab.Open(g.runDir, g.name, os.Stderr); err != nil {
					return err
				}
			} else {
				self, serr := os.Executable()
				if serr != nil {
					return fmt.Errorf("finding tabby-lab's own path: %w", serr)
				}
				l, err = lab.Up(c.Context(), lab.Options{Name: g.name, RunDir: g.runDir, Nodes: nodes, BinDir: binDir(bin, self), LabBinary: self,
					Log: os.Stderr, AgentArgs: agentArg, IPv4Pool: lab.CNIBenchPool})
				if err != nil {
					return err
				}
				defer func() { err = errors.Join(err, l.Down()) }()
			}
			rep, err := l.BenchCNI(c.Context(), o)
			if rep != nil && len(rep.Runs) > 0 {
				if asJSON {
					enc := json.NewEncoder(os.Stdout)
					enc.SetIndent("", "  ")
					err = errors.Join(err, enc.Encode(rep))
				} else {
					fmt.Print(rep.Table())
				}
			}
			return err
		},
	}
	f := c.Flags()
	f.IntVar(&nodes, "nodes", 2, "nodes of the lab brought up")
	f.BoolVar(&useLab, "use-lab", false, "run in the lab --name names (up already, its pool clear of --ref-subnet) and leave it up")
	f.StringVar(&o.Node, "node", lab.NodeName(1), "node whose namespace the calls are made in")
	f.IntVar(&o.Pods, "pods", 60, "pods each plugin adds and deletes per run")
	f.IntVar(&o.Runs, "runs", 3, "runs")
	f.StringVar(&o.RefDir, "ref-dir", "", "directory with ptp and host-local (default /usr/lib/cni, else /opt/cni/bin)")
	f.TextVar(&o.RefSubnet, "ref-subnet", lab.CNIBenchRefSubnet, "host-local's range, outside every pool of the lab")
	f.BoolVar(&asJSON, "json", false, "print every pod's figures as JSON instead of the table")
	f.StringVar(&bin, "bin-dir", "", "directory with tabby-agent and tabby (default $TABBY_BIN, then this program's directory, else go build)")
	f.StringArrayVar(&agentArg, "agent-arg", nil, "pass this flag to every tabby-agent (repeatable), e.g. --agent-arg=--debug-pprof --agent-arg=127.0.0.1:6060")
	return c
}
