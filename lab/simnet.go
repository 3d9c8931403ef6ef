package lab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"
)

// The simulated nodes' underlay (docs/scale.md, "Neighbour table").
//
// The kernel's neighbour table is one table for the whole host, capped by
// gc_thresh3 (1,024 here), and neighbour entries are keyed by next hop. So
// every simulated node lives in one namespace, <lab>-sim, attached to the
// fabric once as simGateway; their addresses (simSubnet, 198.18.4.0/22)
// are all local there (`local 198.18.4.0/22 dev lo`, any address of it can
// be bound). The real nodes reach simSubnet through one route via
// simGateway: a thousand sessions cost each reflector one neighbour entry,
// etcd one more, and the sim namespace one per reflector and etcd.
//
// The simulated nodes advertise their blocks with their own address as
// next hop, as a node does, and the agents install `<block> via <sim
// address>` without onlink; the kernel accepts a gateway only when a
// link-scope route covers it. So each real node also has `198.18.4.0/22 dev
// eth0 scope link` with a higher metric: the gateway check, which skips
// routes of universe scope, finds it; forwarding, which takes the lowest
// metric, uses the route via simGateway. No packet is ever sent to a
// simulated node's pods (they do not exist), so no neighbour entry for a
// simulated address is ever created.
var simGateway = netip.MustParsePrefix("198.18.0.250/24")

// SimNS is the namespace of the lab's simulated nodes.
func (s *State) SimNS() string { return s.Name + "-sim" }

// makeSimNet creates the sim namespace and the real nodes' routes to it.
func (l *Lab) makeSimNet(ctx context.Context) error {
	st := l.State()
	ns := st.SimNS()
	if err := l.newNamespace(ctx, ns); err != nil {
		return err
	}
	if err := l.attach(ctx, ns, "v-sim", simGateway); err != nil {
		return err
	}
	if err := ip(ctx, "-n", ns, "route", "add", "local", simSubnet.String(), "dev", "lo"); err != nil {
		return err
	}
	for _, n := range st.Nodes {
		if err := l.routeToSim(ctx, n.NetNS); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
	}
	// etcd answers the simulated nodes' clients (one more entry there).
	return ip(ctx, "-n", st.EtcdNS(), "route", "replace", simSubnet.String(), "via", simGateway.Addr().String(), "dev", "eth0")
}

func (l *Lab) routeToSim(ctx context.Context, nodeNS string) error {
	if err := ip(ctx, "-n", nodeNS, "route", "replace", simSubnet.String(), "via", simGateway.Addr().String(), "dev", "eth0", "metric", "10"); err != nil {
		return err
	}
	return ip(ctx, "-n", nodeNS, "route", "replace", simSubnet.String(), "dev", "eth0", "scope", "link", "metric", "20")
}

// keepSession holds node n's session with the reflector at rr: the
// simulated node has the higher address, and between cluster nodes only
// the higher address connects (bgp.speaker.passive), so it dials, from its
// own address inside the sim namespace, signing with the cluster's
// TCP-MD5 password (lab/simmd5.go, read again for every dial), and dials
// again whenever the session ends or the reflector refuses (its peer not
// configured yet), until ctx ends.
func (n *simNode) keepSession(ctx context.Context, ns string, rr netip.Addr) {
	to := netip.AddrPortFrom(rr, 179).String()
	for ctx.Err() == nil {
		var c net.Conn
		pw, err := n.meshPassword(ctx)
		if err == nil {
			err = inNetNS(ns, func() (err error) {
				d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(n.addr, 0)), Timeout: 5 * time.Second,
					Control: md5Control(rr, pw)}
				c, err = d.DialContext(ctx, "tcp", to)
				return err
			})
		}
		if err == nil {
			n.attach(ctx, c, rr)
		}
		sleepCtx(ctx, time.Second)
	}
}
