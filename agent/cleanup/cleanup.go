// Package cleanup owns `tabby-agent cleanup`: removing from a node
// everything Tabby installed there, after the agent has stopped for good.
//
// What it removes, and what it leaves:
//   - routes with Tabby's protocol numbers (80: workload /32s and block
//     blackholes, 81: learned over BGP), IPv4 and IPv6 — always;
//   - the VXLAN devices vxlan.tabby and vxlan-v6.tabby — always;
//   - the firewall state: tabby-… chains, the jumps into them and tabby-…
//     ipsets, on both iptables backends — always;
//   - the CNI network configuration list and the tabby shim (as
//     install-cni --uninstall does; chained plugins such as portmap stay) —
//     unless Config.SkipCNI;
//   - the agent's state directory — unless it is "";
//   - cali… veths of pods, with the pods' network — only with
//     Config.RemoveWorkloads, because pods still running lose their network;
//   - sysctls: the agent sets net.ipv4.ip_forward=1 on the node and
//     proxy_arp, proxy_delay and forwarding on each cali… link. The
//     per-link ones go with the links. ip_forward is left on unless
//     Config.ResetSysctls: Tabby does not record the value it found, and a
//     Kubernetes node needs forwarding whatever its network plugin.
//
// Cleanup is idempotent and keeps going after a failure, returning every
// error; running it twice removes nothing the second time.
package cleanup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/tabbynet/tabby/agent/installcni"
	"github.com/tabbynet/tabby/dataplane"
)

// Config says where Tabby's state is and what to remove.
type Config struct {
	// NetNS is the node's network namespace path; "" = this process's.
	NetNS string
	// CNI locates the CNI configuration list and the shim.
	CNI installcni.Config
	// SkipCNI leaves the CNI files (e.g. when install-cni --uninstall runs
	// separately).
	SkipCNI bool
	// StateDir is the agent's state directory, removed with its content;
	// "" = leave it.
	StateDir string
	// CNISocket is the agent's CNI socket: Cleanup refuses to run while an
	// agent answers there, unless Force. "" = do not check.
	CNISocket string
	// Force runs even when an agent answers on CNISocket.
	Force bool
	// RemoveWorkloads deletes cali… links (pods lose their network).
	RemoveWorkloads bool
	// ResetSysctls sets net.ipv4.ip_forward back to 0.
	ResetSysctls bool
}

// Report lists what Cleanup removed.
type Report struct {
	Routes     []string
	Links      []string
	Files      []string
	Firewall   bool // the firewall pass ran without error
	SysctlsOff bool
}

// ErrAgentRunning is returned when an agent still serves on the node.
var ErrAgentRunning = errors.New("tabby-agent is running on this node")

// Cleanup removes Tabby's state from the node as Config says.
func Cleanup(ctx context.Context, cfg Config, log *slog.Logger) (*Report, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.CNISocket != "" && !cfg.Force && agentAnswers(ctx, cfg.CNISocket) {
		return nil, fmt.Errorf("%w (it answers on %s): stop it first (delete the DaemonSet), or force", ErrAgentRunning, cfg.CNISocket)
	}
	rep := &Report{}
	var errs []error
	if cfg.RemoveWorkloads {
		links, err := dataplane.RemoveWorkloadLinks(cfg.NetNS)
		rep.Links = links
		errs = append(errs, err)
	}
	// The VXLAN devices go with the routes through them (docs/vxlan.md).
	tunnels, err := dataplane.RemoveVXLANDevices(cfg.NetNS)
	rep.Links = append(rep.Links, tunnels...)
	errs = append(errs, err)
	routes, err := dataplane.RemoveRoutes(cfg.NetNS)
	rep.Routes = routes
	errs = append(errs, err)
	if err := dataplane.RemoveFirewalls(cfg.NetNS); err != nil {
		errs = append(errs, err)
	} else {
		rep.Firewall = true
	}
	if cfg.ResetSysctls {
		if err := dataplane.ResetNodeSysctls(cfg.NetNS); err != nil {
			errs = append(errs, err)
		} else {
			rep.SysctlsOff = true
		}
	}
	if !cfg.SkipCNI {
		r, err := installcni.Uninstall(cfg.CNI)
		if r != nil {
			rep.Files = append(rep.Files, r.Removed...)
		}
		errs = append(errs, err)
	}
	if cfg.StateDir != "" {
		if _, err := os.Stat(cfg.StateDir); err == nil {
			if err := os.RemoveAll(cfg.StateDir); err != nil {
				errs = append(errs, fmt.Errorf("removing %s: %w", cfg.StateDir, err))
			} else {
				rep.Files = append(rep.Files, cfg.StateDir)
			}
		} else if !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("checking %s: %w", cfg.StateDir, err))
		}
	}
	for _, r := range rep.Routes {
		log.Info("removed route", "route", r)
	}
	for _, l := range rep.Links {
		log.Info("removed link", "link", l)
	}
	for _, f := range rep.Files {
		log.Info("removed", "path", f)
	}
	return rep, errors.Join(errs...)
}

// agentAnswers reports whether something accepts connections on the
// agent's socket (a stale socket file of a dead agent refuses them).
func agentAnswers(ctx context.Context, sock string) bool {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}
