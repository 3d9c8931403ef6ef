package agent

import (
	"net/netip"
	"testing"
)

func TestSelectAddress(t *testing.T) {
	pfx := netip.MustParsePrefix
	ifaces := []Interface{
		{Name: "lo", Up: true, Loopback: true, Addrs: []netip.Prefix{pfx("127.0.0.1/8")}},
		{Name: "cali0123456789a", Up: true, Addrs: []netip.Prefix{pfx("169.254.1.1/32")}},
		{Name: "docker0", Up: true, Addrs: []netip.Prefix{pfx("172.17.0.1/16")}},
		{Name: "eth9", Up: false, Addrs: []netip.Prefix{pfx("198.18.9.9/24")}},
		{Name: "eth0", Up: true, Addrs: []netip.Prefix{pfx("fe80::1/64"), pfx("198.18.0.11/24")}},
		{Name: "eth1", Up: true, Addrs: []netip.Prefix{pfx("198.19.0.5/16")}},
	}
	tests := []struct {
		method string
		local  string
		want   string
		err    bool
	}{
		{method: "", want: "198.18.0.11/24"},
		{method: "first-found", want: "198.18.0.11/24"},
		{method: "interface=eth1", want: "198.19.0.5/16"},
		{method: "interface=eth9", err: true},
		{method: "skip-interface=eth0", want: "198.19.0.5/16"},
		{method: "cidr=198.19.0.0/16", want: "198.19.0.5/16"},
		{method: "cidr=10.0.0.0/8", err: true},
		{method: "can-reach=198.19.1.1", local: "198.19.0.5", want: "198.19.0.5/16"},
	}
	for _, tt := range tests {
		m, err := ParseAutodetectMethod(tt.method)
		if err != nil {
			t.Fatalf("%q: %v", tt.method, err)
		}
		var local netip.Addr
		if tt.local != "" {
			local = netip.MustParseAddr(tt.local)
		}
		got, _, err := SelectAddress(ifaces, m, local)
		if tt.err {
			if err == nil {
				t.Errorf("%q: got %v, want error", tt.method, got)
			}
			continue
		}
		if err != nil || got.String() != tt.want {
			t.Errorf("%q: got %v, %v; want %s", tt.method, got, err, tt.want)
		}
	}
}

func TestParseAutodetectMethodErrors(t *testing.T) {
	for _, s := range []string{"bogus", "interface=", "interface=(", "cidr=foo", "can-reach=::1", "magic=1"} {
		if _, err := ParseAutodetectMethod(s); err == nil {
			t.Errorf("%q: want error", s)
		}
	}
}
