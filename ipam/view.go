package ipam

import (
	"encoding/json"
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
	// Every node decodes every block write (one per pod added anywhere):
	// read only what the summary needs, not the allocations' times,
	// handles and pods.
	var r struct {
		CIDR        string `json:"cidr"`
		Affinity    string `json:"affinity"`
		Pool        string `json:"pool"`
		Allocations []*int `json:"allocations"`
		Attributes  []struct {
			Node string `json:"node"`
		} `json:"attributes"`
	}
	if err := json.Unmarshal(val, &r); err != nil {
		return BlockSummary{}, fmt.Errorf("decoding block: %w", err)
	}
	cidr, err := netip.ParsePrefix(r.CIDR)
	if err != nil || !validBlockPrefix(cidr) {
		return BlockSummary{}, fmt.Errorf("decoding block: cidr %q is not a masked prefix of at most %d addresses", r.CIDR, 1<<maxBlockHostBits)
	}
	if name, ok := strings.CutPrefix(key, blocksPrefix); ok && name != blockName(cidr) {
		return BlockSummary{}, &keyMismatchError{key: key, cidr: cidr}
	}
	if len(r.Allocations) != blockSizeOf(cidr) {
		return BlockSummary{}, fmt.Errorf("decoding block %s: %d allocation slots, want %d", cidr, len(r.Allocations), blockSizeOf(cidr))
	}
	s := BlockSummary{CIDR: cidr, Pool: r.Pool}
	if r.Affinity != "" {
		node, ok := strings.CutPrefix(r.Affinity, affinityPrefix)
		if !ok || node == "" {
			return BlockSummary{}, fmt.Errorf("decoding block %s: affinity %q: want host:<node>", cidr, r.Affinity)
		}
		s.Affinity = node
	}
	for ord, a := range r.Allocations {
		if a == nil {
			continue
		}
		if *a < 0 || *a >= len(r.Attributes) {
			return BlockSummary{}, fmt.Errorf("decoding block %s: ordinal %d: attribute index %d out of range", cidr, ord, *a)
		}
		if n := r.Attributes[*a].Node; n != s.Affinity {
			addr := addrAt(cidr, ord)
			s.Borrowed = append(s.Borrowed, BorrowedAddr{Addr: addr, Node: n, Block: cidr, BlockNode: s.Affinity})
		}
	}
	return s, nil // ordinals ascend, so Borrowed is sorted by address
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
