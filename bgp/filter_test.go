package bgp

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestFilterLearned(t *testing.T) {
	p := netip.MustParsePrefix
	gw := []netip.Addr{netip.MustParseAddr("198.18.0.2")}
	ic := ImportContext{
		Workloads:   []netip.Addr{netip.MustParseAddr("10.244.7.5")},
		Blocks:      []netip.Prefix{p("10.244.1.0/26")},
		NodeSubnets: []netip.Prefix{p("198.18.0.0/24")},
		NodeRoutes:  []netip.Prefix{p("0.0.0.0/0"), p("198.18.0.0/24"), p("192.0.2.0/24")},
	}
	tests := []struct {
		name   string
		prefix string
		over   string // "" = kept
	}{
		{"other node's block", "10.244.2.0/26", ""},
		{"borrowed address elsewhere", "10.244.7.6/32", ""},
		{"local workload /32", "10.244.7.5/32", "10.244.7.5/32"},
		{"local block itself", "10.244.1.0/26", "10.244.1.0/26"},
		{"more specific inside local block", "10.244.1.8/29", "10.244.1.0/26"},
		{"more specific inside node subnet", "198.18.0.128/25", "198.18.0.0/24"},
		{"node subnet itself", "198.18.0.0/24", "198.18.0.0/24"},
		{"default over the node's default", "0.0.0.0/0", "0.0.0.0/0"},
		{"equal to a connected route", "192.0.2.0/24", "192.0.2.0/24"},
		{"less specific than a connected route", "192.0.0.0/16", ""},
		{"pool aggregate covering local block", "10.244.0.0/16", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := LearnedRoute{Prefix: p(tt.prefix), NextHops: gw}
			kept, rej := FilterLearned([]LearnedRoute{r}, ic)
			var wantKept []LearnedRoute
			var wantRej []Rejected
			if tt.over == "" {
				wantKept = []LearnedRoute{r}
			} else {
				wantRej = []Rejected{{Route: r, Over: p(tt.over)}}
			}
			opts := []cmp.Option{cmpopts.EquateEmpty(), cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})}
			if diff := cmp.Diff(wantKept, kept, opts...); diff != "" {
				t.Errorf("kept (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantRej, rej, opts...); diff != "" {
				t.Errorf("rejected (-want +got):\n%s", diff)
			}
		})
	}
}
