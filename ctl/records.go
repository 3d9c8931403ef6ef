package ctl

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/tabbynet/tabby/api"
)

// The ipam package answers questions about pools, blocks and handles but
// not "who holds this address", which tabbyctl needs for ipam show --ip,
// --show-borrowed, release and explain. It reads the block records
// directly, in the layout docs/ipam.md documents.

// blocksPrefix is where IPAM keeps its block records.
const blocksPrefix = "ipam/blocks/"

// blockRecord is the stored JSON of a block.
type blockRecord struct {
	CIDR        string       `json:"cidr"`
	Affinity    string       `json:"affinity"`
	Pool        string       `json:"pool"`
	Allocations []*int       `json:"allocations"`
	Attributes  []attrRecord `json:"attributes"`
}

type attrRecord struct {
	Handle      string    `json:"handle"`
	Node        string    `json:"node"`
	Namespace   string    `json:"namespace"`
	Pod         string    `json:"pod"`
	ContainerID string    `json:"containerID"`
	Time        time.Time `json:"time"`
}

// allocation is one allocated address with what its block says about it.
type allocation struct {
	Addr      netip.Addr
	Block     netip.Prefix
	BlockNode string // the block's affine node, "" = none
	attrRecord
}

// Borrowed reports an address used by a node other than its block's.
func (a allocation) Borrowed() bool { return a.Node != a.BlockNode }

// pod is "namespace/pod", or "" when the allocation names no pod.
func (a allocation) pod() string {
	if a.Pod == "" {
		return ""
	}
	return a.Namespace + "/" + a.Pod
}

// allocations reads every allocated address, sorted by address. Records
// that do not decode are skipped: ipam check reports them.
func (c *Client) allocations(ctx context.Context) ([]allocation, error) {
	kvs, _, err := c.Store.ListKV(ctx, blocksPrefix)
	if err != nil {
		return nil, fmt.Errorf("listing ipam blocks: %w", err)
	}
	var out []allocation
	for _, kv := range kvs {
		var r blockRecord
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			continue
		}
		cidr, err := netip.ParsePrefix(r.CIDR)
		if err != nil || !cidr.Addr().Is4() {
			continue
		}
		cidr = cidr.Masked()
		node := strings.TrimPrefix(r.Affinity, "host:")
		for ord, idx := range r.Allocations {
			if idx == nil || *idx < 0 || *idx >= len(r.Attributes) {
				continue
			}
			out = append(out, allocation{Addr: addrAt(cidr, ord), Block: cidr, BlockNode: node, attrRecord: r.Attributes[*idx]})
		}
	}
	slices.SortFunc(out, func(x, y allocation) int { return x.Addr.Compare(y.Addr) })
	return out, nil
}

// addrAt returns the ord'th address of an IPv4 block.
func addrAt(block netip.Prefix, ord int) netip.Addr {
	b := block.Addr().As4()
	n := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	n += uint32(ord)
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
}

// findAllocation returns the allocation of addr, if any.
func findAllocation(all []allocation, addr netip.Addr) (allocation, bool) {
	i, ok := slices.BinarySearchFunc(all, addr, func(a allocation, t netip.Addr) int { return a.Addr.Compare(t) })
	if !ok {
		return allocation{}, false
	}
	return all[i], true
}

// endpointsByAddr lists every workload endpoint and indexes them by address.
func (c *Client) endpointsByAddr(ctx context.Context) (map[netip.Addr][]*api.WorkloadEndpoint, []*api.WorkloadEndpoint, error) {
	objs, _, err := c.Store.List(ctx, api.KindWorkloadEndpoint, "")
	if err != nil {
		return nil, nil, fmt.Errorf("listing workload endpoints: %w", err)
	}
	byAddr := map[netip.Addr][]*api.WorkloadEndpoint{}
	var all []*api.WorkloadEndpoint
	for _, o := range objs {
		w := o.(*api.WorkloadEndpoint)
		all = append(all, w)
		for _, a := range endpointAddrs(w) {
			byAddr[a] = append(byAddr[a], w)
		}
	}
	return byAddr, all, nil
}

// endpointAddrs returns the endpoint's addresses; entries that do not parse
// are skipped.
func endpointAddrs(w *api.WorkloadEndpoint) []netip.Addr {
	var out []netip.Addr
	for _, n := range w.Spec.IPNetworks {
		if p, err := netip.ParsePrefix(n); err == nil {
			out = append(out, p.Addr())
		} else if a, err := netip.ParseAddr(n); err == nil {
			out = append(out, a)
		}
	}
	return out
}

func wepName(w *api.WorkloadEndpoint) string { return w.Metadata.Namespace + "/" + w.Metadata.Name }
