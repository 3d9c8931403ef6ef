package ctl

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tabbynet/tabby/api"
)

// How node status shows refused sessions and the route reflector
// election (docs/bgp.md).

// writeBGPExtras prints the sessions the node cannot have and, with
// routeReflectorMode Auto, the elected reflectors and this node's role.
func writeBGPExtras(b *strings.Builder, st api.AgentStatus) {
	for _, r := range st.RefusedPeers {
		fmt.Fprintf(b, "ERROR: BGP session %s %srefused: %s\n", r.Name, orEmptyAddr(r.Address), r.Reason)
	}
	rs := st.Reflectors
	if rs == nil {
		return
	}
	peering := ""
	if rs.Peering != "" { // an agent older than routeReflectorPeering leaves it out
		peering = ", zones peer as " + rs.Peering
	}
	fmt.Fprintf(b, "Route reflectors (Auto, %d per zone by %s, grace %s%s): this node is a %s in zone %q", rs.PerZone, rs.ZoneLabel, rs.Grace, peering, rs.Role, rs.Zone)
	if rs.Reason != "" {
		fmt.Fprintf(b, " (%s)", rs.Reason)
	}
	b.WriteString("\n")
	el := slices.Clone(rs.Elected)
	slices.SortFunc(el, func(x, y api.ElectedReflector) int {
		return cmp.Or(cmp.Compare(x.Zone, y.Zone), cmp.Compare(x.Node, y.Node))
	})
	for _, e := range el {
		live := "live"
		if !e.Live {
			live = "LIVENESS GONE"
		}
		switch { // nil: an agent older than the report
		case e.SessionsReady == nil:
		case *e.SessionsReady:
			live += ", sessions ready"
		default:
			live += ", sessions pending"
		}
		fmt.Fprintf(b, "  zone %-10q %-20s cluster %-15s since %s, %s: %s\n", e.Zone, e.Node, e.ClusterID, e.Since.UTC().Format(time.DateTime), live, e.Reason)
	}
	if len(el) == 0 {
		b.WriteString("  none elected yet\n")
	}
	for _, d := range rs.LastDropped {
		fmt.Fprintf(b, "  replaced: %s\n", d)
	}
}

func orEmptyAddr(a string) string {
	if a == "" {
		return ""
	}
	return "(" + a + ") "
}
