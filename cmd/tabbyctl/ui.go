package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/ctl"
)

func (a *app) uiCmd() *cobra.Command {
	var listen, agent string
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the web view (nodes, BGP sessions, pods, flows, what-if) on localhost",
		Long: `Serve a web view on --listen (loopback by default): nodes and their BGP
sessions, pods and their addresses, live flows with allow/deny and the
deciding policy, and a what-if form (explain packet). It needs what tabbyctl
needs (the datastore, and the agents' status API at --agent), and no
Kubernetes API rights. See docs/explain.md.`,
		Example: `  tabbyctl ui --listen 127.0.0.1:9097 --agent 'http://{addr}:9099'`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("--listen %s: %w", listen, err)
			}
			u := &ctl.UI{Client: c, Agents: ctl.AgentTemplate{Template: agent, Addr: c.NodeAddr}}
			srv := &http.Server{Handler: u.Handler(), ReadHeaderTimeout: 5 * time.Second, MaxHeaderBytes: 64 << 10}
			fmt.Fprintf(cmd.OutOrStdout(), "serving the web view on http://%s/\n", ln.Addr())
			errc := make(chan error, 1)
			go func() { errc <- srv.Serve(ln) }()
			select {
			case err := <-errc:
				return err
			case <-cmd.Context().Done():
			}
			sctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), 2*time.Second)
			defer cancel()
			if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:9097", "address:port to serve on")
	cmd.Flags().StringVar(&agent, "agent", "http://{addr}:9099",
		"the agents' status API, unix:///PATH or http://HOST:PORT; {node} is a node's name, {addr} its address")
	return cmd
}
