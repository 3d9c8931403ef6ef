package agent

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/internal/testkit"
)

// An IPv6-only node (--node-ip none) needs an IPv6 address and neither an
// IPv4 address nor an IPv4 default pool; the router ID is dotted IPv4.
// Every problem is reported.
func TestConfigIPv6Only(t *testing.T) {
	v6 := netip.MustParsePrefix("fd00:198:18::11/64")
	tests := []struct {
		name string
		mod  func(*Config)
		want []string // nil = valid
	}{
		{"ipv6 only", func(c *Config) { c.NoIPv4, c.NodeIP6 = true, v6 }, nil},
		{"ipv6 only autodetected", func(c *Config) { c.NoIPv4, c.AutodetectIPv6 = true, true }, nil},
		{"ipv6 only with router id", func(c *Config) {
			c.NoIPv4, c.NodeIP6, c.RouterID = true, v6, netip.MustParseAddr("240.0.0.7")
		}, nil},
		{"no address at all", func(c *Config) { c.NoIPv4 = true }, []string{"node ip: none needs an IPv6 address"}},
		{"none and an address", func(c *Config) {
			c.NoIPv4, c.NodeIP6, c.NodeIP = true, v6, netip.MustParsePrefix("198.18.0.11/24")
		}, []string{"node ip: none (IPv6-only) and an address 198.18.0.11/24"}},
		{"ipv4 pool on ipv6 only", func(c *Config) {
			c.NoIPv4, c.NodeIP6, c.DefaultPoolCIDR = true, v6, netip.MustParsePrefix("10.244.0.0/16")
		}, []string{"default ipv4 pool: 10.244.0.0/16 on an IPv6-only node"}},
		{"router id ipv6", func(c *Config) { c.RouterID = netip.MustParseAddr("fd00::1") }, []string{"router id: fd00::1 is not a dotted IPv4"}},
		{"router id zero", func(c *Config) { c.RouterID = netip.IPv4Unspecified() }, []string{"router id: 0.0.0.0"}},
		{"every problem", func(c *Config) {
			c.NoIPv4, c.DefaultPoolCIDR, c.RouterID = true, netip.MustParsePrefix("10.244.0.0/16"), netip.MustParseAddr("::1")
		}, []string{"node ip: none needs", "default ipv4 pool", "router id"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.NodeName = "n1"
			tt.mod(&c)
			err := c.Validate()
			testkit.ErrMentions(t, "Validate", err, tt.want)
		})
	}
}

