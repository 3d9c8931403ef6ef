package ctl

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/policy"
)

// This file is `tabbyctl explain packet`: which nodes a packet crosses,
// and, from each node's agent, the verdict of the rules that agent applied
// (policy.EvalPath over its Ruleset, GET /policy/evaluate). The datastore
// only says where the ends are and how the packet is routed; the verdicts
// are the dataplane's own model, never a second reading of the API.

// PacketOptions are the arguments of explain packet.
type PacketOptions struct {
	// From is "pod/NS/NAME" or an address; To also "svc/NS/NAME".
	From, To string
	// Port is "PORT/PROTO" ("80/tcp", "53/udp") or "icmp".
	Port string
	// Family is 4 or 6 for pods of both families; 0 = IPv4 when both ends
	// have it.
	Family int
	// SrcPort is the source port (0 = 40000).
	SrcPort uint16
	// Agents reaches the nodes' agents.
	Agents Agents
	// Live also sends a probe from the source pod and checks the deciding
	// rules' kernel counters (explainlive.go); Agents must be AgentPoster.
	Live bool
}

// PacketEnd is one end of a packet.
type PacketEnd struct {
	// Kind is "pod", "host" (a node's address) or "external".
	Kind      string            `json:"kind"`
	Namespace string            `json:"namespace,omitempty"`
	Name      string            `json:"name,omitempty"`
	Node      string            `json:"node,omitempty"`
	Iface     string            `json:"iface,omitempty"`
	Addr      netip.Addr        `json:"addr"`
	Labels    map[string]string `json:"labels,omitempty"`
}

func (e PacketEnd) String() string {
	switch e.Kind {
	case "pod":
		return fmt.Sprintf("pod %s/%s (%s) on %s", e.Namespace, e.Name, e.Addr, e.Node)
	case "host":
		return fmt.Sprintf("node %s (%s)", e.Node, e.Addr)
	}
	return fmt.Sprintf("%s (outside the cluster)", e.Addr)
}

// PacketHop is the evaluation at one node.
type PacketHop struct {
	Node string `json:"node"`
	// Side says which policies apply here: "egress", "ingress" or
	// "egress, ingress" (both ends on this node).
	Side   string        `json:"side"`
	Path   string        `json:"path"`
	Packet policy.Packet `json:"packet"`
	// Route is where the node sends the packet, from the cluster view.
	Route    string         `json:"route"`
	Accepted bool           `json:"accepted"`
	Traces   []policy.Trace `json:"traces"`
}

// PacketExplanation is explain packet's answer for one destination.
type PacketExplanation struct {
	From PacketEnd `json:"from"`
	To   PacketEnd `json:"to"`
	// Via is the Service the destination was chosen from, if any.
	Via     string      `json:"via,omitempty"`
	Proto   string      `json:"proto"`
	Port    uint16      `json:"port"`
	Hops    []PacketHop `json:"hops"`
	Allowed bool        `json:"allowed"`
	// DeniedAt names the node whose rules drop the packet.
	DeniedAt string `json:"deniedAt,omitempty"`
	// Live is --live's probe and counters.
	Live *LiveCheck `json:"live,omitempty"`
}

// ParsePortProto parses "80/tcp", "53/udp", "8080" (tcp) or "icmp".
func ParsePortProto(s string) (proto string, port uint16, err error) {
	ps, proto, ok := strings.Cut(strings.ToLower(strings.TrimSpace(s)), "/")
	if !ok {
		if ps == "icmp" || ps == "icmpv6" {
			return ps, 0, nil
		}
		proto = "tcp"
	}
	switch proto {
	case "tcp", "udp", "sctp":
	default:
		return "", 0, fmt.Errorf("--port %.40q: protocol %.20q: want tcp, udp or sctp (or the port icmp)", s, proto)
	}
	n, err := strconv.ParseUint(ps, 10, 16)
	if err != nil || n == 0 {
		return "", 0, fmt.Errorf("--port %.40q: want PORT/PROTO with a port from 1 to 65535", s)
	}
	return proto, uint16(n), nil
}

// ExplainPacket resolves the ends, works out the nodes the packet
// crosses and asks each node's agent for its verdict. A Service as To
// gives one explanation per ready endpoint (the Service's address is
// translated to it before the filter, so policy sees the endpoint).
func (c *Client) ExplainPacket(ctx context.Context, o PacketOptions) ([]PacketExplanation, error) {
	proto, port, err := ParsePortProto(o.Port)
	if err != nil {
		return nil, err
	}
	if o.Family != 0 && o.Family != 4 && o.Family != 6 {
		return nil, fmt.Errorf("--family %d: want 4 or 6", o.Family)
	}
	cl, err := c.loadCluster(ctx)
	if err != nil {
		return nil, err
	}
	byAddr, err := c.endpointsByAddr(ctx)
	if err != nil {
		return nil, err
	}
	r := &resolver{c: c, cl: cl, byAddr: byAddr}
	froms, err := r.ends(ctx, "--from", o.From, false)
	if err != nil {
		return nil, err
	}
	tos, err := r.ends(ctx, "--to", o.To, true)
	if err != nil {
		return nil, err
	}
	var out []PacketExplanation
	for _, to := range tos {
		from, dst, err := pickFamily(froms, to.ends, o.Family)
		if err != nil {
			return nil, err
		}
		if proto == "icmp" && from.Addr.Is6() {
			proto = "icmpv6"
		}
		x := PacketExplanation{From: from, To: dst, Via: to.via, Proto: proto, Port: port}
		if err := r.evaluate(ctx, o, &x); err != nil {
			return nil, err
		}
		if o.Live {
			if err := liveProbe(ctx, o, &x); err != nil {
				return nil, err
			}
		}
		out = append(out, x)
	}
	return out, nil
}

