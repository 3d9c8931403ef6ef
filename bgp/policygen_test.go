package bgp

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	gobgpapi "github.com/osrg/gobgp/v4/api"

	"github.com/tabbynet/tabby/api"
)

// TestOldPolicyGenerationsDeleted: each policy change installs a new
// generation of policies, statements and sets and deletes the previous
// one entirely, so GoBGP's policy tables do not grow with the number of
// changes (a reflector's peer set changes with every node that joins or
// leaves). Before, GoBGP kept an empty policy of every generation, and
// v4.8.0 its statements too.
func TestOldPolicyGenerationsDeleted(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("127.77.61.1")}
	port := freePort(t, addrs)
	ctx := context.Background()
	n := startNode(t, "n", Config{RouterID: addrs[0], ASN: api.DefaultASNumber, ListenAddr: addrs[0], ListenPort: int32(port)})
	for _, cidr := range []string{"10.244.0.0/16", "10.245.0.0/16", "10.246.0.0/16"} {
		pools := []*api.IPPool{{Metadata: api.ObjectMeta{Name: "a"}, Spec: api.IPPoolSpec{CIDR: cidr, BGPCommunities: []string{"65001:100"}}}}
		if err := n.sp.SetPolicy(ctx, Policy{Pools: poolPrefixesOf(pools), Communities: PoolCommunities(pools)}); err != nil {
			t.Fatal(err)
		}
		gen := n.sp.policyGen
		current := func(name string) bool {
			return strings.HasPrefix(name, fmt.Sprintf("v%d-", gen)) || !strings.HasPrefix(name, "v")
		}
		var stale []string
		if err := n.sp.srv.ListPolicy(ctx, &gobgpapi.ListPolicyRequest{}, func(p *gobgpapi.Policy) {
			if !current(p.Name) {
				stale = append(stale, "policy "+p.Name)
			}
		}); err != nil {
			t.Fatal(err)
		}
		if err := n.sp.srv.ListStatement(ctx, &gobgpapi.ListStatementRequest{}, func(s *gobgpapi.Statement) {
			if !current(s.Name) {
				stale = append(stale, "statement "+s.Name)
			}
		}); err != nil {
			t.Fatal(err)
		}
		for _, typ := range []gobgpapi.DefinedType{gobgpapi.DefinedType_DEFINED_TYPE_PREFIX, gobgpapi.DefinedType_DEFINED_TYPE_NEIGHBOR, gobgpapi.DefinedType_DEFINED_TYPE_COMMUNITY, gobgpapi.DefinedType_DEFINED_TYPE_LARGE_COMMUNITY} {
			if err := n.sp.srv.ListDefinedSet(ctx, &gobgpapi.ListDefinedSetRequest{DefinedType: typ}, func(s *gobgpapi.DefinedSet) {
				if !current(s.Name) {
					stale = append(stale, "set "+s.Name)
				}
			}); err != nil {
				t.Fatal(err)
			}
		}
		slices.Sort(stale)
		if len(stale) > 0 {
			t.Errorf("generation v%d: GoBGP still holds earlier generations: %q", gen, stale)
		}
	}
}
