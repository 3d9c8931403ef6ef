package ipam

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
)

// Affinity states, as in Calico. Tabby claims a block and confirms its
// affinity in one transaction, so it only ever writes confirmed records. It
// still understands the others, which a Calico-style multi-step writer
// leaves behind when it dies half way: Assign confirms a pending record
// whose block is the node's and deletes one whose block is missing; blocks
// whose record is pendingDeletion are not allocated from.
const (
	affinityPending         = "pending"
	affinityConfirmed       = "confirmed"
	affinityPendingDeletion = "pendingDeletion"
)

// affinityRecord is the JSON stored at ipam/affinities/<node>/<block>.
type affinityRecord struct {
	State string `json:"state"`
}

type affinity struct {
	node  string
	block netip.Prefix
	state string
	rev   int64
}

func encodeAffinity(state string) []byte {
	out, _ := json.Marshal(affinityRecord{State: state})
	return out
}

func decodeAffinity(key string, val []byte, rev int64) (affinity, error) {
	node, blk, err := parseAffinityKey(key)
	if err != nil {
		return affinity{}, err
	}
	var r affinityRecord
	if err := json.Unmarshal(val, &r); err != nil {
		return affinity{}, fmt.Errorf("decoding affinity %s: %w", key, err)
	}
	switch r.State {
	case affinityPending, affinityConfirmed, affinityPendingDeletion:
	default:
		return affinity{}, fmt.Errorf("decoding affinity %s: unknown state %q", key, r.State)
	}
	return affinity{node: node, block: blk, state: r.State, rev: rev}, nil
}

// handleRecord is the JSON stored at ipam/handles/<handle>: the addresses the
// handle holds and the blocks they are in. It is written in the same
// transaction as the blocks, so it always agrees with them.
type handleRecord struct {
	Handle string       `json:"handle"`
	Node   string       `json:"node,omitempty"`
	Addrs  []handleAddr `json:"addrs"`
}

type handleAddr struct {
	Addr  netip.Addr   `json:"addr"`
	Block netip.Prefix `json:"block"`
}

type handle struct {
	handleRecord
	rev int64
}

func decodeHandle(val []byte, rev int64) (*handle, error) {
	var h handle
	if err := json.Unmarshal(val, &h.handleRecord); err != nil {
		return nil, fmt.Errorf("decoding handle: %w", err)
	}
	h.rev = rev
	return &h, nil
}

func (h *handle) encode() []byte {
	out, _ := json.Marshal(h.handleRecord)
	return out
}

// without returns a copy of the handle without the given addresses.
func (h *handle) without(addrs []netip.Addr) *handle {
	c := *h
	c.Addrs = slices.DeleteFunc(slices.Clone(h.Addrs), func(ha handleAddr) bool {
		return slices.Contains(addrs, ha.Addr)
	})
	return &c
}

// with returns a copy of the handle that also holds addr in blk.
func (h *handle) with(addr netip.Addr, blk netip.Prefix) *handle {
	c := *h
	c.Addrs = append(slices.Clone(h.Addrs), handleAddr{Addr: addr, Block: blk})
	return &c
}
