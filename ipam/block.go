package ipam

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// affinityPrefix marks a node affinity in a block record ("host:<node>"), as
// Calico writes it.
const affinityPrefix = "host:"

// blockRecord is the JSON stored at ipam/blocks/<block>.
//
// Allocations has one entry per ordinal: null when free, else the index of
// the allocation's entry in Attributes. Unallocated lists the free ordinals
// in the order they will be handed out: allocation takes from the front,
// release appends to the back, so a freed address is reused as late as
// possible.
type blockRecord struct {
	CIDR        string       `json:"cidr"`
	Affinity    string       `json:"affinity,omitempty"`
	Pool        string       `json:"pool,omitempty"`
	Allocations []*int       `json:"allocations"`
	Unallocated []int        `json:"unallocated"`
	Attributes  []attrRecord `json:"attributes"`
}

// attrRecord describes one allocation.
type attrRecord struct {
	Handle      string    `json:"handle"`
	Node        string    `json:"node,omitempty"`
	Namespace   string    `json:"namespace,omitempty"`
	Pod         string    `json:"pod,omitempty"`
	ContainerID string    `json:"containerID,omitempty"`
	Time        time.Time `json:"time"`
}

// block is a decoded block record with its etcd revision.
type block struct {
	cidr netip.Prefix
	// node is the affine node, "" for none.
	node        string
	pool        string
	allocations []*int
	unallocated []int
	attrs       []attrRecord
	rev         int64
}

// newBlock returns an empty block with every ordinal free in order.
func newBlock(cidr netip.Prefix, node, pool string) *block {
	n := blockSizeOf(cidr)
	b := &block{
		cidr:        cidr,
		node:        node,
		pool:        pool,
		allocations: make([]*int, n),
		unallocated: make([]int, n),
	}
	for i := range b.unallocated {
		b.unallocated[i] = i
	}
	return b
}

// decodeBlock parses a block record and checks its internal consistency, so
// that later code may index without bounds worries.
func decodeBlock(val []byte, rev int64) (*block, error) {
	var r blockRecord
	if err := json.Unmarshal(val, &r); err != nil {
		return nil, fmt.Errorf("decoding block: %w", err)
	}
	cidr, err := netip.ParsePrefix(r.CIDR)
	if err != nil {
		return nil, fmt.Errorf("decoding block: cidr: %w", err)
	}
	if !validBlockPrefix(cidr) {
		return nil, fmt.Errorf("decoding block: cidr %s is not a masked prefix of at most %d addresses", r.CIDR, 1<<maxBlockHostBits)
	}
	b := &block{cidr: cidr, pool: r.Pool, allocations: r.Allocations, unallocated: r.Unallocated, attrs: r.Attributes, rev: rev}
	if r.Affinity != "" {
		node, ok := strings.CutPrefix(r.Affinity, affinityPrefix)
		if !ok || node == "" {
			return nil, fmt.Errorf("decoding block %s: affinity %q: want host:<node>", cidr, r.Affinity)
		}
		b.node = node
	}
	if err := b.validate(); err != nil {
		return nil, fmt.Errorf("decoding block %s: %w", cidr, err)
	}
	return b, nil
}

// validate reports every internal inconsistency of the block.
func (b *block) validate() error {
	var errs []error
	size := blockSizeOf(b.cidr)
	if len(b.allocations) != size {
		errs = append(errs, fmt.Errorf("%d allocation slots, want %d", len(b.allocations), size))
	}
	refs := make([]int, len(b.attrs))
	for ord, a := range b.allocations {
		if a == nil {
			continue
		}
		if *a < 0 || *a >= len(b.attrs) {
			errs = append(errs, fmt.Errorf("ordinal %d: attribute index %d out of range", ord, *a))
			continue
		}
		refs[*a]++
	}
	for i, n := range refs {
		if n != 1 {
			errs = append(errs, fmt.Errorf("attribute %d is referenced %d times, want 1", i, n))
		}
	}
	seen := make(map[int]bool, len(b.unallocated))
	for _, ord := range b.unallocated {
		switch {
		case ord < 0 || ord >= len(b.allocations):
			errs = append(errs, fmt.Errorf("unallocated ordinal %d out of range", ord))
		case seen[ord]:
			errs = append(errs, fmt.Errorf("unallocated ordinal %d listed twice", ord))
		case b.allocations[ord] != nil:
			errs = append(errs, fmt.Errorf("ordinal %d is both allocated and unallocated", ord))
		}
		seen[ord] = true
	}
	if free := len(b.allocations) - b.inUse(); free != len(seen) {
		errs = append(errs, fmt.Errorf("%d free ordinals but %d listed as unallocated", free, len(seen)))
	}
	return errors.Join(errs...)
}