// --node-ip and --node-ip6 take a CIDR, autodetect or none (Calico's IP
// and IP6), in the right family only.
func TestNodeIPFlag(t *testing.T) {
	type got struct {
		NodeIP, NodeIP6     string
		NoIPv4, Autodetect6 bool
		String4, String6    string
	}
	tests := []struct {
		name    string
		v4, v6  string // "" = not set
		want    got
		wantErr string
	}{
		{"defaults", "", "", got{NodeIP: "invalid Prefix", NodeIP6: "invalid Prefix", String4: "autodetect", String6: "none"}, ""},
		{"ipv6 only", "none", "fd00:198:18::11/64", got{NodeIP: "invalid Prefix", NodeIP6: "fd00:198:18::11/64", NoIPv4: true, String4: "none", String6: "fd00:198:18::11/64"}, ""},
		{"ipv6 only autodetect", "NONE", "autodetect", got{NodeIP: "invalid Prefix", NodeIP6: "invalid Prefix", NoIPv4: true, Autodetect6: true, String4: "none", String6: "autodetect"}, ""},
		{"dual stack", "198.18.0.11/24", "fd00:198:18::11/64", got{NodeIP: "198.18.0.11/24", NodeIP6: "fd00:198:18::11/64", String4: "198.18.0.11/24", String6: "fd00:198:18::11/64"}, ""},
		{"ipv6 given as ipv4", "fd00::1/64", "", got{}, `"fd00::1/64" is not an IPv4 CIDR, autodetect or none`},
		{"ipv4 given as ipv6", "", "198.18.0.11/24", got{}, `"198.18.0.11/24" is not an IPv6 CIDR`},
		{"garbage", "first-found", "", got{}, "is not an IPv4 CIDR"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			f4, f6 := NodeIPFlag{Cfg: &c}, NodeIPFlag{Cfg: &c, V6: true}
			var err error
			if tt.v4 != "" {
				err = f4.Set(tt.v4)
			}
			if tt.v6 != "" && err == nil {
				err = f6.Set(tt.v6)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("Set = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			g := got{c.NodeIP.String(), c.NodeIP6.String(), c.NoIPv4, c.AutodetectIPv6, f4.String(), f6.String()}
			if d := cmp.Diff(tt.want, g); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

// An IPv6-only node's Node record carries its IPv6 address only, also
// when an earlier run had registered an IPv4 one.
func TestRegisterNodeIPv6Only(t *testing.T) {
	ctx := context.Background()
	store := storetest.New(t)
	a := &Agent{cfg: Config{NodeName: "node1"}, store: store, nodeAddr: netip.MustParsePrefix("198.18.0.11/24")}
	if _, err := a.registerNode(ctx); err != nil {
		t.Fatal(err)
	}
	a.nodeAddr, a.nodeAddr6 = netip.Prefix{}, netip.MustParsePrefix("fd00:198:18::11/64")
	n, err := a.registerNode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := &api.NodeBGPSpec{IPv6Address: "fd00:198:18::11/64"}
	if d := cmp.Diff(want, n.Spec.BGP); d != "" {
		t.Errorf("Node spec.bgp (-want +got):\n%s", d)
	}
	if _, ok := n.IPv4(); ok {
		t.Error("the IPv6-only node has an IPv4 address")
	}
	if got := a.primaryAddress(); got != "fd00:198:18::11/64" {
		t.Errorf("status address %q, want the IPv6 one", got)
	}
}

// The router ID: --router-id, else the IPv4 address, else the Node's
// spec.bgp.routerID, else one derived from the name. The speaker of an
// IPv6-only node is IPv6-only and listens on its IPv6 address.
func TestRouterIDIPv6Only(t *testing.T) {
	v4, v6 := netip.MustParsePrefix("198.18.0.11/24"), netip.MustParsePrefix("fd00:198:18::11/64")
	withID := &api.Node{Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{RouterID: "240.1.2.3"}}}
	tests := []struct {
		name string
		cfg  Config
		node *api.Node
		addr netip.Prefix
		want netip.Addr
	}{
		{"ipv4 address", Config{NodeName: "n1"}, withID, v4, v4.Addr()},
		{"flag wins", Config{NodeName: "n1", RouterID: netip.MustParseAddr("240.9.9.9")}, withID, v4, netip.MustParseAddr("240.9.9.9")},
		{"node record", Config{NodeName: "n1"}, withID, netip.Prefix{}, netip.MustParseAddr("240.1.2.3")},
		{"derived", Config{NodeName: "n1"}, &api.Node{}, netip.Prefix{}, bgp.RouterIDFor("n1", "")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := routerID(tt.cfg, tt.node, tt.addr); got != tt.want {
				t.Errorf("routerID = %v, want %v", got, tt.want)
			}
		})
	}
	if id := bgp.RouterIDFor("n1", ""); !id.Is4() || id.As4()[0] != 240 {
		t.Errorf("derived router ID %v is not in 240.0.0.0/8", id)
	}
	bc := &api.BGPConfiguration{}
	c := speakerConfig(&api.Node{}, netip.Prefix{}, v6, bc, false, "")
	if !c.IPv6Only || c.ListenAddr.IsValid() || c.ListenAddr6 != v6.Addr() || c.Subnet.IsValid() || c.Subnet6 != v6.Masked() {
		t.Errorf("IPv6-only speaker config: %+v", c)
	}
	if c := speakerConfig(&api.Node{}, v4, v6, bc, false, ""); c.IPv6Only || c.ListenAddr != v4.Addr() || c.ListenAddr6 != v6.Addr() {
		t.Errorf("dual-stack speaker config: %+v", c)
	}
}

// On an IPv6-only node an ADD that asks for an IPv4 address fails with
// the reason and the IPv4 pool it would come from, and leaves nothing; an
// IPv6-only network's ADD works.
func TestCNIAddIPv6OnlyNode(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t) // pool1: 10.244.0.0/24
	e.h.ipv6Only = true
	mustCreate(t, e.store, &api.IPPool{Metadata: api.ObjectMeta{Name: "v6"}, Spec: api.IPPoolSpec{CIDR: "fd00:10:244::/64"}})
	testkit.Eventually(t, 10*time.Second, "the view has both pools", testkit.Cond(func() bool { return len(e.view.Pools()) == 2 }))

	req, conf, args := addReq("v4wanted")
	conf.AssignIPv6 = flex(true)
	_, err := e.h.Add(ctx, req, conf, args)
	if err == nil {
		t.Fatal("IPv4 ADD on an IPv6-only node: no error")
	}
	for _, w := range []string{"is IPv6-only", "pool1 10.244.0.0/24", `"assign_ipv4": "false"`} {
		if !strings.Contains(err.Error()+detail(err), w) {
			t.Errorf("error %v (%s): want %q in it", err, detail(err), w)
		}
	}
	if n := len(e.endpoints(t)); n != 0 {
		t.Errorf("%d endpoints after the refused ADD", n)
	}
	req, conf, args = addReq("v6pod")
	conf.AssignIPv4, conf.AssignIPv6 = flex(false), flex(true)
	res, err := e.h.Add(ctx, req, conf, args)
	if err != nil || len(res.IPs) != 1 || res.IPs[0].Address.IP.To4() != nil {
		t.Fatalf("IPv6 ADD on an IPv6-only node: %v, %v", res, err)
	}
}

// IPv6 autodetection (--node-ip6 autodetect) picks a global IPv6 address
// by the same methods as IPv4's, never a link-local one; its cidr and
// can-reach values are IPv6.
func TestSelectAddress6(t *testing.T) {
	pfx := netip.MustParsePrefix
	ifaces := []Interface{
		{Name: "lo", Up: true, Loopback: true, Addrs: []netip.Prefix{pfx("::1/128")}},
		{Name: "cali0123456789a", Up: true, Addrs: []netip.Prefix{pfx("fd00:10:244::1/128")}},
		{Name: "eth0", Up: true, Addrs: []netip.Prefix{pfx("fe80::1/64"), pfx("198.18.0.11/24"), pfx("2001:db8::b/64")}},
		{Name: "eth1", Up: true, Addrs: []netip.Prefix{pfx("fe80::2/64"), pfx("fd00:198:19::5/64")}},
	}
	tests := []struct {
		method string
		local  netip.Addr
		want   string
	}{
		{"first-found", netip.Addr{}, "2001:db8::b/64 eth0"},
		{"interface=eth1", netip.Addr{}, "fd00:198:19::5/64 eth1"},
		{"skip-interface=eth0", netip.Addr{}, "fd00:198:19::5/64 eth1"},
		{"cidr=fd00:198:19::/48", netip.Addr{}, "fd00:198:19::5/64 eth1"},
		{"can-reach=2001:db8::1", netip.MustParseAddr("2001:db8::b"), "2001:db8::b/64 eth0"},
		{"interface=lo", netip.Addr{}, "no IPv6 address found"},
	}
	for _, tt := range tests {
		t.Run(tt.method, func(t *testing.T) {
			var m AutodetectMethod6
			if err := m.UnmarshalText([]byte(tt.method)); err != nil {
				t.Fatal(err)
			}
			p, name, err := SelectAddress6(ifaces, m.AutodetectMethod, tt.local)
			got := p.String() + " " + name
			if err != nil {
				got = err.Error()
			}
			if !strings.Contains(got, tt.want) {
				t.Errorf("SelectAddress6 = %q, want %q", got, tt.want)
			}
		})
	}
	for _, bad := range []string{"cidr=10.0.0.0/8", "can-reach=198.18.0.1"} {
		var m AutodetectMethod6
		if err := m.UnmarshalText([]byte(bad)); err == nil || !strings.Contains(err.Error(), "is not an IPv6") {
			t.Errorf("IPv6 method %q: %v, want an IPv6 error", bad, err)
		}
	}
}
