package ipam

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Key prefixes of IPAM records, relative to the datastore prefix. The
// cluster view (package syncer) watches blocks and affinities; handles
// concern only the node that allocates.
const (
	BlocksPrefix     = blocksPrefix
	AffinitiesPrefix = affinitiesPrefix
	HandlesPrefix    = handlesPrefix
)

// BlockSummary is what a block record says to everything but the
// allocator: which node it is affine to and which of its addresses other
// nodes borrowed. Allocations of the affine node itself are left out, so
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

// DecodeBlockSummary decodes the block record stored at key (under
// BlocksPrefix). BorrowedAddr.DisableBGPExport is left false: it is a
// property of the pool, which the caller knows.
func DecodeBlockSummary(key string, val []byte) (BlockSummary, error) {
	b, err := decodeBlock(val, 0)
	if err != nil {
		return BlockSummary{}, err
	}
	if name, ok := strings.CutPrefix(key, blocksPrefix); ok && name != blockName(b.cidr) {
		return BlockSummary{}, &keyMismatchError{key: key, cidr: b.cidr}
	}
	s := BlockSummary{CIDR: b.cidr, Affinity: b.node, Pool: b.pool}
	b.allocated(func(addr netip.Addr, attr attrRecord) {
		if attr.Node != b.node {
			s.Borrowed = append(s.Borrowed, BorrowedAddr{Addr: addr, Node: attr.Node, Block: b.cidr, BlockNode: b.node})
		}
	})
	slices.SortFunc(s.Borrowed, func(x, y BorrowedAddr) int { return x.Addr.Compare(y.Addr) })
	return s, nil
}

// ParseBlockKey returns the CIDR a block key (under BlocksPrefix) names,
// whatever its record holds.
func ParseBlockKey(key string) (netip.Prefix, error) {
	name, ok := strings.CutPrefix(key, blocksPrefix)
	if !ok {
		return netip.Prefix{}, fmt.Errorf("block key %q: wrong prefix", key)
	}
	return parseBlockName(name)
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

// ParseAffinityKey returns the node and block of an affinity key, for a
// deleted record whose value is gone.
func ParseAffinityKey(key string) (node string, block netip.Prefix, err error) {
	return parseAffinityKey(key)
}
