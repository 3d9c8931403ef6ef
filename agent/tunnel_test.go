package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/agent/routetable"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/cni"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/syncer"
)

func tunnelNode(name, addr, tunnel string) *api.Node {
	n := &api.Node{Metadata: api.ObjectMeta{Name: name, Labels: map[string]string{"rack": "r1"}}, Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: addr}}}
	if tunnel != "" {
		n.Spec.IPv4VXLANTunnelAddr, n.Spec.VXLANTunnelMACAddr = tunnel, dataplane.TunnelMAC(name, false).String()
	}
	return n
}

func TestDesiredTunnel(t *testing.T) {
	pool := func(mode api.VXLANMode) *api.IPPool {
		return &api.IPPool{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", VXLANMode: mode}}
	}
	nodes := []*api.Node{
		tunnelNode("n1", "198.18.1.11/24", "10.244.0.0"),
		tunnelNode("n2", "198.18.1.12/24", "10.244.1.0"), // same subnet
		tunnelNode("n3", "198.18.2.13/24", "10.244.2.0"), // behind the router
		tunnelNode("n4", "198.18.2.14/24", ""),           // no tunnel yet
	}
	blk := func(cidr, node string) ipam.BlockInfo {
		return ipam.BlockInfo{CIDR: netip.MustParsePrefix(cidr), Pool: "p", Affinity: node, Confirmed: true}
	}
	blocks := []ipam.BlockInfo{blk("10.244.0.0/26", "n1"), blk("10.244.1.0/26", "n2"), blk("10.244.2.0/26", "n3"), blk("10.244.3.0/26", "n4"),
		{CIDR: netip.MustParsePrefix("10.244.4.0/26"), Pool: "p", Affinity: "n3"}} // claim pending: not routed
	borrowed := map[string][]ipam.BorrowedAddr{"n3": {{Addr: netip.MustParseAddr("10.244.1.9"), Node: "n3", Block: netip.MustParsePrefix("10.244.1.0/26"), BlockNode: "n2"}}}
	in := func(p *api.IPPool, ready bool) tunnelInputs {
		return tunnelInputs{node: "n1", underlay: netip.MustParsePrefix("198.18.1.11/24"), labels: map[string]string{"rack": "r1"},
			pools: []*api.IPPool{p}, nodes: nodes, blocks: blocks, borrowed: borrowed, ready: ready}
	}
	tun := func(dst, via string) string {
		return fmt.Sprintf("%s via %s dev vxlan.tabby proto 80 onlink", dst, via)
	}
	selective := pool(api.VXLANModeAlways)
	selective.Spec.NodeSelector = &api.LabelSelector{MatchLabels: map[string]string{"rack": "r9"}}
	tests := []struct {
		name           string
		in             tunnelInputs
		is6            bool
		wanted         bool
		routes         []string
		peers          int
		native, direct []string
	}{
		{"always", in(pool(api.VXLANModeAlways), true), false, true,
			[]string{tun("10.244.1.0/26", "10.244.1.0"), tun("10.244.1.9/32", "10.244.2.0"), tun("10.244.2.0/26", "10.244.2.0")}, 2, []string{"n4"}, nil},
		{"cross-subnet tunnels only behind the router", in(pool(api.VXLANModeCrossSubnet), true), false, true,
			[]string{tun("10.244.1.9/32", "10.244.2.0"), tun("10.244.2.0/26", "10.244.2.0")}, 2, []string{"n4"}, []string{"n2"}},
		{"not ready: no routes through a device that is not there", in(pool(api.VXLANModeAlways), false), false, true, nil, 2, []string{"n4"}, nil},
		{"never", in(pool(api.VXLANModeNever), true), false, false, nil, 0, nil, nil},
		{"unset is never", in(pool(""), true), false, false, nil, 0, nil, nil},
		{"a pool for other nodes", in(selective, true), false, false, nil, 0, nil, nil},
		{"no IPv6 pool", in(pool(api.VXLANModeAlways), true), true, false, nil, 0, nil, nil},
		{"no underlay address", func() tunnelInputs { i := in(pool(api.VXLANModeAlways), true); i.underlay = netip.Prefix{}; return i }(), false, false, nil, 0, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan := desiredTunnel(tt.in, tt.is6)
			var got []string
			for _, r := range plan.routes {
				got = append(got, r.String())
			}
			if plan.wanted != tt.wanted || len(plan.peers) != tt.peers {
				t.Errorf("wanted %v peers %d, want %v %d", plan.wanted, len(plan.peers), tt.wanted, tt.peers)
			}
			if diff := cmp.Diff(tt.routes, got); diff != "" {
				t.Errorf("routes (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.native, plan.native); diff != "" {
				t.Errorf("native (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.direct, plan.direct); diff != "" {
				t.Errorf("direct (-want +got):\n%s", diff)
			}
		})
	}
}

// tunnelEnv is one simulated node's tunnel owner over a shared etcd.
type tunnelEnv struct {
	owner  *tunnelOwner
	vx     *fake.VXLAN
	kernel *fake.Routes
	view   *syncer.Syncer
}

func newTunnelEnv(t testing.TB, store *datastore.Store, node, addr string) *tunnelEnv {
	t.Helper()
	v := startView(t, store)
	e := &tunnelEnv{vx: &fake.VXLAN{}, kernel: fake.NewRoutes(), view: v}
	e.owner = newTunnelOwner(node, netip.MustParsePrefix(addr), netip.Prefix{}, v, store, ipam.New(store), e.vx, routetable.New(e.kernel, 0), testLogger())
	return e
}

// passUntil runs passes until cond holds (the view trails etcd).
func (e *tunnelEnv) passUntil(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		perr := e.owner.pass(context.Background())
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v (last pass: %v)", what, err, perr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestTunnelOwnerAlwaysThenNever(t *testing.T) {
	ctx := context.Background()
	store := storetest.New(t)
	pool := &api.IPPool{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", VXLANMode: api.VXLANModeAlways}}
	if _, err := store.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*api.Node{tunnelNode("n1", "198.18.1.11/24", ""), tunnelNode("n2", "198.18.2.12/24", "")} {
		if _, err := store.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	e1, e2 := newTunnelEnv(t, store, "n1", "198.18.1.11/24"), newTunnelEnv(t, store, "n2", "198.18.2.12/24")
	al := ipam.New(store)
	tunnelOf := func(e *tunnelEnv, node string) (netip.Addr, error) {
		n, ok := e.view.Node(node)
		if !ok {
			return netip.Addr{}, errors.New("no node")
		}
		a, mac, ok := n.VXLANTunnel(false)
		if !ok {
			return netip.Addr{}, fmt.Errorf("node %s records no tunnel", node)
		}
		if mac.String() != dataplane.TunnelMAC(node, false).String() {
			return netip.Addr{}, fmt.Errorf("node %s records mac %v", node, mac)
		}
		return a, nil
	}
	var t1, t2 netip.Addr
	e1.passUntil(t, "n1 records its tunnel", func() (err error) { t1, err = tunnelOf(e1, "n1"); return err })
	e2.passUntil(t, "n2 records its tunnel and sees n1's", func() (err error) {
		if t2, err = tunnelOf(e2, "n2"); err != nil {
			return err
		}
		_, err = tunnelOf(e2, "n1")
		return err
	})
	for node, a := range map[string]netip.Addr{"n1": t1, "n2": t2} {
		held, err := al.AddressesByHandle(ctx, ipam.TunnelHandle(node))
		if err != nil || len(held) != 1 || held[0] != a {
			t.Errorf("handle %s holds %v, %v; want %v", ipam.TunnelHandle(node), held, err, a)
		}
	}
	block2 := netip.PrefixFrom(t2, 26).Masked()
	wantRoute := fmt.Sprintf("%s via %s dev vxlan.tabby proto 80 onlink", block2, t2)
	e1.passUntil(t, "n1 routes n2's block through the tunnel", func() error {
		if !strings.Contains(strings.Join(e1.kernel.Lines(), "\n"), wantRoute) {
			return fmt.Errorf("kernel has %q, want %q", e1.kernel.Lines(), wantRoute)
		}
		return nil
	})
	wantDev := fmt.Sprintf("vxlan.tabby vni 4096 port 4789 local 198.18.1.11 mtu 1450 addr %s\n  %s lladdr %s dst 198.18.2.12\n", t1, t2, dataplane.TunnelMAC("n2", false))
	if got := e1.vx.String(); got != wantDev {
		t.Errorf("n1's device:\n%s\nwant:\n%s", got, wantDev)
	}
	st := e1.owner.status()[0]
	if st.Mode != "Always" || st.Routes != 1 || st.Peers != 1 || st.Paths[0].Node != "n2" || st.Error != "" {
		t.Errorf("status = %+v", st)
	}
	if st6 := e1.owner.status()[1]; st6.Mode != "off" {
		t.Errorf("IPv6 status = %+v, want off", st6)
	}
	if g := tunnelGuard(e1.view); g == nil || g.Port != 4789 || fmt.Sprint(g.Nodes) != "[198.18.1.11 198.18.2.12]" {
		t.Errorf("tunnel guard = %+v, want port 4789 and both nodes", g)
	}
	if m := e1.owner.podMTU(); m != 1450 {
		t.Errorf("pod MTU with an Always pool = %d, want 1450", m)
	}
	h := &cniHandler{autoMTU: e1.owner.podMTU}
	if m := h.podMTU(&cni.NetConf{}); m != 1450 {
		t.Errorf("CNI pod MTU without mtu in the config = %d, want 1450", m)
	}
	if m := h.podMTU(&cni.NetConf{MTU: 1400}); m != 1400 {
		t.Errorf("CNI pod MTU with mtu 1400 in the config = %d, want the config's", m)
	}
	// A pass with nothing new changes nothing.
	ops := len(e1.vx.Ops())
	if err := e1.owner.pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got := e1.vx.Ops(); len(got) != ops {
		t.Errorf("an idle pass changed the device: %v", got[ops:])
	}

	// Never: the device, the routes, the record and the address go.
	p, err := datastore.GetAs[*api.IPPool](ctx, store, api.KindIPPool, "", "p")
	if err != nil {
		t.Fatal(err)
	}
	p.Spec.VXLANMode = api.VXLANModeNever
	if _, err := datastore.UpdateAs(ctx, store, p); err != nil {
		t.Fatal(err)
	}
	e1.owner.drain = 300 * time.Millisecond
	e1.passUntil(t, "n1 clears its Node's tunnel fields", func() error {
		if n, _ := e1.view.Node("n1"); n.Spec.IPv4VXLANTunnelAddr != "" || n.Spec.VXLANTunnelMACAddr != "" {
			return fmt.Errorf("node record keeps %q %q", n.Spec.IPv4VXLANTunnelAddr, n.Spec.VXLANTunnelMACAddr)
		}
		return nil
	})
	// Draining: the routes are gone at once, the device stays a moment
	// for peers still sending through it.
	if lines := strings.Join(e1.kernel.Lines(), "\n"); strings.Contains(lines, "vxlan") {
		t.Errorf("tunnel routes left after the record was cleared:\n%s", lines)
	}
	if e1.vx.String() == "" {
		t.Error("the device went with the record: peers still sending through it lose packets")
	}
	e1.passUntil(t, "n1 removes its device after the drain", func() error {
		if e1.vx.String() != "" {
			return fmt.Errorf("device left: %s", e1.vx.String())
		}
		return nil
	})
	if m := e1.owner.podMTU(); m != 0 {
		t.Errorf("pod MTU without an encapsulating pool = %d, want 0 (the default)", m)
	}
	if g := tunnelGuard(e1.view); g != nil {
		t.Errorf("tunnel guard without an encapsulating pool: %+v", g)
	}
	if lines := strings.Join(e1.kernel.Lines(), "\n"); strings.Contains(lines, "vxlan") {
		t.Errorf("tunnel routes left:\n%s", lines)
	}
	if held, err := al.AddressesByHandle(ctx, ipam.TunnelHandle("n1")); err != nil || len(held) != 0 {
		t.Errorf("n1's tunnel handle still holds %v, %v", held, err)
	}
	// Node GC frees a dead node's tunnel address with its others.
	if err := al.ReleaseNode(ctx, "n2", true); err != nil {
		t.Fatal(err)
	}
	if held, err := al.AddressesByHandle(ctx, ipam.TunnelHandle("n2")); err != nil || len(held) != 0 {
		t.Errorf("after ReleaseNode n2's tunnel handle holds %v, %v", held, err)
	}
}

// A VNI and port another device holds: a clear error, no device, no
// record, the address back in the pool, no tunnel routes.
func TestTunnelOwnerClash(t *testing.T) {
	ctx := context.Background()
	store := storetest.New(t)
	if _, err := store.Create(ctx, &api.IPPool{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", VXLANMode: api.VXLANModeAlways}}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Create(ctx, tunnelNode("n1", "198.18.1.11/24", "")); err != nil {
		t.Fatal(err)
	}
	e := newTunnelEnv(t, store, "n1", "198.18.1.11/24")
	e.vx.Foreign = map[string]string{"flannel.1": "4096/4789/false"}
	var err error
	e.passUntil(t, "the clash is reported", func() error {
		if err = e.owner.pass(ctx); errors.Is(err, dataplane.ErrVXLANClash) {
			return nil
		}
		return fmt.Errorf("pass = %v, want ErrVXLANClash", err)
	})
	if !strings.Contains(err.Error(), "flannel.1 already uses VNI 4096 on port 4789") {
		t.Errorf("error %q does not name the device", err)
	}
	if st := e.owner.status()[0]; !strings.Contains(st.Error, "flannel.1") {
		t.Errorf("status error = %q", st.Error)
	}
	if n, _ := e.view.Node("n1"); n.Spec.IPv4VXLANTunnelAddr != "" {
		t.Errorf("node records %q despite the clash", n.Spec.IPv4VXLANTunnelAddr)
	}
	if held, err := ipam.New(store).AddressesByHandle(ctx, ipam.TunnelHandle("n1")); err != nil || len(held) != 0 {
		t.Errorf("tunnel handle holds %v, %v after the clash", held, err)
	}
	if e.vx.String() != "" {
		t.Errorf("device made: %s", e.vx.String())
	}
}

// A tunnel that worked and then cannot be made (the cluster's VNI changed
// to one another device holds) is withdrawn from the Node, so that peers
// stop tunnelling to it; its address stays held.
func TestTunnelOwnerClashAfterRecorded(t *testing.T) {
	ctx := context.Background()
	store := storetest.New(t)
	if _, err := store.Create(ctx, &api.IPPool{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", VXLANMode: api.VXLANModeAlways}}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Create(ctx, tunnelNode("n1", "198.18.1.11/24", "")); err != nil {
		t.Fatal(err)
	}
	e := newTunnelEnv(t, store, "n1", "198.18.1.11/24")
	var addr netip.Addr
	e.passUntil(t, "n1 records its tunnel", func() error {
		n, _ := e.view.Node("n1")
		a, _, ok := n.VXLANTunnel(false)
		if !ok {
			return errors.New("no tunnel recorded")
		}
		addr = a
		return nil
	})
	e.vx.Foreign = map[string]string{"flannel.1": "4097/4789/false"}
	vni := uint32(4097)
	if _, err := store.Create(ctx, &api.BGPConfiguration{Metadata: api.ObjectMeta{Name: api.SingletonName}, Spec: api.BGPConfigurationSpec{VXLANVNI: &vni}}); err != nil {
		t.Fatal(err)
	}
	e.passUntil(t, "n1 withdraws its tunnel from the Node", func() error {
		n, _ := e.view.Node("n1")
		if n.Spec.IPv4VXLANTunnelAddr != "" || n.Spec.VXLANTunnelMACAddr != "" {
			return fmt.Errorf("node still records %q", n.Spec.IPv4VXLANTunnelAddr)
		}
		return nil
	})
	if st := e.owner.status()[0]; !strings.Contains(st.Error, "flannel.1 already uses VNI 4097") {
		t.Errorf("status error = %q", st.Error)
	}
	if held, err := ipam.New(store).AddressesByHandle(ctx, ipam.TunnelHandle("n1")); err != nil || len(held) != 1 || held[0] != addr {
		t.Errorf("tunnel handle holds %v, %v; want %v kept for the next attempt", held, err, addr)
	}
	// The clash gone, the same address comes back.
	e.vx.Foreign = nil
	e.passUntil(t, "n1 records its tunnel again", func() error {
		n, _ := e.view.Node("n1")
		if a, _, ok := n.VXLANTunnel(false); !ok || a != addr {
			return fmt.Errorf("node records %v %v, want %v", a, ok, addr)
		}
		return nil
	})
	if !strings.Contains(e.vx.String(), "vni 4097") {
		t.Errorf("device after the clash: %s", e.vx.String())
	}
}

// When the peers cannot all be programmed, routes go only via the peers
// the device has: one bad peer does not send every other node's traffic
// off the tunnel, and no route points at a peer that is not there.
func TestRoutesViaPeers(t *testing.T) {
	vx := &fake.VXLAN{}
	if _, err := vx.Ensure(dataplane.VXLANSpec{Name: "vxlan.tabby", VNI: 4096, Port: 4789, Local: netip.MustParseAddr("198.18.0.11")}); err != nil {
		t.Fatal(err)
	}
	good := netip.MustParseAddr("10.244.1.0")
	if err := vx.SetPeers("vxlan.tabby", []dataplane.VXLANPeer{{TunnelAddr: good, MAC: dataplane.TunnelMAC("n2", false), Node: netip.MustParseAddr("198.18.0.12")}}); err != nil {
		t.Fatal(err)
	}
	route := func(dst string, via netip.Addr) dataplane.Route {
		return dataplane.Route{Dst: netip.MustParsePrefix(dst), Dev: "vxlan.tabby", Gateways: []netip.Addr{via}, Onlink: true}
	}
	got := routesViaPeers(vx, "vxlan.tabby", []dataplane.Route{route("10.244.1.0/26", good), route("10.244.2.0/26", netip.MustParseAddr("10.244.2.0"))})
	if len(got) != 1 || got[0].Dst.String() != "10.244.1.0/26" {
		t.Errorf("routes via programmed peers = %v, want only 10.244.1.0/26", got)
	}
	if got := routesViaPeers(vx, "vxlan-v6.tabby", []dataplane.Route{route("10.244.1.0/26", good)}); got != nil {
		t.Errorf("routes via a device that is not there = %v, want none", got)
	}
}
