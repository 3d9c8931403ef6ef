package agent

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/policy"
)

// Every duration has bounds, and etcd's settings are checked with the rest
// (TLS files with a plain-text endpoint are an error, not ignored).
func TestConfigBounds(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		want string // "" = valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"huge resync", func(c *Config) { c.ResyncInterval = 1 << 62 }, "resync interval"},
		{"tiny resync", func(c *Config) { c.ResyncInterval = time.Millisecond }, "resync interval: 1ms must be between 1s and 1h0m0s"},
		{"huge lease", func(c *Config) { c.LeaseTTL = 1 << 62 }, "lease ttl"},
		{"tiny node gc grace", func(c *Config) { c.NodeGCGrace = 0 }, "node gc grace: 0s must be between 1s and 24h0m0s"},
		{"short node gc grace", func(c *Config) { c.NodeGCGrace = 2 * time.Second }, ""},
		{"negative settle", func(c *Config) { c.BGPSettleTime = -time.Second }, "bgp settle time"},
		{"huge settle", func(c *Config) { c.BGPSettleTime = 24 * time.Hour }, "bgp settle time"},
		{"node ipv6", func(c *Config) { c.NodeIP6 = netip.MustParsePrefix("2001:db8::11/64") }, ""},
		{"node ipv6 link-local", func(c *Config) { c.NodeIP6 = netip.MustParsePrefix("fe80::1/64") }, "node ipv6"},
		{"node ipv6 is IPv4", func(c *Config) { c.NodeIP6 = netip.MustParsePrefix("198.18.0.11/24") }, "node ipv6"},
		{"node ip is IPv6", func(c *Config) { c.NodeIP = netip.MustParsePrefix("2001:db8::11/64") }, "node ip: 2001:db8::11/64 is not an IPv4 CIDR"},
		{"ipv6 pool is IPv4", func(c *Config) { c.DefaultPoolCIDR6 = netip.MustParsePrefix("10.0.0.0/16") }, "default ipv6 pool"},
		{"ipv4 pool is IPv6", func(c *Config) { c.DefaultPoolCIDR = netip.MustParsePrefix("fd00::/48") }, "default ipv4 pool"},
		{"gobgp api not loopback", func(c *Config) { c.GoBGPAPI = netip.MustParseAddrPort("198.18.0.11:50051") }, "gobgp api: 198.18.0.11:50051 must be a loopback"},
		{"gobgp api loopback", func(c *Config) { c.GoBGPAPI = netip.MustParseAddrPort("127.0.0.1:50051") }, ""},
		{"pprof not loopback", func(c *Config) { c.DebugPprof = netip.MustParseAddrPort("0.0.0.0:6060") }, "debug pprof: 0.0.0.0:6060 must be a loopback"},
		{"pprof loopback", func(c *Config) { c.DebugPprof = netip.MustParseAddrPort("127.0.0.1:6060") }, ""},
		{"unknown firewall", func(c *Config) { c.FirewallBackend = "pf" }, "firewall backend"},
		{"no node gc per pass", func(c *Config) { c.NodeGCMaxPerPass = 0 }, "node gc max per pass: 0 must be at least 1"},
		{"bad autodetect kind", func(c *Config) { c.AutodetectMethod = AutodetectMethod{Kind: "guess"} }, "ip autodetection method \"guess\""},
		{"bad autodetect ignored with node ip", func(c *Config) {
			c.AutodetectMethod = AutodetectMethod{Kind: "guess"}
			c.NodeIP = netip.MustParsePrefix("198.18.0.11/24")
		}, ""},
		{"huge node gc grace", func(c *Config) { c.NodeGCGrace = 1 << 62 }, "node gc grace"},
		{"lab node gc grace", func(c *Config) { c.NodeGCGrace = 10 * time.Second }, ""},
		{"tls with http", func(c *Config) { c.Etcd.CAFile = "/etc/tabby/ca.pem" }, "etcd: endpoints: \"http://127.0.0.1:2379\" is plain text but TLS files are given"},
		{"tls with https", func(c *Config) {
			c.Etcd.CAFile = "/etc/tabby/ca.pem"
			c.Etcd.Endpoints = []string{"https://127.0.0.1:2379"}
		}, ""},
		{"huge etcd timeout", func(c *Config) { c.Etcd.RequestTimeout = 1 << 62 }, "etcd: requestTimeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.NodeName = "n1"
			tt.mod(&c)
			err := c.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Validate = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestHostProtectedPorts(t *testing.T) {
	c := Default()
	c.Etcd.Endpoints = []string{"https://10.0.0.1:2379", "http://etcd-2", "https://etcd-3:12379", "unix:///run/etcd.sock"}
	c.Etcd.WatchEndpoints = []string{"http://198.18.0.2:23791"} // a watch relay holds etcd's credentials
	c.GoBGPAPI = netip.MustParseAddrPort("127.0.0.1:50051")
	got := c.HostProtectedPorts()
	want := []policy.HostPort{{Proto: "tcp", Port: 2379}, {Proto: "tcp", Port: 2379}, {Proto: "tcp", Port: 12379}, {Proto: "tcp", Port: 23791}, {Proto: "tcp", Port: 50051}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("hostProtectedPorts (-want +got):\n%s", diff)
	}
	c.EndpointToHostAction = "Allow"
	c.NodeName = "n1"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "endpoint to host action") {
		t.Errorf("Validate with action Allow: %v", err)
	}
}

// Validate reports every problem at once, not the first.
func TestConfigReportsEveryProblem(t *testing.T) {
	c := Default()
	c.NodeName = ""
	c.NodeIP6 = netip.MustParsePrefix("198.18.0.11/24")
	c.FirewallBackend = "pf"
	c.EndpointToHostAction = "Allow"
	c.NodeGCMaxPerPass = 0
	c.ResyncInterval = 0
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate = nil")
	}
	for _, want := range []string{"node name", "node ipv6", "firewall backend", "endpoint to host action", "node gc max per pass", "resync interval"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v\nmissing %q", err, want)
		}
	}
}