// resolver turns the user's words into packet ends.
type resolver struct {
	c      *Client
	cl     *cluster
	byAddr map[netip.Addr][]*api.WorkloadEndpoint
}

// target is one destination: the addresses of one pod (or one address),
// and the Service it came from.
type target struct {
	ends []PacketEnd
	via  string
}

// ends resolves a --from or --to argument to its targets.
func (r *resolver) ends(ctx context.Context, flag, s string, svcOK bool) ([]target, error) {
	if len(s) > 300 {
		return nil, fmt.Errorf("%s: %d characters: too long", flag, len(s))
	}
	kind, rest, _ := strings.Cut(s, "/")
	switch kind {
	case "pod", "svc":
		ns, name, ok := strings.Cut(rest, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("%s %q: want %s/NAMESPACE/NAME", flag, s, kind)
		}
		if kind == "svc" {
			if !svcOK {
				return nil, fmt.Errorf("%s %q: a Service is only a destination", flag, s)
			}
			return r.service(flag, ns, name)
		}
		weps, err := r.c.findEndpoints(ctx, ExplainOptions{Target: ns + "/" + name})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		return []target{{ends: podEnds(weps[0])}}, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return nil, fmt.Errorf("%s %q: want pod/NAMESPACE/NAME, an address%s", flag, s, map[bool]string{true: " or svc/NAMESPACE/NAME"}[svcOK])
	}
	return []target{{ends: []PacketEnd{r.addrEnd(a.WithZone(""))}}}, nil
}

func (r *resolver) service(flag, ns, name string) ([]target, error) {
	i := slices.IndexFunc(r.cl.services, func(s *api.Service) bool {
		return s.Metadata.Namespace == ns && s.Metadata.Name == name
	})
	if i < 0 {
		return nil, fmt.Errorf("%s: no Service %s/%s in the datastore", flag, ns, name)
	}
	svc := r.cl.services[i]
	var out []target
	for _, s := range svc.Spec.EndpointAddresses {
		a, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		out = append(out, target{ends: []PacketEnd{r.addrEnd(a)}, via: "Service " + ns + "/" + name})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: Service %s/%s has no ready endpoint", flag, ns, name)
	}
	return out, nil
}

// addrEnd is the pod, node or outside address a.
func (r *resolver) addrEnd(a netip.Addr) PacketEnd {
	if weps := r.byAddr[a]; len(weps) > 0 {
		e := podEnds(weps[0])
		if i := slices.IndexFunc(e, func(e PacketEnd) bool { return e.Addr == a }); i >= 0 {
			return e[i]
		}
	}
	for _, name := range r.cl.names {
		n := r.cl.nodes[name]
		p4, _ := n.IPv4()
		p6, _ := n.IPv6()
		if p4.Addr() == a || p6.Addr() == a {
			return PacketEnd{Kind: "host", Node: name, Addr: a}
		}
	}
	return PacketEnd{Kind: "external", Addr: a}
}

func podEnds(w *api.WorkloadEndpoint) []PacketEnd {
	addrs, _ := w.Addrs()
	var out []PacketEnd
	for _, a := range addrs {
		out = append(out, PacketEnd{Kind: "pod", Namespace: w.Metadata.Namespace, Name: w.Spec.Pod, Node: w.Spec.Node,
			Iface: w.Spec.InterfaceName, Addr: a, Labels: w.Metadata.Labels})
	}
	return out
}

// pickFamily chooses one address of each end, of one family.
func pickFamily(froms []target, tos []PacketEnd, family int) (PacketEnd, PacketEnd, error) {
	var from []PacketEnd
	for _, t := range froms {
		from = append(from, t.ends...)
	}
	for _, f := range []int{4, 6} {
		if family != 0 && family != f {
			continue
		}
		of := func(e PacketEnd) bool { return e.Addr.Is4() == (f == 4) }
		i, j := slices.IndexFunc(from, of), slices.IndexFunc(tos, of)
		if i >= 0 && j >= 0 {
			return from[i], tos[j], nil
		}
	}
	if family != 0 {
		return PacketEnd{}, PacketEnd{}, fmt.Errorf("the ends have no IPv%d addresses in common", family)
	}
	return PacketEnd{}, PacketEnd{}, errors.New("the ends have no address family in common")
}
