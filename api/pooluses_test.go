package api

import (
	"slices"
	"strings"
	"testing"
)

func lbPool() *IPPool {
	return &IPPool{Metadata: ObjectMeta{Name: "lb"}, Spec: IPPoolSpec{CIDR: "198.19.0.0/28", AllowedUses: []IPPoolUse{UseLoadBalancer}}}
}

func TestPoolUses(t *testing.T) {
	p := validPool()
	if !slices.Equal(p.Uses(), []IPPoolUse{UseWorkload, UseTunnel}) || !p.Allows(UseWorkload) || !p.Allows(UseTunnel) || p.IsLoadBalancer() {
		t.Errorf("a pool without allowedUses: uses %v, want Calico's default [Workload Tunnel]", p.Uses())
	}
	p.Spec.AllowedUses = []IPPoolUse{UseTunnel}
	if p.Allows(UseWorkload) || !p.Allows(UseTunnel) {
		t.Errorf("allowedUses [Tunnel]: uses %v", p.Uses())
	}
	if lb := lbPool(); !lb.IsLoadBalancer() || lb.Allows(UseWorkload) {
		t.Errorf("LoadBalancer pool: uses %v", lb.Uses())
	}
}

func TestValidateLoadBalancerPool(t *testing.T) {
	valid := map[string]*IPPool{
		"small pool, default block size": lbPool(),
		"single address":                 func() *IPPool { p := lbPool(); p.Spec.CIDR = "198.19.0.7/32"; return p }(),
		"ipv6 /124":                      func() *IPPool { p := lbPool(); p.Spec.CIDR = "fd00:198:19::/124"; return p }(),
		"workload and tunnel":            func() *IPPool { p := validPool(); p.Spec.AllowedUses = []IPPoolUse{UseWorkload, UseTunnel}; return p }(),
	}
	for name, p := range valid {
		t.Run(name, func(t *testing.T) {
			if err := p.Validate(); err != nil {
				t.Fatalf("before defaults: %v", err)
			}
			p.SetDefaults()
			if err := p.Validate(); err != nil {
				t.Fatalf("after defaults: %v", err)
			}
		})
	}
	invalid := []struct {
		name string
		pool func() *IPPool
		want []string
	}{
		{"combined with Workload", func() *IPPool {
			p := lbPool()
			p.Spec.AllowedUses = []IPPoolUse{UseWorkload, UseLoadBalancer}
			return p
		},
			[]string{"spec.allowedUses: LoadBalancer cannot be combined with Workload or Tunnel"}},
		{"combined with Tunnel", func() *IPPool { p := lbPool(); p.Spec.AllowedUses = []IPPoolUse{UseLoadBalancer, UseTunnel}; return p },
			[]string{"spec.allowedUses: LoadBalancer cannot be combined"}},
		{"unknown and repeated", func() *IPPool {
			p := lbPool()
			p.Spec.AllowedUses = []IPPoolUse{"Service", UseLoadBalancer, UseLoadBalancer}
			return p
		}, []string{`spec.allowedUses[0]: "Service" must be Workload, Tunnel or LoadBalancer`, "spec.allowedUses[2]: LoadBalancer is listed twice"}},
		{"pod-only fields", func() *IPPool {
			p := lbPool()
			p.Spec.CIDR = "198.19.0.0/24"
			p.Spec.NATOutgoing = true
			p.Spec.NodeSelector = &LabelSelector{}
			p.Spec.BGPAggregate = AggregateOnly
			return p
		}, []string{"spec.natOutgoing: does not apply to a LoadBalancer pool", "spec.nodeSelector: does not apply", "spec.bgpAggregate: does not apply"}},
	}
	for _, tt := range invalid {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.pool().Validate()
			if err == nil {
				t.Fatal("Validate() = nil")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\nlacks %q", err, w)
				}
			}
		})
	}
	// A pod pool keeps refusing blocks larger than itself.
	p := validPool()
	p.Spec.CIDR, p.Spec.BlockSize = "10.244.0.0/28", 0
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "spec.blockSize") {
		t.Errorf("pod pool /28 with default blocks: %v", err)
	}
}
