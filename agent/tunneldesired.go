package agent

import (
	"maps"
	"net/netip"
	"slices"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/ipam"
)

// The pure half of the tunnel owner (tunnel.go): what one family's VXLAN
// device, its peers and the Tunnel route class should be, from the view.

// tunnelInputs is what desiredTunnel reads, all from the cluster view.
type tunnelInputs struct {
	node string
	// underlay is this node's underlay address of the family, with its
	// subnet (CrossSubnet compares against it); invalid: none.
	underlay netip.Prefix
	labels   map[string]string
	pools    []*api.IPPool
	nodes    []*api.Node
	blocks   []ipam.BlockInfo
	// borrowed are the addresses each node uses from blocks not affine
	// to it, by node.
	borrowed map[string][]ipam.BorrowedAddr
	// ready: this node's device exists with its tunnel address, so that
	// routes through it can be programmed.
	ready bool
}

// tunnelPlan is one family's desired tunnel state.
type tunnelPlan struct {
	is6 bool
	// wanted: an enabled pool of the family encapsulates and selects this
	// node, and the node has an underlay address of the family.
	wanted bool
	// pools are the names of those pools: the tunnel address comes from
	// one of them.
	pools  []string
	peers  []dataplane.VXLANPeer
	routes []dataplane.Route
	// native are the remote nodes whose encapsulated blocks are routed
	// natively (BGP) for now because they have no tunnel yet, sorted.
	native []string
	// direct are the remote nodes CrossSubnet routes natively (same
	// subnet), sorted.
	direct []string
	// owners names the node each route leads to.
	owners map[netip.Prefix]string
}

// poolSelects reports whether the pool is for the node (a pool without a
// nodeSelector is for every node).
func poolSelects(p *api.IPPool, labels map[string]string) bool {
	return p.Spec.NodeSelector == nil || p.Spec.NodeSelector.Matches(labels)
}

// nodeUnderlay is a node's underlay address of the family.
func nodeUnderlay(n *api.Node, is6 bool) (netip.Prefix, bool) {
	if is6 {
		return n.IPv6()
	}
	return n.IPv4()
}

// tunnels reports whether pool p makes a node with labels tunnel: it
// encapsulates, is enabled and selects the node.
func tunnels(p *api.IPPool, labels map[string]string) bool {
	return p.Spec.VXLANMode.Encapsulated() && !p.Spec.Disabled && poolSelects(p, labels)
}

// desiredTunnel computes the family's plan: a peer (static neighbour and
// forwarding entry) for every other node with a tunnel of the family, and
// a route `via <its tunnel address> dev <vxlan> onlink` for each of its
// blocks and borrowed addresses in an encapsulating pool — all of them
// with Always, only for nodes outside this node's subnet with
// CrossSubnet. A node without a tunnel yet gets no tunnel route: its
// traffic stays on the native (BGP-learned) path.
func desiredTunnel(in tunnelInputs, is6 bool) tunnelPlan {
	plan := tunnelPlan{is6: is6, owners: map[netip.Prefix]string{}}
	modes := map[string]api.VXLANMode{}
	for _, p := range in.pools {
		pr, err := p.Prefix()
		if err != nil || pr.Addr().Is6() != is6 {
			continue
		}
		// A disabled pool's blocks still hold pods: they keep its mode.
		modes[p.Metadata.Name] = p.Spec.VXLANMode
		if tunnels(p, in.labels) {
			plan.pools = append(plan.pools, p.Metadata.Name)
		}
	}
	plan.wanted = len(plan.pools) > 0 && in.underlay.IsValid()
	if !plan.wanted {
		return plan
	}
	dev := dataplane.VXLANDeviceName(is6)
	type remote struct {
		tunnel netip.Addr
		direct bool // same subnet: CrossSubnet routes natively
	}
	remotes := map[string]remote{}
	for _, n := range in.nodes {
		if n.Metadata.Name == in.node {
			continue
		}
		under, ok := nodeUnderlay(n, is6)
		if !ok {
			continue
		}
		tun, mac, ok := n.VXLANTunnel(is6)
		if !ok {
			continue
		}
		plan.peers = append(plan.peers, dataplane.VXLANPeer{TunnelAddr: tun, MAC: mac, Node: under.Addr()})
		remotes[n.Metadata.Name] = remote{tunnel: tun, direct: in.underlay.Masked().Contains(under.Addr())}
	}
	native, direct := map[string]bool{}, map[string]bool{}
	route := func(dst netip.Prefix, owner, pool string) {
		mode := modes[pool]
		if owner == "" || owner == in.node || !mode.Encapsulated() {
			return
		}
		r, ok := remotes[owner]
		switch {
		case !ok:
			native[owner] = true
		case mode == api.VXLANModeCrossSubnet && r.direct:
			direct[owner] = true
		case in.ready:
			plan.owners[dst.Masked()] = owner
			plan.routes = append(plan.routes, dataplane.Route{Dst: dst.Masked(), Dev: dev, Gateways: []netip.Addr{r.tunnel}, Onlink: true, Proto: dataplane.RouteProtoWorkload})
		}
	}
	pools := map[netip.Prefix]string{}
	for _, b := range in.blocks {
		if b.CIDR.Addr().Is6() != is6 {
			continue
		}
		pools[b.CIDR] = b.Pool
		if b.Confirmed {
			route(b.CIDR, b.Affinity, b.Pool)
		}
	}
	for owner, addrs := range in.borrowed {
		for _, a := range addrs {
			if a.Addr.Is6() == is6 {
				route(netip.PrefixFrom(a.Addr, a.Addr.BitLen()), owner, pools[a.Block])
			}
		}
	}
	dataplane.SortPeers(plan.peers)
	plan.routes = sortRoutes(plan.routes)
	plan.native = slices.Sorted(maps.Keys(native))
	plan.direct = slices.Sorted(maps.Keys(direct))
	return plan
}
