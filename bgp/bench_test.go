package bgp

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// BenchmarkPropagation measures the time from SetAdvertisements on one speaker
// of a full mesh to the new prefix appearing in Routes() of every other
// speaker.
func BenchmarkPropagation(b *testing.B) {
	for i, n := range []int{5, 20} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			c := newCluster(b, byte(100+i), n, nil)
			c.configure(b, nil, nil)
			c.advertiseBlocks(b)
			deadline := time.Now().Add(60 * time.Second)
			for j, node := range c.nodes {
				if got, ok := node.watch.waitFor(deadline, func(rs []LearnedRoute) bool { return len(rs) == n-1 }); !ok {
					b.Fatalf("%s (%d) did not converge:%s%s", node.name, j, routesString(got), peersString(node))
				}
			}
			src := c.nodes[0]
			for k := 0; b.Loop(); k++ {
				p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, 128 + byte(k>>8), byte(k)}), 32) // inside the pool: cluster peers import nothing else
				if err := src.sp.SetAdvertisements(context.Background(), AdvertisementsOf([]netip.Prefix{blockOf(0), p})); err != nil {
					b.Fatal(err)
				}
				deadline := time.Now().Add(30 * time.Second)
				for _, node := range c.nodes[1:] {
					if got, ok := node.watch.waitFor(deadline, func(rs []LearnedRoute) bool {
						return hasRoute(rs, p, src.addr)
					}); !ok {
						b.Fatalf("%s did not learn %v:%s", node.name, p, routesString(got))
					}
				}
			}
		})
	}
}
