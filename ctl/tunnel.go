package ctl

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// How node status and explain show VXLAN tunnels (docs/vxlan.md).

// writeTunnels prints the node's tunnels, one block per family with a
// tunnel, and the destinations each carries.
func writeTunnels(b *strings.Builder, st api.AgentStatus) {
	for _, t := range st.Tunnels {
		if t.Mode == "off" || t.Mode == "" {
			continue
		}
		fmt.Fprintf(b, "VXLAN %s: %s, address %s, MAC %s, VNI %d, port %d, MTU %d; %s, %s\n",
			t.Device, t.Mode, addrOrNone(t.Addr), orNone(t.MAC), t.VNI, t.Port, t.MTU,
			plural(t.Peers, "peer", "peers"), plural(t.Routes, "tunnelled route", "tunnelled routes"))
		for _, p := range t.Paths {
			fmt.Fprintf(b, "  %s via %s dev %s onlink   (%s)\n", p.Dst, p.Via, t.Device, orNone(p.Node))
		}
		if len(t.Direct) > 0 {
			fmt.Fprintf(b, "  native (same subnet, CrossSubnet): %s\n", strings.Join(t.Direct, ", "))
		}
		if len(t.Native) > 0 {
			fmt.Fprintf(b, "  native until they have a tunnel: %s\n", strings.Join(t.Native, ", "))
		}
		if t.Error != "" {
			fmt.Fprintf(b, "  ERROR: %s (traffic of this family stays on the native path)\n", t.Error)
		}
	}
}

// loadPools reads the IP pools, for their VXLAN modes.
func (c *Client) loadPools(ctx context.Context, cl *cluster) error {
	pools, _, err := datastore.ListAs[*api.IPPool](ctx, c.Store, api.KindIPPool, "")
	if err != nil {
		return fmt.Errorf("listing ip pools: %w", err)
	}
	cl.ippools = pools
	return nil
}

// vxlanMode is the mode of the pool holding a, "" when none does.
func (cl *cluster) vxlanMode(a netip.Addr) api.VXLANMode {
	for _, p := range cl.ippools {
		if pr, err := p.Prefix(); err == nil && pr.Contains(a) {
			return p.Spec.VXLANMode
		}
	}
	return ""
}

// tunnelled reports whether traffic from node from to the node owner's
// address a goes through owner's VXLAN tunnel, and via which tunnel
// address: the pool encapsulates (Always, or CrossSubnet with the nodes in
// different subnets) and owner has recorded its tunnel.
func (cl *cluster) tunnelled(from, owner string, a netip.Addr) (netip.Addr, bool) {
	mode := cl.vxlanMode(a)
	if !mode.Encapsulated() {
		return netip.Addr{}, false
	}
	o, ok := cl.nodes[owner]
	if !ok {
		return netip.Addr{}, false
	}
	via, _, ok := o.VXLANTunnel(a.Is6())
	if !ok {
		return netip.Addr{}, false
	}
	if mode == api.VXLANModeCrossSubnet {
		f, ok := cl.nodes[from]
		if !ok {
			return netip.Addr{}, false
		}
		fp, ok1 := underlayOf(f, a.Is6())
		op, ok2 := underlayOf(o, a.Is6())
		if !ok1 || !ok2 || fp.Masked().Contains(op.Addr()) {
			return netip.Addr{}, false
		}
	}
	return via, true
}

func underlayOf(n *api.Node, is6 bool) (netip.Prefix, bool) {
	if is6 {
		return n.IPv6()
	}
	return n.IPv4()
}

// remoteRouteFor is the route node other should have for the path: through
// the owner's tunnel, or the BGP-learned one.
func (e *explanation) remoteRouteFor(other string, p addrPath) string {
	if via, ok := e.cl.tunnelled(other, e.node, p.addr); ok {
		return fmt.Sprintf("%s via %s dev %s proto %d onlink   (VXLAN %s)", p.advertise, via, vxlanDevice(p.addr.Is6()), protoWorkload, e.cl.vxlanMode(p.addr))
	}
	return remoteRoute(p)
}

func vxlanDevice(is6 bool) string {
	if is6 {
		return "vxlan-v6.tabby"
	}
	return "vxlan.tabby"
}
