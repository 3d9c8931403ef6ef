package agent

import (
	"net/netip"
	"testing"
	"time"

	"github.com/tabbynet/tabby/agent/routetable"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/syncer/syncertest"
)

// newPassOwners makes the two route owners of benchRoutePass over one
// route table; resync makes the next pass diff against the whole kernel.
//
// For the "before" figures in BENCHMARKS.md (issue 24), at ff7bdc3, with
// routepass_bench_test.go copied in, this function was:
//
//	v := startView(b, syncertest.Static{})
//	ro = newRouteOwner("node1", v, kernel, testLogger())
//	bo = newBGPOwner("node1", netip.MustParsePrefix("198.18.0.11/24"), v, kernel, newFakeSpeaker(), nil, time.Minute, newMetrics(), testLogger())
//	bo.converged = true
//	return ro, bo, nil
func newPassOwners(b *testing.B, kernel dataplane.Routes) (ro *routeOwner, bo *bgpOwner, resync func()) {
	v := startView(b, syncertest.Static{})
	table := routetable.New(kernel, time.Hour)
	ro = newRouteOwner("node1", v, table, testLogger())
	bo = newBGPOwner("node1", netip.MustParsePrefix("198.18.0.11/24"), v, table, newFakeSpeaker(), nil, time.Minute, newMetrics(), testLogger())
	bo.converged = true
	return ro, bo, table.Resync
}