// encode returns the block's JSON record.
func (b *block) encode() []byte {
	r := blockRecord{
		CIDR:        b.cidr.String(),
		Pool:        b.pool,
		Allocations: b.allocations,
		Unallocated: b.unallocated,
		Attributes:  b.attrs,
	}
	if b.node != "" {
		r.Affinity = affinityPrefix + b.node
	}
	if r.Attributes == nil {
		r.Attributes = []attrRecord{}
	}
	out, err := json.Marshal(r)
	if err != nil {
		// Only plain strings, ints and times: cannot fail.
		panic(fmt.Sprintf("encoding block %s: %v", b.cidr, err))
	}
	return out
}

// clone returns a deep copy, so that a failed write leaves the original
// (possibly cached) block untouched.
func (b *block) clone() *block {
	c := *b
	c.allocations = make([]*int, len(b.allocations))
	for i, a := range b.allocations {
		if a != nil {
			v := *a
			c.allocations[i] = &v
		}
	}
	c.unallocated = append([]int(nil), b.unallocated...)
	c.attrs = append([]attrRecord(nil), b.attrs...)
	return &c
}

func (b *block) inUse() int { return len(b.attrs) }

func (b *block) free() int { return len(b.unallocated) }

func (b *block) empty() bool { return len(b.attrs) == 0 }

// attrAt returns the attributes of the allocation at ordinal ord.
func (b *block) attrAt(ord int) (attrRecord, bool) {
	if ord < 0 || ord >= len(b.allocations) || b.allocations[ord] == nil {
		return attrRecord{}, false
	}
	return b.attrs[*b.allocations[ord]], true
}

// allocate takes the next free ordinal for attr.
func (b *block) allocate(attr attrRecord) (netip.Addr, bool) {
	if len(b.unallocated) == 0 {
		return netip.Addr{}, false
	}
	ord := b.unallocated[0]
	b.unallocated = b.unallocated[1:]
	b.set(ord, attr)
	return addrAt(b.cidr, ord), true
}

// allocateAddr takes the given address for attr. It fails when the address
// is outside the block or held (naming the holder).
func (b *block) allocateAddr(addr netip.Addr, attr attrRecord) error {
	ord, ok := ordinal(b.cidr, addr)
	if !ok {
		return fmt.Errorf("%s is outside block %s", addr, b.cidr)
	}
	if holder, taken := b.attrAt(ord); taken {
		return &InUseError{Addr: addr, Handle: holder.Handle, Node: holder.Node}
	}
	for i, u := range b.unallocated {
		if u == ord {
			b.unallocated = append(b.unallocated[:i:i], b.unallocated[i+1:]...)
			break
		}
	}
	b.set(ord, attr)
	return nil
}

func (b *block) set(ord int, attr attrRecord) {
	idx := len(b.attrs)
	b.attrs = append(b.attrs, attr)
	b.allocations[ord] = &idx
}

// release frees addr and returns what held it; false when it was free.
func (b *block) release(addr netip.Addr) (attrRecord, bool) {
	ord, ok := ordinal(b.cidr, addr)
	if !ok {
		return attrRecord{}, false
	}
	attr, held := b.attrAt(ord)
	if !held {
		return attrRecord{}, false
	}
	idx := *b.allocations[ord]
	b.allocations[ord] = nil
	b.unallocated = append(b.unallocated, ord)
	// Keep attributes dense: drop idx and renumber the references above it.
	b.attrs = append(b.attrs[:idx:idx], b.attrs[idx+1:]...)
	for _, a := range b.allocations {
		if a != nil && *a > idx {
			*a--
		}
	}
	return attr, true
}

// allocated calls fn for every allocated address in ordinal order.
func (b *block) allocated(fn func(addr netip.Addr, attr attrRecord)) {
	for ord, a := range b.allocations {
		if a != nil {
			fn(addrAt(b.cidr, ord), b.attrs[*a])
		}
	}
}

// allocation describes addr, allocated to attr in this block.
func (b *block) allocation(addr netip.Addr, attr attrRecord) Allocation {
	return Allocation{Addr: addr, Block: b.cidr, BlockNode: b.node, Handle: attr.Handle, Node: attr.Node,
		Namespace: attr.Namespace, Pod: attr.Pod, ContainerID: attr.ContainerID, Time: attr.Time}
}

// appendAllocations appends the block's allocations in ordinal order.
func (b *block) appendAllocations(out []Allocation) []Allocation {
	b.allocated(func(addr netip.Addr, attr attrRecord) { out = append(out, b.allocation(addr, attr)) })
	return out
}

// addrsOf returns the addresses the handle holds in this block.
func (b *block) addrsOf(handle string) []netip.Addr {
	var out []netip.Addr
	b.allocated(func(addr netip.Addr, attr attrRecord) {
		if attr.Handle == handle {
			out = append(out, addr)
		}
	})
	return out
}

// InUseError reports a specific address that is already allocated.
type InUseError struct {
	Addr   netip.Addr
	Handle string
	Node   string
}

func (e *InUseError) Error() string {
	s := fmt.Sprintf("address %s is already in use by handle %q", e.Addr, e.Handle)
	if e.Node != "" {
		s += " on node " + e.Node
	}
	return s
}

// Is makes errors.Is(err, ErrInUse) hold.
func (e *InUseError) Is(target error) bool { return target == ErrInUse }
