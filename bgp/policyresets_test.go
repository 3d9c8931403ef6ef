package bgp

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	gobgpapi "github.com/osrg/gobgp/v4/api"
)

func TestPolicyResets(t *testing.T) {
	a := netip.MustParseAddr
	node := func(addr string) Peer {
		return Peer{Address: a(addr), ASN: 64512, Type: PeerRRClient, RRClient: true, ClusterNode: true}
	}
	tor := Peer{Address: a("198.18.0.1"), ASN: 65001, Type: PeerGlobal}
	base := policyInput{asn: 64512, peers: []Peer{tor, node("198.18.4.1"), node("198.18.4.2")},
		pools: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
	with := func(f func(in *policyInput)) policyInput {
		in := base
		in.peers = append([]Peer(nil), base.peers...)
		f(&in)
		return in
	}
	filtered := node("198.18.4.2")
	filtered.Export = []FilterRule{{CIDR: netip.MustParsePrefix("10.244.0.0/16"), Operator: MatchIn}}
	for _, tc := range []struct {
		name    string
		old     *policyInput
		in      policyInput
		all     bool
		changed []netip.Addr
	}{
		{"first policy", nil, base, true, nil},
		{"unchanged", &base, base, false, nil},
		{"a node joins", &base, with(func(in *policyInput) { in.peers = append(in.peers, node("198.18.4.3")) }), false, nil},
		{"a node leaves", &base, with(func(in *policyInput) { in.peers = in.peers[:2] }), false, nil},
		{"a pool is added", &base, with(func(in *policyInput) {
			in.pools = append(in.pools, netip.MustParsePrefix("10.245.0.0/16"))
		}), true, nil},
		{"an aggregate is added", &base, with(func(in *policyInput) {
			in.aggregates = []Aggregate{{Prefix: netip.MustParsePrefix("10.244.0.0/16")}}
		}), true, nil},
		{"a peer's export filter changes", &base, with(func(in *policyInput) { in.peers[2] = filtered }), false, []netip.Addr{a("198.18.4.2")}},
		{"a peer stops being a cluster node", &base, with(func(in *policyInput) {
			in.peers[1].ClusterNode, in.peers[1].Type = false, PeerGlobal
		}), false, []netip.Addr{a("198.18.4.1")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			all, changed := policyResets(tc.old, tc.in)
			if all != tc.all {
				t.Errorf("all = %v, want %v", all, tc.all)
			}
			if diff := cmp.Diff(tc.changed, changed, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
				t.Errorf("changed (-want +got):\n%s", diff)
			}
		})
	}
}

// The export policy's sets of cluster peers are covering prefixes, as the
// import policy's are: 256 clients at consecutive addresses are one entry.
func TestExportClusterSetsCovered(t *testing.T) {
	in := policyInput{asn: 64512, pools: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		aggregates: []Aggregate{{Prefix: netip.MustParsePrefix("10.244.0.0/16")}}}
	for i := range 256 {
		in.peers = append(in.peers, Peer{Address: netip.AddrFrom4([4]byte{198, 18, 4, byte(i)}), ASN: 64512, Type: PeerRRClient, ClusterNode: true})
	}
	req := buildPolicies(in, "")
	sets := map[string][]string{}
	for _, s := range req.DefinedSets {
		if s.DefinedType == gobgpapi.DefinedType_DEFINED_TYPE_NEIGHBOR {
			sets[s.Name] = s.List
		}
	}
	want := map[string][]string{
		clusterSet:                      {"198.18.4.0/24"},
		"tabby-export-services-peers":   {"198.18.4.0/24"},
		"tabby-export-aggregates-peers": {"198.18.4.0/24"},
	}
	if diff := cmp.Diff(want, sets); diff != "" {
		t.Errorf("neighbor sets (-want +got):\n%s", diff)
	}
}
