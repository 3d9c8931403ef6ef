package lab

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/tabbynet/tabby/api"
)

// A lab with two underlay subnets (Options.TwoSubnets): the fabric's second
// bridge br1 carries 198.18.1.0/24 (and 2001:db8:1::/64), the ToR routes
// between the two subnets and nothing else — it speaks no BGP and has no
// route to any pod address — so that pods on nodes of different subnets
// reach each other only through a tunnel (docs/vxlan.md). Nodes alternate:
// node1, node3, … in the first subnet, node2, node4, … in the second.
var (
	fabricNetB  = netip.MustParsePrefix("198.18.1.0/24")
	torAddrB    = netip.MustParseAddr("198.18.1.1")
	fabricNetB6 = netip.MustParsePrefix("2001:db8:1::/64")
	torAddrB6   = netip.MustParseAddr("2001:db8:1::1")
)

// makeSecondSubnet adds br1 to the fabric and the ToR's leg on it (eth1),
// and a route from the control-plane namespace to it via the ToR.
func (l *Lab) makeSecondSubnet(ctx context.Context) error {
	st := l.State()
	fab, tor := st.fabricNS(), st.torNS()
	progress(l.log, "adding the second underlay subnet %s behind the ToR", fabricNetB)
	steps := [][]string{
		{"-n", fab, "link", "add", "br1", "type", "bridge"},
		{"-n", fab, "link", "set", "br1", "up"},
		{"-n", fab, "link", "add", "v-torb", "type", "veth", "peer", "name", "eth1", "netns", tor},
		{"-n", fab, "link", "set", "v-torb", "master", "br1", "up"},
		{"-n", tor, "addr", "add", netip.PrefixFrom(torAddrB, fabricNetB.Bits()).String(), "dev", "eth1"},
		{"-n", tor, "link", "set", "eth1", "up"},
		{"-n", st.EtcdNS(), "route", "add", fabricNetB.String(), "via", torAddr.String(), "dev", "eth0"},
	}
	if st.DualStack {
		steps = append(steps, []string{"-n", tor, "-6", "addr", "add", netip.PrefixFrom(torAddrB6, fabricNetB6.Bits()).String(), "dev", "eth1", "nodad"})
	}
	for _, s := range steps {
		if err := ip(ctx, s...); err != nil {
			return err
		}
	}
	return nil
}

// inSecondSubnet reports whether the i-th node (0-based, in the order
// they were added) of a two-subnet lab lives in the second subnet.
func inSecondSubnet(i int) bool { return i%2 == 1 }

// secondSubnetPrefixes are the node addresses with the given last octet in
// the second subnet.
func secondSubnetPrefixes(host int) (v4, v6 netip.Prefix) {
	a := fabricNetB.Addr().As4()
	a[3] = byte(host)
	b := fabricNetB6.Addr().As16()
	b[15] = byte(host)
	return netip.PrefixFrom(netip.AddrFrom4(a), fabricNetB.Bits()), netip.PrefixFrom(netip.AddrFrom16(b), fabricNetB6.Bits())
}

// bridgeAndGateways are the fabric bridge and the ToR addresses of a node
// address's subnet.
func bridgeAndGateways(addr netip.Addr) (bridge string, gw4, gw6 netip.Addr) {
	if fabricNetB.Contains(addr) {
		return "br1", torAddrB, torAddrB6
	}
	return "br0", torAddr, torAddr6
}

// createPools writes the lab's pools with the VXLAN mode before the agents
// start (they create their default pools only when none exists).
func (l *Lab) createPools(ctx context.Context, mode api.VXLANMode) error {
	s, err := l.connect(ctx)
	if err != nil {
		return err
	}
	st := l.State()
	pools := []*api.IPPool{{Metadata: api.ObjectMeta{Name: "default-ipv4-ippool"}, Spec: api.IPPoolSpec{CIDR: st.Pool4().String(), NATOutgoing: true, VXLANMode: mode}}}
	if st.DualStack {
		pools = append(pools, &api.IPPool{Metadata: api.ObjectMeta{Name: "default-ipv6-ippool"}, Spec: api.IPPoolSpec{CIDR: PodPool6, VXLANMode: mode}})
	}
	progress(l.log, "creating the pools with vxlanMode %s", mode)
	for _, p := range pools {
		if err := p.Validate(); err != nil {
			return err
		}
		if _, err := s.Apply(ctx, p); err != nil {
			return fmt.Errorf("writing pool %s: %w", p.Metadata.Name, err)
		}
	}
	return nil
}
