package ctl

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// How explain tells the path it found.

// workloadRoute is the pod's route on its node.
func (e *explanation) workloadRoute(a netip.Addr) string {
	return fmt.Sprintf("%s/32 dev %s proto %d scope link", a, orNone(e.hostIf), protoWorkload)
}

// remoteRoute is the route other nodes should have for the path.
func remoteRoute(p addrPath) string {
	return fmt.Sprintf("%s via %s proto %d", p.advertise, p.originAddr, protoBGP)
}

func (e *explanation) write(b *strings.Builder) {
	w := e.wep
	line := func(k, format string, args ...any) { fmt.Fprintf(b, "  %-12s %s\n", k, fmt.Sprintf(format, args...)) }
	fmt.Fprintf(b, "Pod %s/%s\n", w.Metadata.Namespace, orNone(w.Spec.Pod))
	line("endpoint", "%s (labels %s)", wepName(w), formatLabels(w.Metadata.Labels))
	line("node", "%s (%s)", e.node, addrOrNone(e.nodeAddr))
	for _, p := range e.addrs {
		handle := "not allocated"
		if p.alloc != nil {
			handle = "IPAM handle " + p.alloc.Handle
		}
		line("address", "%s/32 (%s)", p.addr, handle)
	}
	ifName := orNone(w.Spec.Endpoint)
	line("interface", "%s in the pod, its veth peer %s on %s", ifName, orNone(e.hostIf), e.node)

	fmt.Fprintf(b, "\nInside the pod\n")
	for _, p := range e.addrs {
		fmt.Fprintf(b, "  %s/32 on %s; routes: %s dev %s scope link, default via %s dev %s\n", p.addr, ifName, gatewayAddr, ifName, gatewayAddr, ifName)
	}
	fmt.Fprintf(b, "  %s answers ARP for %s on %s (proxy_arp=1, MAC ee:ee:ee:ee:ee:ee), so every packet goes to the host\n", e.node, gatewayAddr, orNone(e.hostIf))

	fmt.Fprintf(b, "\nOn %s\n", e.node)
	for _, p := range e.addrs {
		fmt.Fprintf(b, "  %s\n", e.workloadRoute(p.addr))
		if p.block != nil && !p.borrowed {
			fmt.Fprintf(b, "  blackhole %s proto %d   (the node's block: unused addresses are dropped here)\n", p.block.CIDR, protoWorkload)
		}
	}

	for _, p := range e.addrs {
		e.writeBlock(b, p)
	}
	e.writeServices(b)
	if len(e.notes) > 0 {
		b.WriteString("\nProblems\n")
		for _, n := range e.notes {
			fmt.Fprintf(b, "  %s\n", n)
		}
	}
	b.WriteString("\nPolicies selecting it\n")
	if len(e.policies) == 0 {
		b.WriteString("  none: all traffic to and from the pod is allowed\n")
	}
	for _, p := range e.policies {
		fmt.Fprintf(b, "  %s\n", p)
	}
	if len(e.policies) > 0 {
		fmt.Fprintf(b, "  ingress: %s\n", isolation(e.ingress, "in"))
		fmt.Fprintf(b, "  egress:  %s\n", isolation(e.egress, "out"))
	}
}

func isolation(names []string, dir string) string {
	if len(names) == 0 {
		return "not isolated: no policy selects it for this direction, everything is allowed " + dir
	}
	return "isolated: only traffic allowed by " + strings.Join(names, ", ") + " gets " + dir
}

func addrOrNone(a netip.Addr) string {
	if !a.IsValid() {
		return "no BGP address"
	}
	return a.String()
}

