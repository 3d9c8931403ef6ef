package agent

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/ipam"
)

// A node that advertises a pool aggregate drops traffic for the pool's
// unallocated addresses (a blackhole for the whole pool) instead of
// sending it back to the router along its default route. Only for
// aggregates it advertises: a block or a borrowed address of its own in
// the pool, the pool exported.
func TestAggregateBlackholes(t *testing.T) {
	p := netip.MustParsePrefix
	pools := []*api.IPPool{
		{Metadata: api.ObjectMeta{Name: "only"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", BGPAggregate: api.AggregateOnly}},
		{Metadata: api.ObjectMeta{Name: "with"}, Spec: api.IPPoolSpec{CIDR: "10.245.0.0/16", BGPAggregate: api.AggregateWithBlocks}},
		{Metadata: api.ObjectMeta{Name: "other"}, Spec: api.IPPoolSpec{CIDR: "10.246.0.0/16", BGPAggregate: api.AggregateOnly}},
		{Metadata: api.ObjectMeta{Name: "plain"}, Spec: api.IPPoolSpec{CIDR: "10.247.0.0/16"}},
	}
	blocks := []ipam.BlockInfo{
		{CIDR: p("10.244.1.0/26"), Affinity: "n1", Confirmed: true},
		{CIDR: p("10.246.0.0/26"), Affinity: "n2", Confirmed: true}, // another node's
		{CIDR: p("10.247.0.0/26"), Affinity: "n1", Confirmed: true},
	}
	borrowed := []ipam.BorrowedAddr{{Addr: netip.MustParseAddr("10.245.0.9"), Node: "n1", Block: p("10.245.0.0/26"), BlockNode: "n2"}}
	got := aggregateBlackholes("n1", pools, blocks, borrowed)
	want := []dataplane.Route{
		{Dst: p("10.244.0.0/16"), Type: dataplane.RouteBlackhole, Proto: dataplane.RouteProtoWorkload},
		{Dst: p("10.245.0.0/16"), Type: dataplane.RouteBlackhole, Proto: dataplane.RouteProtoWorkload},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(x, y netip.Prefix) bool { return x == y }), cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
		t.Errorf("aggregateBlackholes (-want +got):\n%s", diff)
	}
	if got := aggregateBlackholes("n3", pools, blocks, nil); len(got) != 0 {
		t.Errorf("a node with nothing in the pools got %v", got)
	}
}
