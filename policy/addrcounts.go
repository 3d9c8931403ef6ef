package policy

import (
	"maps"
	"net/netip"
	"slices"
)

// addrCounts counts the endpoints holding each address of a live set. A
// set's members grow with the cluster (a selector of many pods: one member
// per pod, in each set that takes it), so IPv4 addresses are kept under
// 4-byte keys: 8 bytes a slot against 32 for a netip.Addr and an int
// (docs/scale.md, "Agent memory"). Endpoint addresses carry no zone and
// no IPv4-mapped form (parseEndpointAddr), so the two maps never hold one
// address twice.
type addrCounts struct {
	v4 map[[4]byte]int32
	v6 map[netip.Addr]int32
}

// add adds n (1 or -1) to a's count, forgetting a at 0, and returns the
// new count.
func (m *addrCounts) add(a netip.Addr, n int) int {
	if a.Is4() {
		if m.v4 == nil {
			m.v4 = map[[4]byte]int32{}
		}
		return bump(m.v4, a.As4(), n)
	}
	if m.v6 == nil {
		m.v6 = map[netip.Addr]int32{}
	}
	return bump(m.v6, a, n)
}

func bump[K comparable](m map[K]int32, k K, n int) int {
	c := m[k] + int32(n)
	if c == 0 {
		delete(m, k)
	} else {
		m[k] = c
	}
	return int(c)
}

// count is a's count.
func (m *addrCounts) count(a netip.Addr) int {
	if a.Is4() {
		return int(m.v4[a.As4()])
	}
	return int(m.v6[a])
}

// sorted returns the counted addresses in order.
func (m *addrCounts) sorted() []netip.Addr {
	out := make([]netip.Addr, 0, len(m.v4)+len(m.v6))
	for k := range m.v4 {
		out = append(out, netip.AddrFrom4(k))
	}
	out = append(out, slices.Collect(maps.Keys(m.v6))...)
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
