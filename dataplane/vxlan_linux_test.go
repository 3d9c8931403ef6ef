package dataplane_test

import (
	"errors"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
)

// vxlanNodes makes two "node" namespaces joined by a veth pair (up0 in
// each): a 198.18.10.0/24 and a 2001:db8:10::/64 underlay, nothing else.
func vxlanNodes(t *testing.T) (a, b testkit.NetNS) {
	t.Helper()
	a, b = testkit.NewNetNS(t, "tbvx-a"), testkit.NewNetNS(t, "tbvx-b")
	run(t, "ip", "-n", a.Name, "link", "add", "up0", "type", "veth", "peer", "name", "up0", "netns", b.Name)
	for i, n := range []testkit.NetNS{a, b} {
		d := string(rune('1' + i))
		run(t, "ip", "-n", n.Name, "addr", "add", "198.18.10."+d+"/24", "dev", "up0")
		run(t, "ip", "-n", n.Name, "addr", "add", "2001:db8:10::"+d+"/64", "dev", "up0", "nodad")
		run(t, "ip", "-n", n.Name, "link", "set", "up0", "up")
	}
	return a, b
}

func newVXLAN(t *testing.T, n testkit.NetNS) *dataplane.NetlinkVXLAN {
	t.Helper()
	v, err := dataplane.NewVXLAN(n.Path)
	if err != nil {
		t.Fatalf("NewVXLAN: %v", err)
	}
	t.Cleanup(func() { v.Close() })
	return v
}

