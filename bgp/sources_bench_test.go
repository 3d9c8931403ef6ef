package bgp

import (
	"net/netip"
	"testing"
)

// sourceBenchView is a node with n affine blocks and n borrowed addresses
// over 4 pools, two of them aggregated.
func sourceBenchView(n int) SourceView {
	var v SourceView
	for i := range n {
		v.Affine = append(v.Affine, Block{CIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(244 + i%4), byte(i / 4), 0}), 26)})
		v.Borrowed = append(v.Borrowed, Block{CIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(244 + i%4), byte(i / 4), 200}), 32)})
	}
	v.Aggregates = []Aggregate{{Prefix: netip.MustParsePrefix("10.244.0.0/16")}, {Prefix: netip.MustParsePrefix("10.246.0.0/16"), WithBlocks: true}}
	return v
}

// BenchmarkAdvertisements compares the sources (DefaultSources, merged)
// with the computation they replaced (AddAggregates over
// DesiredAdvertisements), on the same view.
func BenchmarkAdvertisements(b *testing.B) {
	v := sourceBenchView(1000)
	b.Run("sources", func(b *testing.B) {
		srcs := DefaultSources()
		for b.Loop() {
			_ = DesiredAdvertisementsFrom(srcs, v)
		}
	})
	b.Run("reference", func(b *testing.B) {
		for b.Loop() {
			_ = AdvertisementsOf(AddAggregates(DesiredAdvertisements(v.Affine, v.Borrowed), v.Aggregates))
		}
	})
}
