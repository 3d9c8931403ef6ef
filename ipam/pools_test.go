package ipam

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/internal/testkit"
)

func testPool(name, cidr string, blockSize int, mutate ...func(*api.IPPool)) poolInfo {
	p := &api.IPPool{Metadata: api.ObjectMeta{Name: name}, Spec: api.IPPoolSpec{CIDR: cidr, BlockSize: blockSize}}
	for _, m := range mutate {
		m(p)
	}
	pi, err := newPoolInfo(p, "resources/ippools/"+name, 1)
	if err != nil {
		panic(err)
	}
	return pi
}

func TestNewPoolInfoRejects(t *testing.T) {
	for name, spec := range map[string]api.IPPoolSpec{
		"ipv6":           {CIDR: "fd00::/64", BlockSize: 26},
		"bad cidr":       {CIDR: "10.0.0.0/33"},
		"block too big":  {CIDR: "10.0.0.0/24", BlockSize: 22},
		"block too wide": {CIDR: "10.0.0.0/8", BlockSize: 16},
	} {
		if _, err := newPoolInfo(&api.IPPool{Metadata: api.ObjectMeta{Name: name}, Spec: spec}, "", 0); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	pi, err := newPoolInfo(&api.IPPool{Metadata: api.ObjectMeta{Name: "d"}, Spec: api.IPPoolSpec{CIDR: "10.9.0.7/16"}}, "", 0)
	if err != nil || pi.blockBits != api.DefaultBlockSize || pi.prefix.String() != "10.9.0.0/16" {
		t.Errorf("defaults: %+v, %v", pi, err)
	}
}

func TestUsablePools(t *testing.T) {
	pools := []poolInfo{
		testPool("b-pool", "10.1.0.0/16", 26),
		testPool("a-pool", "10.2.0.0/16", 26),
		testPool("off", "10.3.0.0/16", 26, func(p *api.IPPool) { p.Spec.Disabled = true }),
		testPool("rack1", "10.4.0.0/16", 26, func(p *api.IPPool) {
			p.Spec.NodeSelector = &api.LabelSelector{MatchLabels: map[string]string{"rack": "1"}}
		}),
	}
	tests := []struct {
		name      string
		labels    map[string]string
		requested []string
		want      []string
		wantErr   string
	}{
		{name: "all usable, sorted", want: []string{"a-pool", "b-pool"}},
		{name: "selector matches", labels: map[string]string{"rack": "1"}, want: []string{"a-pool", "b-pool", "rack1"}},
		{name: "requested", requested: []string{"b-pool"}, want: []string{"b-pool"}},
		{name: "requested disabled", requested: []string{"off"}, wantErr: "off is disabled"},
		{name: "requested unselected", requested: []string{"rack1"}, wantErr: "rack1 does not select the node"},
		{name: "requested missing", requested: []string{"nope"}, wantErr: `requested pool "nope" does not exist`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := usablePools(pools, 4, "n1", tt.labels, tt.requested, api.UseWorkload)
			if tt.wantErr != "" {
				testkit.ErrMentions(t, "usablePools", err, []string{tt.wantErr})
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, poolNames(got)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	if _, err := usablePools(nil, 4, "n1", nil, nil, api.UseWorkload); !errors.Is(err, ErrNoPool) {
		t.Errorf("no pools: %v, want ErrNoPool", err)
	}
}

func TestFreeBlock(t *testing.T) {
	p := testPool("tiny", "10.0.0.0/28", 30)
	taken := map[netip.Prefix]bool{}
	var got []string
	for {
		b, ok := freeBlock(p, "n1", taken, nil)
		if !ok {
			break
		}
		if taken[b] {
			t.Fatalf("freeBlock returned taken block %s", b)
		}
		taken[b] = true
		got = append(got, b.String())
	}
	if len(got) != 4 {
		t.Fatalf("claimed %v, want the 4 /30 blocks of the /28", got)
	}
	// A block of another size (left by an older pool definition) shadows
	// every candidate it overlaps.
	odd := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/29")}
	taken = map[netip.Prefix]bool{netip.MustParsePrefix("10.0.0.8/30"): true}
	b, ok := freeBlock(p, "n1", taken, odd)
	if !ok || b.String() != "10.0.0.12/30" {
		t.Errorf("freeBlock with odd block = %s, %v; want 10.0.0.12/30", b, ok)
	}
	// Different nodes start at different blocks of a large pool.
	big := testPool("big", "10.244.0.0/16", 26)
	starts := map[netip.Prefix]bool{}
	for _, n := range []string{"n1", "n2", "n3", "n4", "n5"} {
		b, _ := freeBlock(big, n, map[netip.Prefix]bool{}, nil)
		starts[b] = true
	}
	if len(starts) < 3 {
		t.Errorf("5 nodes start at only %d distinct blocks", len(starts))
	}
}
