package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/ctl"
)

func (a *app) flowsCmd() *cobra.Command {
	var (
		f        api.FlowFilter
		since    string
		agents   []string
		port     uint16
		follow   bool
		output   string
		interval time.Duration
	)
	cmd := &cobra.Command{
		Use:   "flows",
		Short: "Show the flows every node's agent logged, with the policy rule that allowed or denied each",
		Long: `Show flow logs (docs/flows.md): each node's agent records the flows its policy
rules denied (--flow-logs deny) or also allowed (--flow-logs all), with the
policy and rule that decided. tabbyctl asks every node's agent and merges.`,
		Example: `  tabbyctl flows --action deny --since 10m
  tabbyctl flows --namespace prod --policy prod/web-ingress -o json
  tabbyctl flows --pod prod/web --follow
  tabbyctl flows --agent node-1=unix:///var/run/tabby/status.sock`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "" && output != "json" && output != "table" {
				return fmt.Errorf("--output %q: want table or json", output)
			}
			if since != "" {
				t, err := parseSince(since, time.Now())
				if err != nil {
					return err
				}
				f.Since = t
			}
			if err := f.Validate(); err != nil {
				return fmt.Errorf("invalid filter:\n%w", err)
			}
			if interval <= 0 {
				return errors.New("--interval must be positive")
			}
			eps, err := a.flowAgents(cmd, agents, port)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if !follow {
				recs, err := ctl.QueryFlows(cmd.Context(), eps, f)
				if werr := ctl.WriteFlows(out, recs, output == "json"); werr != nil {
					return werr
				}
				return err
			}
			return ctl.FollowFlows(cmd.Context(), eps, f, interval,
				func(recs []api.FlowRecord) error { return ctl.WriteFlows(out, recs, output == "json") },
				func(err error) { fmt.Fprintln(cmd.ErrOrStderr(), "warning:", err) })
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.Pod, "pod", "", "flows from or to this pod (namespace/name, or name with --namespace)")
	fl.StringVarP(&f.Namespace, "namespace", "n", "", "flows with a pod of this namespace at either end")
	fl.StringVar(&f.Action, "action", "", "allow or deny")
	fl.StringVar(&f.Policy, "policy", "", "flows this policy decided (name, namespace/name, or (default) for default actions)")
	fl.StringVar(&since, "since", "", "flows that ended at or after this time (RFC 3339) or this long ago (10m)")
	fl.BoolVarP(&follow, "follow", "f", false, "keep printing new flows")
	fl.DurationVar(&interval, "interval", time.Second, "how often --follow asks the agents")
	fl.StringVarP(&output, "output", "o", "table", "table or json (JSON lines)")
	fl.StringArrayVar(&agents, "agent", nil, "an agent to ask, node=unix:///path or node=http://host:port (repeatable; default: every node's published address at --agent-port)")
	fl.Uint16Var(&port, "agent-port", 9099, "port of the agents' HTTP status API, with the default agent list")
	return cmd
}

// parseSince reads an RFC 3339 time or a duration before now.
func parseSince(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("--since %q: want an RFC 3339 time (2006-01-02T15:04:05Z) or a duration like 10m", s)
	}
	return now.Add(-d), nil
}

// flowAgents is the agents given, or every node's.
func (a *app) flowAgents(cmd *cobra.Command, agents []string, port uint16) ([]ctl.AgentEndpoint, error) {
	var eps []ctl.AgentEndpoint
	var errs []error
	for _, s := range agents {
		ep, err := ctl.ParseAgentEndpoint(s)
		errs = append(errs, err)
		eps = append(eps, ep)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if len(eps) > 0 {
		return eps, nil
	}
	c, err := a.connect(cmd.Context())
	if err != nil {
		return nil, err
	}
	eps, err = c.AgentEndpoints(cmd.Context(), port)
	if err == nil && len(eps) == 0 {
		err = errors.New("no node publishes a status: give --agent")
	}
	return eps, err
}
