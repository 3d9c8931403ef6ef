package ipam

import (
	"net/netip"
	"slices"
)

// Key prefixes of IPAM records, relative to the datastore prefix. The
// cluster view (package syncer) watches block summaries and affinities;
// blocks and handles concern only the node that allocates.
const (
	BlocksPrefix     = blocksPrefix
	AffinitiesPrefix = affinitiesPrefix
)

// BlockSummary is what a block record says to everything but the
// allocator, as its summary record (ipam/block-summaries/) holds it:
// which node it is affine to and which of its addresses other nodes
// borrowed. Allocations of the affine node itself are left out, so
// that a pod added in its own node's block leaves the summary unchanged
// and wakes nobody else.
type BlockSummary struct {
	CIDR netip.Prefix
	// Affinity is the affine node, "" for none.
	Affinity string
	Pool     string
	// Borrowed are the addresses allocated to other nodes than Affinity,
	// sorted by address.
	Borrowed []BorrowedAddr
}

// Equal reports whether two summaries say the same.
func (s BlockSummary) Equal(o BlockSummary) bool {
	return s.CIDR == o.CIDR && s.Affinity == o.Affinity && s.Pool == o.Pool &&
		slices.EqualFunc(s.Borrowed, o.Borrowed, func(x, y BorrowedAddr) bool {
			return x.Addr == y.Addr && x.Node == y.Node
		})
}

type keyMismatchError struct {
	key  string
	cidr netip.Prefix
}

func (e *keyMismatchError) Error() string {
	return "block key " + e.key + " holds block " + e.cidr.String()
}

// Affinity is a node's claim on a block, from its ipam/affinities record.
type Affinity struct {
	Node  string
	Block netip.Prefix
	// Confirmed: the claim is complete (Tabby writes only confirmed
	// claims; others are left behind by an interrupted multi-step writer).
	Confirmed bool
}

// DecodeAffinity decodes the affinity record stored at key.
func DecodeAffinity(key string, val []byte) (Affinity, error) {
	af, err := decodeAffinity(key, val, 0)
	if err != nil {
		return Affinity{}, err
	}
	return Affinity{Node: af.node, Block: af.block, Confirmed: af.state == affinityConfirmed}, nil
}
