package ctl

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// Route protocols of Tabby's kernel routes (docs/contracts.md).
const (
	protoWorkload = 80
	protoBGP      = 81
)

// gatewayAddr is the fake gateway every pod routes through; the host end of
// the veth answers ARP for it by proxy ARP.
const gatewayAddr = api.WorkloadGatewayIPv4

// ExplainOptions are the arguments of explain pod.
type ExplainOptions struct {
	// Target is "NAMESPACE/NAME", "NAME" (in Namespace) or an address.
	Target    string
	Namespace string
	// Live compares with the kernel of the node this runs on (or of NetNS).
	Live  bool
	NetNS string
	// Node is the node Live runs on; "" = find it by its addresses.
	Node string
	// Runner runs ip and friends for Live.
	Runner Runner
}

// cluster is the datastore state explain reads.
type cluster struct {
	nodes    map[string]*api.Node
	names    []string // node names, sorted
	blocks   []ipam.BlockInfo
	pools    []ipam.PoolUsage
	allocs   []ipam.Allocation
	statuses map[string]api.AgentStatus
	gnps     []*api.GlobalNetworkPolicy
	tiers    []*api.Tier // stored; api.EffectiveTiers adds the built-in ones
	services []*api.Service
	ippools  []*api.IPPool // for their VXLAN modes (tunnel.go)
}

func (c *Client) loadCluster(ctx context.Context) (*cluster, error) {
	cl := &cluster{nodes: map[string]*api.Node{}}
	nodes, _, err := datastore.ListAs[*api.Node](ctx, c.Store, api.KindNode, "")
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	for _, n := range nodes {
		cl.nodes[n.Metadata.Name] = n
		cl.names = append(cl.names, n.Metadata.Name)
	}
	if cl.blocks, err = c.IPAM.Blocks(ctx); err != nil {
		return nil, err
	}
	if cl.pools, err = c.IPAM.Usage(ctx); err != nil {
		return nil, err
	}
	if cl.allocs, err = c.IPAM.Allocations(ctx); err != nil {
		return nil, err
	}
	if cl.statuses, err = c.agentStatuses(ctx); err != nil {
		return nil, err
	}
	if cl.gnps, _, err = datastore.ListAs[*api.GlobalNetworkPolicy](ctx, c.Store, api.KindGlobalNetworkPolicy, ""); err != nil {
		return nil, fmt.Errorf("listing global network policies: %w", err)
	}
	if cl.tiers, _, err = datastore.ListAs[*api.Tier](ctx, c.Store, api.KindTier, ""); err != nil {
		return nil, fmt.Errorf("listing tiers: %w", err)
	}
	if cl.services, _, err = datastore.ListAs[*api.Service](ctx, c.Store, api.KindService, ""); err != nil {
		return nil, fmt.Errorf("listing service records: %w", err)
	}
	if err := c.loadPools(ctx, cl); err != nil {
		return nil, err
	}
	return cl, nil
}

// nodeAddr is a node's BGP address, invalid when it has none.
func (cl *cluster) nodeAddr(name string) netip.Addr {
	if n, ok := cl.nodes[name]; ok {
		if p, ok := n.IPv4(); ok {
			return p.Addr()
		}
	}
	return netip.Addr{}
}

// nodeByAddr names the node with a BGP address, "" when none has it.
func (cl *cluster) nodeByAddr(a netip.Addr) string {
	for _, name := range cl.names {
		if cl.nodeAddr(name) == a {
			return name
		}
	}
	return ""
}

func (cl *cluster) blockOf(a netip.Addr) (ipam.BlockInfo, bool) {
	for _, b := range cl.blocks {
		if b.CIDR.Contains(a) {
			return b, true
		}
	}
	return ipam.BlockInfo{}, false
}

func (cl *cluster) poolOf(a netip.Addr) (ipam.PoolUsage, bool) {
	for _, p := range cl.pools {
		if p.Name != "" && p.CIDR.Contains(a) {
			return p, true
		}
	}
	return ipam.PoolUsage{}, false
}