func newRoutesIn(t *testing.T, n testkit.NetNS) *dataplane.NetlinkRoutes {
	t.Helper()
	r, err := dataplane.NewRoutes(n.Path)
	if err != nil {
		t.Fatalf("NewRoutes: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// tunnelEnd is one node's side of the test tunnel in one family.
type tunnelEnd struct {
	node   string
	local  netip.Addr
	tunnel netip.Addr
	block  netip.Prefix
	pod    netip.Addr
}

func TestPrivilegedVXLANPing(t *testing.T) {
	testkit.RequirePrivileged(t, "ip", "ping", "nsenter")
	nsA, nsB := vxlanNodes(t)
	ns := []testkit.NetNS{nsA, nsB}
	vx := []*dataplane.NetlinkVXLAN{newVXLAN(t, nsA), newVXLAN(t, nsB)}
	rt := []*dataplane.NetlinkRoutes{newRoutesIn(t, nsA), newRoutesIn(t, nsB)}
	fams := []struct {
		is6  bool
		ends [2]tunnelEnd
	}{
		{false, [2]tunnelEnd{
			{"a", netip.MustParseAddr("198.18.10.1"), netip.MustParseAddr("10.244.0.0"), netip.MustParsePrefix("10.244.0.0/26"), netip.MustParseAddr("10.244.0.5")},
			{"b", netip.MustParseAddr("198.18.10.2"), netip.MustParseAddr("10.244.1.0"), netip.MustParsePrefix("10.244.1.0/26"), netip.MustParseAddr("10.244.1.5")},
		}},
		{true, [2]tunnelEnd{
			{"a", netip.MustParseAddr("2001:db8:10::1"), netip.MustParseAddr("fd00:10:244::"), netip.MustParsePrefix("fd00:10:244::/122"), netip.MustParseAddr("fd00:10:244::5")},
			{"b", netip.MustParseAddr("2001:db8:10::2"), netip.MustParseAddr("fd00:10:244::40"), netip.MustParsePrefix("fd00:10:244::40/122"), netip.MustParseAddr("fd00:10:244::45")},
		}},
	}
	for i := range ns {
		// A stand-in pod address on each node.
		// (This kernel has no dummy devices: the loopback holds it.)
		for _, f := range fams {
			run(t, "ip", "-n", ns[i].Name, "addr", "add", f.ends[i].pod.String()+"/"+strconv.Itoa(f.ends[i].pod.BitLen()), "dev", "lo", "nodad")
		}
	}
	for _, f := range fams {
		dev := dataplane.VXLANDeviceName(f.is6)
		for i := range ns {
			me, peer := f.ends[i], f.ends[1-i]
			spec := dataplane.VXLANSpec{Name: dev, VNI: 4096, Port: 4789, Local: me.local, MAC: dataplane.TunnelMAC(me.node, f.is6), Addr: me.tunnel}
			st, err := vx[i].Ensure(spec)
			if err != nil {
				t.Fatalf("Ensure(%s) on %s: %v", dev, me.node, err)
			}
			wantMTU := 1500 - dataplane.VXLANOverhead(f.is6)
			if !st.Created || st.MTU != wantMTU || st.MAC.String() != spec.MAC.String() || st.VNI != 4096 || st.Port != 4789 || st.Local != me.local {
				t.Errorf("Ensure(%s) on %s = %+v, want created, mtu %d, mac %v", dev, me.node, st, wantMTU, spec.MAC)
			}
			if diff := cmp.Diff([]netip.Addr{me.tunnel}, st.Addrs, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
				t.Errorf("tunnel addresses (-want +got):\n%s", diff)
			}
			// Idempotent: the same spec again changes nothing.
			again, err := vx[i].Ensure(spec)
			if err != nil || again.Created || again.MAC.String() != st.MAC.String() {
				t.Errorf("second Ensure = %+v, %v; want the same device, not created", again, err)
			}
			peers := []dataplane.VXLANPeer{{TunnelAddr: peer.tunnel, MAC: dataplane.TunnelMAC(peer.node, f.is6), Node: peer.local}}
			for range 2 {
				if err := vx[i].SetPeers(dev, peers); err != nil {
					t.Fatalf("SetPeers on %s: %v", me.node, err)
				}
			}
			got, err := vx[i].Peers(dev)
			if err != nil {
				t.Fatal(err)
			}
			if g, w := peerStrings(got), peerStrings(peers); g != w {
				t.Errorf("Peers on %s = %s, want %s", me.node, g, w)
			}
			route := dataplane.Route{Dst: peer.block, Dev: dev, Gateways: []netip.Addr{peer.tunnel}, Onlink: true, Proto: dataplane.RouteProtoWorkload}
			if err := rt[i].Replace(route); err != nil {
				t.Fatalf("Replace(%v) on %s: %v", route, me.node, err)
			}
			listed, err := rt[i].List(dataplane.RouteProtoWorkload)
			if err != nil {
				t.Fatal(err)
			}
			if !containsSatisfied(route, listed) {
				t.Errorf("on %s the kernel lists %v, want %v (onlink read back)", me.node, listed, route)
			}
		}
		for i := range ns {
			dst := f.ends[1-i].pod.String()
			if out, err := exec.Command("nsenter", "--net="+ns[i].Path, "ping", "-c", "2", "-i", "0.2", "-W", "2", dst).CombinedOutput(); err != nil {
				t.Errorf("ping %s from %s through %s: %v\n%s", dst, f.ends[i].node, dev, err, out)
			}
		}
		if tx := txPackets(t, nsA, dev); tx == 0 {
			t.Errorf("%s on a sent no packets: the pings did not go through the tunnel", dev)
		}
	}

	// A changed VNI makes the device again (the kernel cannot change it).
	spec := dataplane.VXLANSpec{Name: dataplane.VXLANDevice4, VNI: 4097, Port: 4789, Local: fams[0].ends[0].local, Addr: fams[0].ends[0].tunnel}
	st, err := vx[0].Ensure(spec)
	if err != nil || !st.Created || st.VNI != 4097 {
		t.Errorf("Ensure with VNI 4097 = %+v, %v; want a new device with VNI 4097", st, err)
	}
	// Peers nobody wants go.
	if err := vx[1].SetPeers(dataplane.VXLANDevice4, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := vx[1].Peers(dataplane.VXLANDevice4); err != nil || len(got) != 0 {
		t.Errorf("Peers after SetPeers(nil) = %v, %v; want none", got, err)
	}
	if removed, err := dataplane.RemoveVXLANDevices(nsB.Path); err != nil || strings.Join(removed, ",") != "vxlan.tabby,vxlan-v6.tabby" {
		t.Errorf("RemoveVXLANDevices = %v, %v; want both devices", removed, err)
	}
	if removed, err := dataplane.RemoveVXLANDevices(nsB.Path); err != nil || len(removed) != 0 {
		t.Errorf("second RemoveVXLANDevices = %v, %v; want none", removed, err)
	}
	if err := vx[1].Remove(dataplane.VXLANDevice4); err != nil {
		t.Errorf("second Remove: %v", err)
	}
	if _, ok, err := vx[1].Status(dataplane.VXLANDevice4); ok || err != nil {
		t.Errorf("Status after Remove = %v, %v", ok, err)
	}
}

func TestPrivilegedVXLANClash(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	nsA, _ := vxlanNodes(t)
	v := newVXLAN(t, nsA)
	local := netip.MustParseAddr("198.18.10.1")
	spec := dataplane.VXLANSpec{Name: dataplane.VXLANDevice4, VNI: 4096, Port: 4789, Local: local, Addr: netip.MustParseAddr("10.244.0.0")}

	// Another program's device with the same VNI and port.
	run(t, "ip", "-n", nsA.Name, "link", "add", "flannel.1", "type", "vxlan", "id", "4096", "dstport", "4789", "local", "198.18.10.1", "dev", "up0", "nolearning")
	_, err := v.Ensure(spec)
	if !errors.Is(err, dataplane.ErrVXLANClash) || !strings.Contains(err.Error(), "flannel.1 already uses VNI 4096 on port 4789") {
		t.Errorf("Ensure over flannel.1 = %v, want ErrVXLANClash naming flannel.1", err)
	}
	if _, ok, _ := v.Status(dataplane.VXLANDevice4); ok {
		t.Error("a device was left behind after the clash")
	}
	// Another VNI on the same port is fine; so is the same VNI in the
	// other family.
	spec.VNI = 4100
	if _, err := v.Ensure(spec); err != nil {
		t.Errorf("Ensure with VNI 4100 next to flannel.1: %v", err)
	}
	spec6 := dataplane.VXLANSpec{Name: dataplane.VXLANDevice6, VNI: 4096, Port: 4789, Local: netip.MustParseAddr("2001:db8:10::1")}
	if _, err := v.Ensure(spec6); err != nil {
		t.Errorf("Ensure IPv6 with VNI 4096 next to an IPv4 flannel.1: %v", err)
	}

	// A device of another type with the name is not ours to touch.
	run(t, "ip", "-n", nsA.Name, "link", "del", dataplane.VXLANDevice4)
	run(t, "ip", "-n", nsA.Name, "link", "add", dataplane.VXLANDevice4, "type", "veth", "peer", "name", "vxpeer")
	if _, err := v.Ensure(spec); !errors.Is(err, dataplane.ErrVXLANClash) {
		t.Errorf("Ensure over a veth vxlan.tabby = %v, want ErrVXLANClash", err)
	}
	if err := v.Remove(dataplane.VXLANDevice4); !errors.Is(err, dataplane.ErrVXLANClash) {
		t.Errorf("Remove of a veth vxlan.tabby = %v, want ErrVXLANClash", err)
	}
	if out := run(t, "ip", "-n", nsA.Name, "-d", "link", "show", dataplane.VXLANDevice4); !strings.Contains(out, "veth") {
		t.Errorf("the veth device changed: %s", out)
	}

	// No device holds the local address: nothing is made.
	bad := dataplane.VXLANSpec{Name: "vxlan.x", VNI: 9, Port: 4789, Local: netip.MustParseAddr("198.18.99.1")}
	if _, err := v.Ensure(bad); err == nil || !strings.Contains(err.Error(), "no device holds the local address 198.18.99.1") {
		t.Errorf("Ensure without the local address = %v", err)
	}
}

func peerStrings(ps []dataplane.VXLANPeer) string {
	var s []string
	for _, p := range dataplane.SortPeers(append([]dataplane.VXLANPeer(nil), ps...)) {
		s = append(s, p.String())
	}
	return strings.Join(s, "; ")
}

func containsSatisfied(want dataplane.Route, have []dataplane.Route) bool {
	for _, h := range have {
		if want.Satisfies(h) {
			return true
		}
	}
	return false
}

// txPackets reads a device's transmitted packet counter in a namespace.
func txPackets(t *testing.T, n testkit.NetNS, dev string) int {
	t.Helper()
	out := run(t, "nsenter", "--net="+n.Path, "cat", "/proc/net/dev")
	for _, line := range strings.Split(out, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || name != dev {
			continue
		}
		f := strings.Fields(rest)
		if len(f) > 9 {
			n, _ := strconv.Atoi(f[9])
			return n
		}
	}
	t.Fatalf("%s not in /proc/net/dev of %s", dev, n.Name)
	return 0
}