// The typed fields parse their text once (flags and env go through
// UnmarshalText) and print it back the same.
func TestConfigText(t *testing.T) {
	var b FirewallBackend
	for _, s := range []string{"auto", "nftables", "iptables"} {
		if err := b.UnmarshalText([]byte(s)); err != nil || b != FirewallBackend(s) {
			t.Errorf("FirewallBackend %q: %q, %v", s, b, err)
		}
	}
	if err := b.UnmarshalText([]byte("ipfw")); err == nil {
		t.Error("FirewallBackend ipfw: no error")
	}
	var a EndpointToHostAction
	for _, s := range []string{"Drop", "Accept", "Return"} {
		if err := a.UnmarshalText([]byte(s)); err != nil || a != EndpointToHostAction(s) {
			t.Errorf("EndpointToHostAction %q: %q, %v", s, a, err)
		}
	}
	if err := a.UnmarshalText([]byte("Allow")); err == nil || a != EndpointToHostReturn {
		t.Errorf("EndpointToHostAction Allow: %v (value %q, want unchanged)", err, a)
	}
	for _, s := range []string{"first-found", "interface=eth.*", "skip-interface=eth0", "cidr=198.18.0.0/15", "can-reach=198.18.0.1"} {
		var m AutodetectMethod
		if err := m.UnmarshalText([]byte(s)); err != nil {
			t.Fatalf("AutodetectMethod %q: %v", s, err)
		}
		if got, _ := m.MarshalText(); string(got) != s {
			t.Errorf("AutodetectMethod %q prints as %q", s, got)
		}
	}
	var m AutodetectMethod
	if err := m.UnmarshalText([]byte("cidr=2001:db8::/64")); err == nil {
		t.Error("AutodetectMethod cidr=2001:db8::/64: no error")
	}
	if got := Default().HTTPListen.String(); got != "127.0.0.1:9099" {
		t.Errorf("default http listen %s", got)
	}
}