func (e *explanation) writeBlock(b *strings.Builder, p addrPath) {
	cl := e.cl
	b.WriteString("\nBlock\n")
	if p.block == nil {
		fmt.Fprintf(b, "  no IPAM block holds %s: nothing advertises it, other nodes have no route to it\n", p.addr)
		return
	}
	pool := "outside every pool"
	if p.pool != nil {
		pool = fmt.Sprintf("in pool %s (%s)", p.pool.Name, p.pool.CIDR)
	}
	confirmed := ""
	if p.block.Affinity != "" && !p.block.Confirmed {
		confirmed = " (affinity not confirmed)"
	}
	fmt.Fprintf(b, "  %s %s, %s%s\n", p.block.CIDR, pool, affinityText(p.block.Affinity), confirmed)
	if p.borrowed {
		fmt.Fprintf(b, "  borrowed: %s uses %s from a block that is not its own and advertises %s itself;\n", e.node, p.addr, p.advertise)
		fmt.Fprintf(b, "  %s keeps blackhole %s, but the /32 is more specific and wins everywhere\n", orNone(p.block.Affinity), p.block.CIDR)
	} else {
		fmt.Fprintf(b, "  not borrowed: %s advertises the whole block %s\n", e.node, p.block.CIDR)
	}

	fmt.Fprintf(b, "\nBGP (from %s's published status)\n", e.node)
	if !p.exported {
		fmt.Fprintf(b, "  pool %s has disableBGPExport: %s is not advertised, other nodes have no route to it\n", p.block.Pool, p.advertise)
		return
	}
	st, ok := cl.statuses[e.node]
	if !ok {
		fmt.Fprintf(b, "  %s publishes no status: is tabby-agent running there? Nothing can be said about its sessions\n", e.node)
	} else {
		if slices.Contains(st.Advertised, p.advertise.String()) {
			fmt.Fprintf(b, "  %s advertises %s\n", e.node, p.advertise)
		} else {
			fmt.Fprintf(b, "  %s does NOT list %s among what it advertises (%s)\n", e.node, p.advertise, orNone(strings.Join(st.Advertised, ", ")))
			e.notes = append(e.notes, fmt.Sprintf("%s does not advertise %s", e.node, p.advertise))
		}
		var up, down []string
		for _, peer := range st.Peers {
			name := "not a cluster node"
			if a, err := netip.ParseAddr(peer.Address); err == nil {
				if n := cl.nodeByAddr(a); n != "" {
					name = n
				}
			}
			desc := fmt.Sprintf("%s (%s, %s)", peer.Address, name, peerTypeText(peer.Type))
			if isEstablished(peer.State) {
				up = append(up, desc)
			} else {
				down = append(down, desc+": "+peer.State)
			}
		}
		if len(up) == 0 {
			fmt.Fprintf(b, "  no established session carries it: no other node learns this route\n")
			e.notes = append(e.notes, fmt.Sprintf("%s has no established BGP session", e.node))
		} else {
			fmt.Fprintf(b, "  carried by %s:\n", plural(len(up), "established session", "established sessions"))
			for _, u := range up {
				fmt.Fprintf(b, "    %s\n", u)
			}
		}
		if len(down) > 0 {
			b.WriteString("  not established:\n")
			for _, d := range down {
				fmt.Fprintf(b, "    %s\n", d)
			}
		}
	}

	b.WriteString("\nRoutes the other nodes should have\n")
	others := 0
	for _, n := range cl.names {
		if n == e.node {
			continue
		}
		others++
		fmt.Fprintf(b, "  %-10s %s%s\n", n, e.remoteRouteFor(n, p), e.remoteNote(n))
	}
	if others == 0 {
		b.WriteString("  none: there are no other nodes\n")
	}
}

// remoteNote says why another node may lack the route.
func (e *explanation) remoteNote(other string) string {
	cl := e.cl
	var notes []string
	if st, ok := cl.statuses[e.node]; ok {
		addr := cl.nodeAddr(other)
		for _, p := range st.Peers {
			if a, err := netip.ParseAddr(p.Address); err == nil && a == addr && !isEstablished(p.State) {
				notes = append(notes, fmt.Sprintf("its session with %s is %s", e.node, p.State))
			}
		}
	}
	if _, ok := cl.statuses[other]; !ok {
		notes = append(notes, other+" publishes no status")
	}
	if len(notes) == 0 {
		return ""
	}
	return "   (" + strings.Join(notes, "; ") + ")"
}

// writeServices tells the Service addresses that lead to the pod (the
// Services listing it as a ready endpoint) and what becomes of each; it
// writes nothing when no Service does.
func (e *explanation) writeServices(b *strings.Builder) {
	if len(e.services) == 0 {
		return
	}
	ix := indexServiceAds(e.cl.statuses)
	b.WriteString("\nServices leading here\n")
	for _, s := range e.services {
		fmt.Fprintf(b, "  %s/%s (%s, externalTrafficPolicy %s, ready endpoints on %s)\n", s.Metadata.Namespace, s.Metadata.Name,
			orNone(s.Spec.Type), s.Spec.ExternalTrafficPolicy, orNone(strings.Join(s.Spec.EndpointNodes, ",")))
		for _, f := range ix.fates(s) {
			fmt.Fprintf(b, "    %s\n", f)
		}
	}
}
