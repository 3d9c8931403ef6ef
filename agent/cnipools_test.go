package agent

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/tabbynet/tabby/api"
)

// The network configuration's ipv4_pools picks the pool, by name or CIDR;
// a pool that does not exist fails ADD with a clear error instead of
// falling back to another pool.
func TestCNIPoolSelection(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t) // pool1: 10.244.0.0/24
	mustCreate(t, e.store, &api.IPPool{Metadata: api.ObjectMeta{Name: "pool2"}, Spec: api.IPPoolSpec{CIDR: "10.245.0.0/24", BlockSize: 28}})
	tests := []struct {
		pools []string
		want  string // the pool the address must be in, "" for an error
	}{
		{[]string{"pool2"}, "10.245.0.0/24"},
		{[]string{"10.245.0.0/24"}, "10.245.0.0/24"},
		{[]string{"10.244.0.0/24"}, "10.244.0.0/24"},
		{[]string{"pool1"}, "10.244.0.0/24"},
		{[]string{"nope"}, ""},
		{[]string{"10.246.0.0/24"}, ""},
		{[]string{"pool2", "nope"}, ""},
	}
	for i, tt := range tests {
		req, conf, args := addReq("c" + string(rune('a'+i)))
		conf.IPv4Pools = tt.pools
		// Twice: the second with the allocator's cache warm.
		for range 2 {
			res, err := e.h.Add(ctx, req, conf, args)
			if tt.want == "" {
				var te *types.Error
				if !errors.As(err, &te) || te.Code != types.ErrInvalidNetworkConfig || !strings.Contains(te.Error(), "does not exist") {
					t.Errorf("ipv4_pools %v: ADD error %v, want an invalid-config error naming the missing pool", tt.pools, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("ipv4_pools %v: %v", tt.pools, err)
			}
			ip, _ := netip.AddrFromSlice(res.IPs[0].Address.IP)
			if !netip.MustParsePrefix(tt.want).Contains(ip.Unmap()) {
				t.Errorf("ipv4_pools %v: address %s outside %s", tt.pools, ip, tt.want)
			}
			// Release, so that the repeat is a new allocation.
			if err := e.h.Del(ctx, req, conf, args); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := len(e.endpoints(t)); n != 0 {
		t.Errorf("%d endpoints left", n)
	}
	rep, err := e.alloc.Check(ctx)
	if err != nil || !rep.OK() {
		t.Errorf("ipam check: %+v %v", rep, err)
	}
}
