package api

import (
	"strings"
	"testing"
)

func TestVXLANValid(t *testing.T) {
	for _, obj := range []Object{
		func() Object { p := validPool(); p.Spec.VXLANMode = VXLANModeAlways; return p }(),
		func() Object { p := validPool(); p.Spec.VXLANMode = VXLANModeCrossSubnet; return p }(),
		func() Object {
			p := validPool()
			p.Spec.VXLANMode = VXLANModeNever
			p.Spec.DisableBGPExport = true
			p.Spec.BGPAggregate = ""
			return p
		}(),
		func() Object {
			p := validPool()
			p.Spec.CIDR, p.Spec.BlockSize, p.Spec.BGPAggregate, p.Spec.VXLANMode = "fd00:10:244::/48", 122, "", VXLANModeAlways
			p.Spec.DisableBGPExport = true // Always needs no BGP
			return p
		}(),
		func() Object {
			n := validNode()
			n.Spec.IPv4VXLANTunnelAddr, n.Spec.VXLANTunnelMACAddr = "10.244.0.0", "66:a0:1b:2c:3d:4e"
			n.Spec.IPv6VXLANTunnelAddr, n.Spec.VXLANTunnelMACAddrV6 = "fd00:10:244::", "66:a0:1b:2c:3d:4f"
			return n
		}(),
		func() Object {
			c := validBGPConfig()
			c.Spec.VXLANVNI, c.Spec.VXLANPort = ptr(MaxVXLANVNI), ptr(uint16(8472))
			return c
		}(),
	} {
		if err := obj.Validate(); err != nil {
			t.Errorf("%s %s: %v", KindOf(obj), obj.GetMeta().Name, err)
		}
	}
}

func TestVXLANInvalid(t *testing.T) {
	tests := []struct {
		name string
		obj  Object
		want []string
	}{
		{"unknown mode", func() Object { p := validPool(); p.Spec.VXLANMode = "always"; return p }(),
			[]string{`spec.vxlanMode: "always" must be Never, Always or CrossSubnet`}},
		{"cross-subnet without BGP", func() Object {
			p := validPool()
			p.Spec.VXLANMode, p.Spec.DisableBGPExport, p.Spec.BGPAggregate = VXLANModeCrossSubnet, true, ""
			return p
		}(), []string{"spec.vxlanMode: CrossSubnet routes same-subnet traffic natively over BGP", "disableBGPExport"}},
		{"a LoadBalancer pool", func() Object {
			p := validPool()
			p.Spec.VXLANMode, p.Spec.AllowedUses, p.Spec.NATOutgoing, p.Spec.BGPAggregate = VXLANModeAlways, []IPPoolUse{UseLoadBalancer}, false, ""
			return p
		}(), []string{"spec.vxlanMode: Always does not apply to a LoadBalancer pool"}},
		{"tunnel address of the wrong family", func() Object {
			n := validNode()
			n.Spec.IPv4VXLANTunnelAddr, n.Spec.IPv6VXLANTunnelAddr = "fd00::1", "10.244.0.1"
			return n
		}(), []string{`spec.ipv4VXLANTunnelAddr: "fd00::1" is not an IPv4 address`, `spec.ipv6VXLANTunnelAddr: "10.244.0.1" is not an IPv6 address`}},
		{"tunnel address not an address", func() Object { n := validNode(); n.Spec.IPv4VXLANTunnelAddr = "10.244.0.0/32"; return n }(),
			[]string{`spec.ipv4VXLANTunnelAddr: "10.244.0.0/32" is not an IP address`}},
		{"tunnel address link-local", func() Object { n := validNode(); n.Spec.IPv6VXLANTunnelAddr = "fe80::1"; return n }(),
			[]string{"spec.ipv6VXLANTunnelAddr", "cannot be a tunnel address"}},
		{"bad MACs", func() Object {
			n := validNode()
			n.Spec.VXLANTunnelMACAddr, n.Spec.VXLANTunnelMACAddrV6 = "01:00:5e:00:00:01", "zz"
			return n
		}(), []string{"spec.vxlanTunnelMACAddr: \"01:00:5e:00:00:01\" is not a unicast", "spec.vxlanTunnelMACAddrV6: \"zz\""}},
		{"vni 0 and too big port clash", func() Object {
			c := validBGPConfig()
			c.Spec.VXLANVNI, c.Spec.VXLANPort = ptr(uint32(0)), ptr(uint16(1179))
			return c
		}(), []string{"spec.vxlanVNI: 0 must be between 1 and 16777215", "spec.vxlanPort: 1179 is the BGP listenPort"}},
		{"vni over 24 bits", func() Object { c := validBGPConfig(); c.Spec.VXLANVNI = ptr(uint32(1 << 24)); return c }(),
			[]string{"spec.vxlanVNI: 16777216 must be between"}},
		{"port 0", func() Object { c := validBGPConfig(); c.Spec.VXLANPort = ptr(uint16(0)); return c }(),
			[]string{"spec.vxlanPort: must be between 1 and 65535"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.obj.Validate()
			if err == nil {
				t.Fatal("Validate() = nil")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestVXLANAccessors(t *testing.T) {
	var nilCfg *BGPConfiguration
	if vni, port := nilCfg.VXLANSettings(); vni != 4096 || port != 4789 {
		t.Errorf("defaults = %d %d, want 4096 4789", vni, port)
	}
	c := validBGPConfig()
	c.Spec.VXLANVNI, c.Spec.VXLANPort = ptr(uint32(7)), ptr(uint16(8472))
	if vni, port := c.VXLANSettings(); vni != 7 || port != 8472 {
		t.Errorf("settings = %d %d, want 7 8472", vni, port)
	}
	n := validNode()
	if _, _, ok := n.VXLANTunnel(false); ok {
		t.Error("a node without tunnel fields has a tunnel")
	}
	n.Spec.IPv4VXLANTunnelAddr, n.Spec.VXLANTunnelMACAddr = "10.244.0.0", "66:a0:1b:2c:3d:4e"
	a, mac, ok := n.VXLANTunnel(false)
	if !ok || a.String() != "10.244.0.0" || mac.String() != "66:a0:1b:2c:3d:4e" {
		t.Errorf("VXLANTunnel(v4) = %v %v %v", a, mac, ok)
	}
	if _, _, ok := n.VXLANTunnel(true); ok {
		t.Error("the IPv4 tunnel is reported as IPv6")
	}
	n.Spec.VXLANTunnelMACAddr = ""
	if _, _, ok := n.VXLANTunnel(false); ok {
		t.Error("an address without a MAC is a tunnel")
	}
	for m, want := range map[VXLANMode]bool{"": false, VXLANModeNever: false, VXLANModeAlways: true, VXLANModeCrossSubnet: true} {
		if m.Encapsulated() != want {
			t.Errorf("%q.Encapsulated() = %v", m, !want)
		}
	}
}
