package bgp

import (
	"slices"
)

// SourceView is what advertisement sources compute from: this node's share
// of the cluster view, already reduced to the families BGP carries. It
// grows a field when a source needs more (Service addresses, say).
type SourceView struct {
	// Affine are this node's confirmed affine blocks.
	Affine []Block
	// Borrowed are the addresses this node borrowed from other nodes'
	// blocks, as /32 and /128 blocks.
	Borrowed []Block
	// Aggregates are the pools advertised as a whole (PoolAggregates).
	Aggregates []Aggregate
	// Services is what ServiceSource computes from; nil advertises no
	// Service prefixes.
	Services *ServiceView
}

// AdvertisementSource is one kind of prefix a node originates. Sources are
// pure: the same view gives the same advertisements.
type AdvertisementSource interface {
	// Name names the source in logs and errors ("pod-blocks").
	Name() string
	// Advertisements returns what the source wants advertised under v.
	Advertisements(v SourceView) []Advertisement
}

// DefaultSources returns the advertisement sources a node runs: adding a
// kind of advertisement is one more entry here.
func DefaultSources() []AdvertisementSource {
	return []AdvertisementSource{
		PodBlocks{},
		BorrowedAddrs{},
		PoolAggregateSource{},
		ServiceSource{},
	}
}

// DesiredAdvertisementsFrom runs every source over v and merges what they
// give (MergeAdvertisements: one entry per prefix, sorted).
func DesiredAdvertisementsFrom(sources []AdvertisementSource, v SourceView) []Advertisement {
	var all []Advertisement
	for _, src := range sources {
		all = append(all, src.Advertisements(v)...)
	}
	return MergeAdvertisements(all)
}

// PodBlocks advertises this node's affine blocks, each as the aggregate
// route of the pods in it, when their pool allows BGP export.
type PodBlocks struct{}

// Name implements AdvertisementSource.
func (PodBlocks) Name() string { return "pod-blocks" }

// Advertisements implements AdvertisementSource.
func (PodBlocks) Advertisements(v SourceView) []Advertisement { return exported(v.Affine) }

// BorrowedAddrs advertises the addresses this node borrowed from other
// nodes' blocks (/32, /128), when their pool allows BGP export: the more
// specific route beats the lender's block.
type BorrowedAddrs struct{}

// Name implements AdvertisementSource.
func (BorrowedAddrs) Name() string { return "borrowed-addresses" }

// Advertisements implements AdvertisementSource.
func (BorrowedAddrs) Advertisements(v SourceView) []Advertisement { return exported(v.Borrowed) }

// exported are the blocks whose pool allows BGP export, masked, in order
// (MergeAdvertisements sorts).
func exported(blocks []Block) []Advertisement {
	out := make([]Advertisement, 0, len(blocks))
	for _, b := range blocks {
		if !b.DisableBGPExport && b.CIDR.IsValid() {
			out = append(out, Advertisement{Prefix: b.CIDR.Masked()})
		}
	}
	return out
}

// PoolAggregateSource advertises a pool's aggregate (IPPool bgpAggregate)
// while this node advertises a block or a borrowed address in it (see
// AddAggregates). The export policy keeps aggregates from cluster peers.
type PoolAggregateSource struct{}

// Name implements AdvertisementSource.
func (PoolAggregateSource) Name() string { return "pool-aggregates" }

// Advertisements implements AdvertisementSource.
func (PoolAggregateSource) Advertisements(v SourceView) []Advertisement {
	var out []Advertisement
	for _, agg := range v.Aggregates {
		inside := func(b Block) bool {
			return !b.DisableBGPExport && b.CIDR.IsValid() && b.CIDR.Bits() > agg.Prefix.Bits() && agg.Prefix.Contains(b.CIDR.Addr())
		}
		if slices.ContainsFunc(v.Affine, inside) || slices.ContainsFunc(v.Borrowed, inside) {
			out = append(out, Advertisement{Prefix: agg.Prefix})
		}
	}
	return out
}
