package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/tabbynet/tabby/policy"
)

// defaultSrcPort is the source port of a what-if packet: an ephemeral one.
const defaultSrcPort = 40000

// evaluate fills x's hops: it asks each node the packet crosses, in
// order, until one drops it.
func (r *resolver) evaluate(ctx context.Context, o PacketOptions, x *PacketExplanation) error {
	sport := o.SrcPort
	if sport == 0 {
		sport = defaultSrcPort
	}
	pkt := policy.Packet{Src: x.From.Addr, Dst: x.To.Addr, Proto: x.Proto, SrcPort: sport, DstPort: x.Port}
	if x.Proto == "icmp" || x.Proto == "icmpv6" {
		pkt.SrcPort, pkt.DstPort = 0, 0
		if x.Proto == "icmpv6" {
			pkt.ICMPType = 128 // echo request
		}
	}
	hops := r.hops(x.From, x.To, pkt)
	if len(hops) == 0 {
		return fmt.Errorf("neither %s nor %s is a pod or node of the cluster: no Tabby rule sees this packet", x.From, x.To)
	}
	if o.Agents == nil {
		return errors.New("no way to reach the agents")
	}
	x.Allowed = true
	for _, h := range hops {
		q := h.Packet.Query(h.Path).Encode()
		code, body, err := o.Agents.Get(ctx, h.Node, "/policy/evaluate?"+q)
		if err != nil {
			return fmt.Errorf("asking the agent of %s: %w", h.Node, err)
		}
		if code != http.StatusOK {
			return fmt.Errorf("the agent of %s: %s: %.300s", h.Node, http.StatusText(code), strings.TrimSpace(string(body)))
		}
		var nt policy.NodeTrace
		if err := json.Unmarshal(body, &nt); err != nil {
			return fmt.Errorf("the agent of %s: unreadable answer: %w", h.Node, err)
		}
		if nt.Node != h.Node {
			return fmt.Errorf("asked the agent of %s, %s answered: check --agent", h.Node, nt.Node)
		}
		h.Accepted, h.Traces = nt.Accepted, nt.Traces
		x.Hops = append(x.Hops, h)
		if !h.Accepted {
			x.Allowed, x.DeniedAt = false, h.Node
			break
		}
	}
	return nil
}

// hops lists the nodes whose rules see the packet, in order: the source's
// node (a pod's egress, or the node's own output) and the destination's
// (a pod's ingress, or the node's input), once when both are one node.
func (r *resolver) hops(from, to PacketEnd, pkt policy.Packet) []PacketHop {
	var out []PacketHop
	local := from.Node != "" && from.Node == to.Node
	switch from.Kind {
	case "pod":
		p := pkt
		p.In = from.Iface
		h := PacketHop{Node: from.Node, Side: "egress", Path: "forward", Packet: p, Route: r.route(from.Node, to)}
		switch {
		case local && to.Kind == "host":
			h.Path, h.Side = "input", "egress, to the node"
		case local:
			h.Packet.Out, h.Side = to.Iface, "egress, ingress"
		}
		out = append(out, h)
	case "host":
		p := pkt
		h := PacketHop{Node: from.Node, Side: "from the node", Path: "output", Packet: p, Route: r.route(from.Node, to)}
		if local && to.Kind == "pod" {
			h.Packet.Out, h.Side = to.Iface, "from the node, ingress"
		}
		out = append(out, h)
	}
	if local {
		return out
	}
	switch to.Kind {
	case "pod":
		p := pkt
		p.Out = to.Iface
		out = append(out, PacketHop{Node: to.Node, Side: "ingress", Path: "forward", Packet: p, Route: r.route(to.Node, to)})
	case "host":
		out = append(out, PacketHop{Node: to.Node, Side: "to the node", Path: "input", Packet: pkt, Route: "delivered to the node"})
	}
	return out
}

// route says, from the cluster view, where node sends a packet to dst.
func (r *resolver) route(node string, dst PacketEnd) string {
	bits := dst.Addr.BitLen()
	switch {
	case dst.Kind == "pod" && dst.Node == node:
		return fmt.Sprintf("%s/%d dev %s (the pod's veth)", dst.Addr, bits, orNone(dst.Iface))
	case dst.Kind == "host" && dst.Node == node:
		return "delivered to the node"
	case dst.Kind == "host":
		return fmt.Sprintf("to %s over the fabric (the node's own routes)", dst.Addr)
	case dst.Kind == "external":
		return "out by the node's own routes (not a cluster address)"
	}
	via := r.nodeAddr(dst.Node, dst.Addr.Is6())
	if blk, ok := r.cl.blockOf(dst.Addr); ok && blk.Affinity == dst.Node {
		return fmt.Sprintf("%s via %s (%s's block, learned over BGP)", blk.CIDR, addrOrNone(via), dst.Node)
	}
	return fmt.Sprintf("%s/%d via %s (%s, learned over BGP)", dst.Addr, bits, addrOrNone(via), dst.Node)
}

// nodeAddr is a node's address of a family, invalid when it has none.
func (r *resolver) nodeAddr(node string, v6 bool) netip.Addr {
	n, ok := r.cl.nodes[node]
	if !ok {
		return netip.Addr{}
	}
	p, _ := n.IPv4()
	if v6 {
		p, _ = n.IPv6()
	}
	return p.Addr()
}
