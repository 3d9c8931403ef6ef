package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/ctl"
)

func (a *app) uiCmd() *cobra.Command {
	var listen, agent string
	var allowRemote bool
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the web view (nodes, BGP sessions, pods, flows, what-if) on localhost",
		Long: `Serve a web view on --listen (loopback by default): nodes and their BGP
sessions, pods and their addresses, live flows with allow/deny and the
deciding policy, and a what-if form (explain packet). It needs what tabbyctl
needs (the datastore, and the agents' status API at --agent), and no
Kubernetes API rights. The view has no authentication: a --listen address
that is not loopback is refused unless --allow-remote. See docs/ui.md.`,
		Example: `  tabbyctl ui --listen 127.0.0.1:9097 --agent 'http://{addr}:9099'`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkLoopback(listen, allowRemote); err != nil {
				return err
			}
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("--listen %s: %w", listen, err)
			}
			u := &ctl.UI{Client: c, Agents: ctl.AgentTemplate{Template: agent, Addr: c.NodeAddr}, AnyHost: allowRemote}
			srv := u.Server()
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
	cmd.Flags().BoolVar(&allowRemote, "allow-remote", false,
		"serve on a --listen address that is not loopback, and answer to any Host name (the view has no authentication)")
	return cmd
}

// checkLoopback refuses a --listen address that is not loopback (or
// localhost) unless allowed.
func checkLoopback(listen string, allowed bool) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", listen, err)
	}
	if allowed || host == "localhost" {
		return nil
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("--listen %q: not a loopback address; the view has no authentication (pass --allow-remote to serve it there anyway)", listen)
}
