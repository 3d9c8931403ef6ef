package bgp

import (
	"net/netip"
	"testing"

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
