package fake

import (
	"net"
	"net/netip"
	"slices"

	"github.com/tabbynet/tabby/dataplane"
)

func cloneSpec(s dataplane.WorkloadSpec) dataplane.WorkloadSpec {
	s.Addrs = slices.Clone(s.Addrs)
	return s
}

func sortedPrefixes(ps []netip.Prefix) []netip.Prefix {
	out := slices.Clone(ps)
	slices.SortFunc(out, netip.Prefix.Compare)
	return out
}

func normMAC(s string) string {
	if hw, err := net.ParseMAC(s); err == nil {
		return hw.String()
	}
	return s
}

func sameSpec(a, b dataplane.WorkloadSpec) bool {
	return a.NetNS == b.NetNS && a.IfName == b.IfName && a.HostIfName == b.HostIfName &&
		a.EffectiveMTU() == b.EffectiveMTU() && normMAC(a.MAC) == normMAC(b.MAC) &&
		slices.Equal(sortedPrefixes(a.Addrs), sortedPrefixes(b.Addrs))
}
