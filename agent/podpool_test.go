package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/ipam"
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

// The agent's default pools: created beside a LoadBalancer pool, refused
// (loudly) when they would overlap one.
func TestDefaultPoolBesideLoadBalancerPools(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name, lbCIDR string
		wantErr      string
	}{
		{"beside", "198.19.0.0/24", ""},
		{"overlapping", "10.244.200.0/24", "overlaps LoadBalancer pool lb"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			store := storetest.New(t)
			alloc := ipam.New(store)
			if _, err := alloc.CreatePool(ctx, &api.IPPool{Metadata: api.ObjectMeta{Name: "lb"},
				Spec: api.IPPoolSpec{CIDR: tt.lbCIDR, AllowedUses: []api.IPPoolUse{api.UseLoadBalancer}}}); err != nil {
				t.Fatal(err)
			}
			a := &Agent{cfg: Config{DefaultPoolCIDR: netip.MustParsePrefix("10.244.0.0/16")}, store: store, ipam: alloc, log: slog.New(slog.DiscardHandler)}
			err := a.ensureDefaultPool(ctx)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ensureDefaultPool = %v, want an error with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := store.Get(ctx, api.KindIPPool, "", DefaultPoolName); err != nil {
				t.Errorf("default pool beside a LoadBalancer pool: %v", err)
			}
			if err := a.ensureDefaultPool(ctx); err != nil {
				t.Errorf("again: %v", err)
			}
		})
	}
}
