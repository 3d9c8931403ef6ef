package agent

import (
	"testing"

	"github.com/tabbynet/tabby/api"
)

func TestHasPodPool(t *testing.T) {
	pool := func(cidr string, uses ...api.IPPoolUse) *api.IPPool {
		return &api.IPPool{Spec: api.IPPoolSpec{CIDR: cidr, AllowedUses: uses}}
	}
	lb := pool("198.19.0.0/24", api.UseLoadBalancer)
	for _, tt := range []struct {
		name  string
		pools []*api.IPPool
		is6   bool
		want  bool
	}{
		{"none", nil, false, false},
		{"only a LoadBalancer pool", []*api.IPPool{lb}, false, false},
		{"a pod pool beside it", []*api.IPPool{lb, pool("10.244.0.0/16")}, false, true},
		{"an IPv6 pod pool does not count for IPv4", []*api.IPPool{pool("fd00::/64")}, false, false},
		{"an IPv6 LoadBalancer pool", []*api.IPPool{pool("fd00::/120", api.UseLoadBalancer)}, true, false},
		{"an IPv6 pod pool", []*api.IPPool{pool("fd00::/64")}, true, true},
	} {
		if got := hasPodPool(tt.pools, tt.is6); got != tt.want {
			t.Errorf("%s: hasPodPool = %v, want %v", tt.name, got, tt.want)
		}
	}
}
