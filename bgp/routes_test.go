package bgp

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestSelectRoutes(t *testing.T) {
	p := netip.MustParsePrefix
	self := []netip.Addr{a("198.18.0.1")}
	ibgp := func(nh string) candidate { return candidate{nextHop: a(nh), ibgp: true, localPref: 100} }
	tests := []struct {
		name string
		rib  map[netip.Prefix][]candidate
		skip map[netip.Addr]bool
		want []LearnedRoute
	}{
		{name: "empty"},
		{
			name: "single path, sorted output",
			rib: map[netip.Prefix][]candidate{
				p("10.244.2.0/26"): {ibgp("198.18.0.3")},
				p("10.244.1.0/26"): {ibgp("198.18.0.2")},
			},
			want: []LearnedRoute{
				{Prefix: p("10.244.1.0/26"), NextHops: []netip.Addr{a("198.18.0.2")}},
				{Prefix: p("10.244.2.0/26"), NextHops: []netip.Addr{a("198.18.0.3")}},
			},
		},
		{
			name: "equal paths give ECMP, duplicates and worse paths dropped",
			rib: map[netip.Prefix][]candidate{
				p("10.244.9.0/26"): {
					ibgp("198.18.0.4"), ibgp("198.18.0.2"), ibgp("198.18.0.4"),
					{nextHop: a("198.18.0.5"), ibgp: true, localPref: 100, med: 10},
					{nextHop: a("198.18.0.6"), ibgp: true, localPref: 100, asPathLen: 1},
					{nextHop: a("198.18.0.7"), ibgp: true, localPref: 100, origin: 2},
					{nextHop: a("198.18.0.8"), ibgp: true, localPref: 90},
				},
			},
			want: []LearnedRoute{{Prefix: p("10.244.9.0/26"), NextHops: []netip.Addr{a("198.18.0.2"), a("198.18.0.4")}}},
		},
		{
			name: "eBGP best does not tie with iBGP",
			rib: map[netip.Prefix][]candidate{
				p("0.0.0.0/0"): {{nextHop: a("198.18.0.254"), localPref: 100, asPathLen: 1}, {nextHop: a("198.18.0.2"), ibgp: true, localPref: 100, asPathLen: 1}},
			},
			want: []LearnedRoute{{Prefix: p("0.0.0.0/0"), NextHops: []netip.Addr{a("198.18.0.254")}}},
		},
		{
			name: "prefix we originate is skipped",
			rib: map[netip.Prefix][]candidate{
				p("10.244.1.0/26"): {{local: true, nextHop: a("198.18.0.1")}, ibgp("198.18.0.2")},
			},
		},
		{
			name: "path via ourselves skipped, next best used",
			rib: map[netip.Prefix][]candidate{
				p("10.244.1.0/26"): {ibgp("198.18.0.1"), {nextHop: a("198.18.0.3"), ibgp: true, localPref: 100, med: 5}},
				p("10.244.2.0/26"): {ibgp("198.18.0.1")},
				p("10.244.3.0/26"): {{ibgp: true}},
			},
			want: []LearnedRoute{{Prefix: p("10.244.1.0/26"), NextHops: []netip.Addr{a("198.18.0.3")}}},
		},
		{
			name: "paths of a silent BFD peer skipped, next best used",
			rib: map[netip.Prefix][]candidate{
				p("198.19.77.0/24"): {
					{peer: a("198.18.0.254"), nextHop: a("198.18.0.254"), localPref: 100, asPathLen: 1},
					{peer: a("198.18.0.2"), nextHop: a("198.18.0.253"), ibgp: true, localPref: 100, asPathLen: 1},
				},
				p("198.19.78.0/24"): {{peer: a("198.18.0.254"), nextHop: a("198.18.0.254"), localPref: 100, asPathLen: 1}},
			},
			skip: map[netip.Addr]bool{a("198.18.0.254"): true},
			want: []LearnedRoute{{Prefix: p("198.19.77.0/24"), NextHops: []netip.Addr{a("198.18.0.253")}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := selectRoutes(tt.rib, self, tt.skip)
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty(), cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})); diff != "" {
				t.Errorf("selectRoutes mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
