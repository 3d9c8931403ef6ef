package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
)

// Runner runs a program and returns its standard output. ExecRunner is the
// real one; tests replace it.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) ([]byte, error)
}

// ExecRunner runs programs with os/exec.
type ExecRunner struct{}

// Run implements Runner; the error carries the program's stderr.
func (ExecRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, msg)
		}
		return out, fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return out, nil
}

// kernelRoute is one route of `ip -j route`.
type kernelRoute struct {
	Type     string `json:"type"`
	Dst      string `json:"dst"`
	Gateway  string `json:"gateway"`
	Dev      string `json:"dev"`
	Nexthops []struct {
		Gateway string `json:"gateway"`
		Dev     string `json:"dev"`
	} `json:"nexthops"`
}

// prefix returns the destination; ip prints host routes without "/32".
func (r kernelRoute) prefix() netip.Prefix {
	if r.Dst == "default" {
		return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	}
	if p, err := netip.ParsePrefix(r.Dst); err == nil {
		return p.Masked()
	}
	if a, err := netip.ParseAddr(r.Dst); err == nil {
		return netip.PrefixFrom(a, a.BitLen())
	}
	return netip.Prefix{}
}

func (r kernelRoute) gateways() []string {
	var out []string
	if r.Gateway != "" {
		out = append(out, r.Gateway)
	}
	for _, n := range r.Nexthops {
		if n.Gateway != "" {
			out = append(out, n.Gateway)
		}
	}
	return out
}

func (r kernelRoute) String() string {
	var parts []string
	if r.Type != "" && r.Type != "unicast" {
		parts = append(parts, r.Type)
	}
	parts = append(parts, r.Dst)
	if r.Gateway != "" {
		parts = append(parts, "via", r.Gateway)
	}
	if r.Dev != "" {
		parts = append(parts, "dev", r.Dev)
	}
	for _, n := range r.Nexthops {
		parts = append(parts, "nexthop via", n.Gateway, "dev", n.Dev)
	}
	return strings.Join(parts, " ")
}

// liveState is the kernel state of the node explain runs on.
type liveState struct {
	node   string
	where  string // "this host" or "network namespace <path>"
	netns  string
	runner Runner
	// routes by protocol (protoWorkload, protoBGP).
	routes map[int][]kernelRoute
}

func (l *liveState) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	if l.netns != "" {
		return l.runner.Run(ctx, "nsenter", append([]string{"--net=" + l.netns, name}, args...)...)
	}
	return l.runner.Run(ctx, name, args...)
}

// readLive reads this node's routes and finds which node it is.
func readLive(ctx context.Context, o ExplainOptions, cl *cluster) (*liveState, error) {
	l := &liveState{node: o.Node, netns: o.NetNS, runner: o.Runner, where: "this host", routes: map[int][]kernelRoute{}}
	if l.runner == nil {
		l.runner = ExecRunner{}
	}
	if l.netns != "" {
		l.where = "network namespace " + l.netns
	}
	if l.node == "" {
		node, err := l.detectNode(ctx, cl)
		if err != nil {
			return nil, err
		}
		l.node = node
	} else if _, ok := cl.nodes[l.node]; !ok {
		return nil, fmt.Errorf("--node %s: no such node", l.node)
	}
	for _, proto := range []int{protoWorkload, protoBGP} {
		out, err := l.run(ctx, "ip", "-j", "-4", "route", "show", "table", "main", "proto", fmt.Sprint(proto))
		if err != nil {
			return nil, fmt.Errorf("reading routes of %s: %w", l.where, err)
		}
		var rs []kernelRoute
		if err := json.Unmarshal(bytes.TrimSpace(out), &rs); err != nil && len(bytes.TrimSpace(out)) > 0 {
			return nil, fmt.Errorf("parsing ip route output: %w", err)
		}
		l.routes[proto] = rs
	}
	return l, nil
}