// findEndpoints resolves the target to workload endpoints.
func (c *Client) findEndpoints(ctx context.Context, o ExplainOptions) ([]*api.WorkloadEndpoint, error) {
	if addr, err := netip.ParseAddr(o.Target); err == nil {
		byAddr, err := c.endpointsByAddr(ctx)
		if err != nil {
			return nil, err
		}
		if weps := byAddr[addr]; len(weps) > 0 {
			return weps, nil
		}
		return nil, fmt.Errorf("no workload endpoint has address %s (see tabbyctl ipam show --ip %s)", addr, addr)
	}
	ns, name, ok := strings.Cut(o.Target, "/")
	if !ok {
		ns, name = o.Namespace, o.Target
		if ns == "" {
			ns = "default"
		}
	}
	if ns == "" || name == "" {
		return nil, fmt.Errorf("pod %q: want NAMESPACE/NAME, NAME or an IP address", o.Target)
	}
	weps, _, err := datastore.ListAs[*api.WorkloadEndpoint](ctx, c.Store, api.KindWorkloadEndpoint, ns)
	if err != nil {
		return nil, fmt.Errorf("listing workload endpoints: %w", err)
	}
	var out []*api.WorkloadEndpoint
	for _, w := range weps {
		if w.Spec.Pod == name || w.Metadata.Name == name {
			out = append(out, w)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("pod %s/%s has no workload endpoint: it is not a Tabby pod, not set up yet, or gone", ns, name)
	}
	return out, nil
}

// Explain tells a pod's path from the datastore: endpoint, routes, block,
// BGP, the routes other nodes should have and the policies that select it.
// With Live it also compares the kernel of this node with what it should
// have, and returns an error when they disagree.
func (c *Client) Explain(ctx context.Context, out io.Writer, o ExplainOptions) error {
	weps, err := c.findEndpoints(ctx, o)
	if err != nil {
		return err
	}
	cl, err := c.loadCluster(ctx)
	if err != nil {
		return err
	}
	var live *liveState
	if o.Live {
		if live, err = readLive(ctx, o, cl); err != nil {
			return err
		}
	}
	var b strings.Builder
	var disagree int
	for i, w := range weps {
		if i > 0 {
			b.WriteString("\n")
		}
		nps, _, err := datastore.ListAs[*api.NetworkPolicy](ctx, c.Store, api.KindNetworkPolicy, w.Metadata.Namespace)
		if err != nil {
			return fmt.Errorf("listing network policies: %w", err)
		}
		e := explainEndpoint(cl, w, nps)
		e.write(&b)
		if live != nil {
			disagree += live.check(ctx, &b, e)
		}
	}
	if _, err := io.WriteString(out, b.String()); err != nil {
		return err
	}
	if disagree > 0 {
		return fmt.Errorf("the kernel of %s disagrees with the datastore in %s", live.node, plural(disagree, "place", "places"))
	}
	return nil
}

// explanation is what explain found for one endpoint.
type explanation struct {
	cl       *cluster
	wep      *api.WorkloadEndpoint
	node     string
	nodeAddr netip.Addr
	hostIf   string
	addrs    []addrPath
	policies []string
	ingress  []string
	egress   []string
	notes    []string
	// services are the Services whose ready endpoints include the pod.
	services []*api.Service
}

// addrPath is the path of one of the endpoint's addresses.
type addrPath struct {
	addr      netip.Addr
	alloc     *ipam.Allocation
	pool      *ipam.PoolUsage
	block     *ipam.BlockInfo
	borrowed  bool
	advertise netip.Prefix // what carries it over BGP; invalid = nothing
	// origin is the node that advertises it, originAddr its address.
	origin     string
	originAddr netip.Addr
	exported   bool
}

func explainEndpoint(cl *cluster, w *api.WorkloadEndpoint, nps []*api.NetworkPolicy) *explanation {
	e := &explanation{cl: cl, wep: w, node: w.Spec.Node, nodeAddr: cl.nodeAddr(w.Spec.Node), hostIf: w.Spec.InterfaceName}
	if _, ok := cl.nodes[e.node]; !ok {
		e.notes = append(e.notes, fmt.Sprintf("node %s has no Node resource", e.node))
	}
	addrs, _ := w.Addrs() // entries that do not parse: ipam check reports them
	for _, a := range addrs {
		p := addrPath{addr: a}
		if al, ok := findAllocation(cl.allocs, a); ok {
			p.alloc = &al
			if al.Handle != w.Spec.IPAMHandle && w.Spec.IPAMHandle != "" {
				e.notes = append(e.notes, fmt.Sprintf("%s is allocated to handle %s, but the endpoint names handle %s", a, al.Handle, w.Spec.IPAMHandle))
			}
		} else {
			e.notes = append(e.notes, fmt.Sprintf("%s is not allocated in IPAM: it may be handed to another pod", a))
		}
		if pool, ok := cl.poolOf(a); ok {
			p.pool = &pool
		}
		if blk, ok := cl.blockOf(a); ok {
			p.block = &blk
			p.borrowed = blk.Affinity != e.node
			p.exported = !blk.DisableBGPExport
			if p.borrowed {
				p.advertise = netip.PrefixFrom(a, 32)
			} else {
				p.advertise = blk.CIDR
			}
			p.origin, p.originAddr = e.node, e.nodeAddr
		}
		e.addrs = append(e.addrs, p)
	}
	e.policiesFor(cl, w, nps)
	e.services = servicesOf(cl.services, addrs)
	return e
}

// policiesFor lists the policies that select the endpoint: namespaced
// NetworkPolicies by podSelector, GlobalNetworkPolicies (in order) by
// selector and namespaceSelector. A GlobalNetworkPolicy without a selector
// selects every endpoint, as in Calico.
func (e *explanation) policiesFor(cl *cluster, w *api.WorkloadEndpoint, nps []*api.NetworkPolicy) {
	gnps := slices.Clone(cl.gnps)
	tierIdx := map[string]int{}
	for i, t := range api.EffectiveTiers(cl.tiers) {
		tierIdx[t.Metadata.Name] = i
	}
	slices.SortStableFunc(gnps, func(x, y *api.GlobalNetworkPolicy) int {
		if c := cmp.Compare(tierIdx[x.TierName()], tierIdx[y.TierName()]); c != 0 {
			return c
		}
		switch {
		case x.Spec.Order == nil && y.Spec.Order == nil:
		case x.Spec.Order == nil:
			return 1
		case y.Spec.Order == nil:
			return -1
		default:
			if c := cmp.Compare(*x.Spec.Order, *y.Spec.Order); c != 0 {
				return c
			}
		}
		return strings.Compare(x.Metadata.Name, y.Metadata.Name)
	})
	for _, g := range gnps {
		if g.Spec.Selector != nil && !g.Spec.Selector.Matches(w.Metadata.Labels) {
			continue
		}
		if g.Spec.NamespaceSelector != nil && !g.Spec.NamespaceSelector.Matches(w.Spec.NamespaceLabels) {
			continue
		}
		order := "no order"
		if g.Spec.Order != nil {
			order = "order " + strconv.FormatFloat(*g.Spec.Order, 'g', -1, 64)
		}
		in, eg := g.AppliesTo()
		name := "GlobalNetworkPolicy " + g.Metadata.Name
		if _, ok := tierIdx[g.TierName()]; !ok {
			e.policies = append(e.policies, fmt.Sprintf("%s (tier %s does not exist: ignored)", name, g.TierName()))
			continue
		}
		if g.TierName() != api.TierDefault {
			// Tier default is every policy's without tiers: named only
			// when it is another.
			name += " [tier " + g.TierName() + "]"
		}
		e.policies = append(e.policies, fmt.Sprintf("%s (%s, selector %s): %s", name, order, gnpSelector(g.Spec.Selector), types(in, eg)))
		e.addDirections(name, in, eg)
	}
	for _, np := range nps {
		if !np.Spec.PodSelector.Matches(w.Metadata.Labels) {
			continue
		}
		in, eg := np.AppliesTo()
		name := "NetworkPolicy " + np.Metadata.Namespace + "/" + np.Metadata.Name
		e.policies = append(e.policies, fmt.Sprintf("%s (podSelector %s): %s", name, selector(&np.Spec.PodSelector), types(in, eg)))
		e.addDirections(name, in, eg)
	}
}

func (e *explanation) addDirections(name string, in, eg bool) {
	if in {
		e.ingress = append(e.ingress, name)
	}
	if eg {
		e.egress = append(e.egress, name)
	}
}
