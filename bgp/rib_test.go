package bgp

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// A RIB read asks GoBGP about the peers whose paths may not count (a
// prefix limit, BFD), not about every peer: GoBGP's ListPeer holds the
// server's write lock while it counts each listed peer's Adj-RIB-In, which
// on a reflector with hundreds of clients stalled every session.
func TestRIBReadListsOnlyLimitablePeers(t *testing.T) {
	addr := netip.MustParseAddr
	client := func(a netip.Addr) Peer { return Peer{Address: a, ASN: 64512, Type: PeerRRClient} }
	bfd := client(addr("198.18.0.22"))
	bfd.BFD = &BFD{}
	limited := client(addr("198.18.0.23"))
	limited.MaxPrefixes = 100
	ext := Peer{Address: addr("198.18.0.1"), ASN: 65001, Type: PeerGlobal}

	peers := map[netip.Addr]Peer{}
	for i := range 300 {
		p := client(netip.AddrFrom4([4]byte{198, 18, byte(4 + i/256), byte(i)}))
		peers[p.Address] = p
	}
	if got := limitCandidates(peers); len(got) != 0 {
		t.Errorf("300 cluster clients without limit or BFD: candidates %v, want none", got)
	}
	if reqs := peerListRequests(limitCandidates(peers)); len(reqs) != 0 {
		t.Errorf("no candidates: %d ListPeer calls, want none", len(reqs))
	}

	for _, p := range []Peer{bfd, limited, ext} {
		peers[p.Address] = p
	}
	want := []netip.Addr{ext.Address, bfd.Address, limited.Address}
	got := limitCandidates(peers)
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("candidates (-want +got):\n%s", diff)
	}
	var addrs []string
	for _, r := range peerListRequests(got) {
		addrs = append(addrs, r.Address)
	}
	if diff := cmp.Diff([]string{"198.18.0.1", "198.18.0.22", "198.18.0.23"}, addrs); diff != "" {
		t.Errorf("ListPeer addresses (-want +got):\n%s", diff)
	}

	many := make([]netip.Addr, listEach+1)
	for i := range many {
		many[i] = netip.AddrFrom4([4]byte{198, 18, 5, byte(i)})
	}
	if reqs := peerListRequests(many); len(reqs) != 1 || reqs[0].Address != "" {
		t.Errorf("%d candidates: %v, want one ListPeer of every peer", len(many), reqs)
	}
}

// A RIB read that changed no prefix's paths reports no change, so the
// publisher does not select routes again (the periodic full read of a RIB
// at rest); any difference, full or partial, does.
func TestMergeRIB(t *testing.T) {
	p1, p2 := netip.MustParsePrefix("10.244.1.0/26"), netip.MustParsePrefix("10.244.2.0/26")
	a := candidate{peer: netip.MustParseAddr("198.18.0.11"), nextHop: netip.MustParseAddr("198.18.0.11"), ibgp: true, localPref: 100}
	b := a
	b.nextHop = netip.MustParseAddr("198.18.0.12")
	base := func() map[netip.Prefix][]candidate {
		return map[netip.Prefix][]candidate{p1: {a}, p2: {a, b}}
	}
	tests := []struct {
		name        string
		u           ribUpdate
		wantChanged bool
		want        map[netip.Prefix][]candidate
	}{
		{"full, same", ribUpdate{full: true, rib: base()}, false, base()},
		{"full, a prefix gone", ribUpdate{full: true, rib: map[netip.Prefix][]candidate{p1: {a}}}, true, map[netip.Prefix][]candidate{p1: {a}}},
		{"full, paths reordered", ribUpdate{full: true, rib: map[netip.Prefix][]candidate{p1: {a}, p2: {b, a}}}, true, map[netip.Prefix][]candidate{p1: {a}, p2: {b, a}}},
		{"partial, same", ribUpdate{changed: map[netip.Prefix]bool{p2: true}, rib: map[netip.Prefix][]candidate{p2: {a, b}}}, false, base()},
		{"partial, withdrawn", ribUpdate{changed: map[netip.Prefix]bool{p1: true}, rib: map[netip.Prefix][]candidate{}}, true, map[netip.Prefix][]candidate{p2: {a, b}}},
		{"partial, a path gone", ribUpdate{changed: map[netip.Prefix]bool{p2: true}, rib: map[netip.Prefix][]candidate{p2: {b}}}, true, map[netip.Prefix][]candidate{p1: {a}, p2: {b}}},
		{"no read (End-of-RIB only)", ribUpdate{}, false, base()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rib := base()
			if got := mergeRIB(rib, tt.u); got != tt.wantChanged {
				t.Errorf("changed = %v, want %v", got, tt.wantChanged)
			}
			if diff := cmp.Diff(tt.want, rib, cmp.AllowUnexported(candidate{}), cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
				t.Errorf("RIB after merge (-want +got):\n%s", diff)
			}
		})
	}
}

// The periodic full read runs every routesResyncMin, or less often when a
// read takes long enough that it would cost more than 1/resyncShare of the
// time or the RIB holds more paths than routesResyncMin/resyncPerPath, and
// at least every routesResyncMax.
func TestResyncEvery(t *testing.T) {
	for _, tc := range []struct {
		took  time.Duration
		paths int
		want  time.Duration
	}{
		{0, 0, routesResyncMin},
		{30 * time.Millisecond, 0, routesResyncMin},
		{100 * time.Millisecond, 0, 200 * time.Second},
		{time.Second, 0, routesResyncMax},
		{0, 400, routesResyncMin},   // 200 nodes, two reflectors
		{0, 600, 3 * time.Minute},   // 300 nodes
		{0, 2000, 10 * time.Minute}, // 1,000 nodes
		{100 * time.Millisecond, 2000, 10 * time.Minute},
		{0, 100000, routesResyncMax},
	} {
		if got := resyncEvery(tc.took, tc.paths); got != tc.want {
			t.Errorf("resyncEvery(%v, %d) = %v, want %v", tc.took, tc.paths, got, tc.want)
		}
	}
}