// detectNode finds the node whose BGP address this host has.
func (l *liveState) detectNode(ctx context.Context, cl *cluster) (string, error) {
	out, err := l.run(ctx, "ip", "-j", "-4", "addr", "show")
	if err != nil {
		return "", fmt.Errorf("reading addresses of %s: %w", l.where, err)
	}
	var links []struct {
		AddrInfo []struct {
			Local string `json:"local"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal(out, &links); err != nil {
		return "", fmt.Errorf("parsing ip addr output: %w", err)
	}
	var mine []string
	for _, link := range links {
		for _, ai := range link.AddrInfo {
			a, err := netip.ParseAddr(ai.Local)
			if err != nil {
				continue
			}
			if n := cl.nodeByAddr(a); n != "" {
				return n, nil
			}
			mine = append(mine, ai.Local)
		}
	}
	return "", fmt.Errorf("cannot tell which node %s is: none of its addresses (%s) is a node's BGP address; give --node", l.where, strings.Join(mine, ", "))
}

// find returns the routes of proto to dst.
func (l *liveState) find(proto int, dst netip.Prefix) []kernelRoute {
	var out []kernelRoute
	for _, r := range l.routes[proto] {
		if r.prefix() == dst {
			out = append(out, r)
		}
	}
	return out
}

// check compares the kernel with what e says this node should have,
// writes the result and returns the number of disagreements.
func (l *liveState) check(ctx context.Context, b *strings.Builder, e *explanation) int {
	fmt.Fprintf(b, "\nLive: the kernel of %s (%s)\n", l.node, l.where)
	bad := 0
	ok := func(format string, args ...any) { fmt.Fprintf(b, "  ok         %s\n", fmt.Sprintf(format, args...)) }
	disagree := func(format string, args ...any) {
		fmt.Fprintf(b, "  DISAGREES  %s\n", fmt.Sprintf(format, args...))
		bad++
	}
	// wantRoute checks for exactly one route of proto to dst that satisfies
	// match; what describes the wanted route.
	wantRoute := func(proto int, dst netip.Prefix, what string, match func(kernelRoute) bool) {
		rs := l.find(proto, dst)
		switch {
		case len(rs) == 0:
			disagree("no route %s (proto %d)", what, proto)
		case !match(rs[0]):
			disagree("route %s, the datastore says %s", rs[0], what)
		default:
			ok("%s", rs[0])
		}
	}
	if l.node == e.node {
		l.checkInterface(ctx, e.hostIf, ok, disagree)
	}
	for _, p := range e.addrs {
		host := netip.PrefixFrom(p.addr, 32)
		switch {
		case l.node == e.node:
			wantRoute(protoWorkload, host, e.workloadRoute(p.addr), func(r kernelRoute) bool { return r.Dev == e.hostIf && r.Type != "blackhole" })
			if p.block != nil && !p.borrowed {
				wantRoute(protoWorkload, p.block.CIDR, fmt.Sprintf("blackhole %s", p.block.CIDR), func(r kernelRoute) bool { return r.Type == "blackhole" })
			}
		case p.block == nil || !p.exported || !p.originAddr.IsValid():
			fmt.Fprintf(b, "  (the datastore gives %s no route for %s)\n", l.node, p.addr)
		default:
			if p.borrowed && p.block.Affinity == l.node {
				wantRoute(protoWorkload, p.block.CIDR, fmt.Sprintf("blackhole %s", p.block.CIDR), func(r kernelRoute) bool { return r.Type == "blackhole" })
			}
			gw := p.originAddr.String()
			wantRoute(protoBGP, p.advertise, remoteRoute(p), func(r kernelRoute) bool { return slices.Contains(r.gateways(), gw) })
		}
		l.checkRouteGet(ctx, b, p, e, disagree)
	}
	if bad == 0 {
		b.WriteString("  the kernel agrees with the datastore\n")
	}
	return bad
}

// checkInterface checks the host end of the pod's veth and its proxy ARP.
func (l *liveState) checkInterface(ctx context.Context, ifName string, ok, disagree func(string, ...any)) {
	if ifName == "" {
		disagree("the endpoint names no host interface")
		return
	}
	if _, err := l.run(ctx, "ip", "-j", "link", "show", "dev", ifName); err != nil {
		disagree("interface %s does not exist (%v)", ifName, err)
		return
	}
	out, err := l.run(ctx, "cat", "/proc/sys/net/ipv4/conf/"+ifName+"/proxy_arp")
	switch v := strings.TrimSpace(string(out)); {
	case err != nil:
		disagree("reading proxy_arp of %s: %v", ifName, err)
	case v != "1":
		disagree("interface %s has proxy_arp=%s, want 1 (the pod cannot resolve its gateway %s)", ifName, v, gatewayAddr)
	default:
		ok("interface %s exists, proxy_arp=1", ifName)
	}
}

// checkRouteGet asks the kernel where it would send a packet to the pod.
func (l *liveState) checkRouteGet(ctx context.Context, b *strings.Builder, p addrPath, e *explanation, disagree func(string, ...any)) {
	out, err := l.run(ctx, "ip", "-j", "route", "get", p.addr.String())
	if err != nil {
		// The kernel refuses to "get" a route that is a blackhole.
		for _, r := range l.routes[protoWorkload] {
			if r.Type == "blackhole" && r.prefix().Contains(p.addr) {
				disagree("packets for %s are dropped by blackhole %s", p.addr, r.Dst)
				return
			}
		}
		disagree("ip route get %s: %v", p.addr, err)
		return
	}
	var rs []kernelRoute
	if err := json.Unmarshal(out, &rs); err != nil || len(rs) == 0 {
		disagree("ip route get %s: unreadable output", p.addr)
		return
	}
	r := rs[0]
	fmt.Fprintf(b, "  the kernel sends packets for %s %s\n", p.addr, strings.TrimPrefix(r.String(), r.Dst+" "))
	switch {
	case l.node == e.node && r.Dev != e.hostIf:
		disagree("packets for %s leave through %s, not the pod's %s", p.addr, orNone(r.Dev), e.hostIf)
	case l.node != e.node && p.exported && p.originAddr.IsValid() && !slices.Contains(r.gateways(), p.originAddr.String()):
		disagree("packets for %s go via %s, not %s (%s)", p.addr, orNone(r.Gateway), p.originAddr, e.node)
	}
}
