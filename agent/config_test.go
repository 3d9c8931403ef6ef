package agent

import (
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
		{"node ipv6", func(c *Config) { c.NodeIP6 = "2001:db8::11/64" }, ""},
		{"node ipv6 link-local", func(c *Config) { c.NodeIP6 = "fe80::1/64" }, "node ipv6"},
		{"node ipv6 is IPv4", func(c *Config) { c.NodeIP6 = "198.18.0.11/24" }, "node ipv6"},
		{"ipv6 pool is IPv4", func(c *Config) { c.DefaultPoolCIDR6 = "10.0.0.0/16" }, "default ipv6 pool"},
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
	c.GoBGPAPI = "127.0.0.1:50051"
	got := c.HostProtectedPorts()
	want := []policy.HostPort{{Proto: "tcp", Port: 2379}, {Proto: "tcp", Port: 2379}, {Proto: "tcp", Port: 12379}, {Proto: "tcp", Port: 50051}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("hostProtectedPorts (-want +got):\n%s", diff)
	}
	c.EndpointToHostAction = "Allow"
	c.NodeName = "n1"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "endpoint to host action") {
		t.Errorf("Validate with action Allow: %v", err)
	}
}
