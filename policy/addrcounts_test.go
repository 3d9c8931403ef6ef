package policy

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestAddrCounts: counts per address across both families, forgotten at
// zero, and the members in netip order (IPv4 before IPv6).
func TestAddrCounts(t *testing.T) {
	a := netip.MustParseAddr
	var m addrCounts
	steps := []struct {
		addr string
		n    int
		want int
	}{
		{"10.244.0.2", 1, 1}, {"fd00::2", 1, 1}, {"10.244.0.1", 1, 1}, {"10.244.0.2", 1, 2},
		{"fd00::1", 1, 1}, {"10.244.0.2", -1, 1}, {"fd00::2", -1, 0}, {"10.244.0.3", 1, 1}, {"10.244.0.3", -1, 0},
	}
	for i, s := range steps {
		if got := m.add(a(s.addr), s.n); got != s.want {
			t.Fatalf("step %d: add(%s, %d) = %d, want %d", i, s.addr, s.n, got, s.want)
		}
	}
	want := []netip.Addr{a("10.244.0.1"), a("10.244.0.2"), a("fd00::1")}
	if diff := cmp.Diff(want, m.sorted(), cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
		t.Errorf("sorted (-want +got):\n%s", diff)
	}
	for _, c := range []struct {
		addr string
		want int
	}{{"10.244.0.2", 1}, {"10.244.0.3", 0}, {"fd00::2", 0}, {"fd00::1", 1}} {
		if got := m.count(a(c.addr)); got != c.want {
			t.Errorf("count(%s) = %d, want %d", c.addr, got, c.want)
		}
	}
	if len(m.v4) != 2 || len(m.v6) != 1 {
		t.Errorf("held %d IPv4 and %d IPv6 addresses, want 2 and 1 (zeros forgotten)", len(m.v4), len(m.v6))
	}
}
