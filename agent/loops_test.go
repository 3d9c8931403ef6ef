package agent

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/datastore"
)

func TestAffects(t *testing.T) {
	cfg := Default()
	cfg.NodeName = "node1"
	a := New(cfg, testLogger(), Deps{})
	tests := []struct {
		key              string
		routing, bgpLoop bool
	}{
		{"ipam/handles/k8s-pod-network.abc", false, false},
		{"ipam/affinities/node1/10.244.0.0-26", true, true},
		{"ipam/affinities/node2/10.244.0.64-26", false, false},
		{"ipam/blocks/10.244.0.0-26", true, true},
		{"resources/workloadendpoints/default/node1-k8s-web-eth0", true, false},
		{"resources/workloadendpoints/default/node10-k8s-web-eth0", false, false},
		{"resources/workloadendpoints/default/node2-k8s-web-eth0", false, false},
		{"resources/nodes/node3", true, true},
		{"resources/bgppeers/tor", true, true},
	}
	for _, tt := range tests {
		r, b := a.affects(datastore.Event{Type: datastore.EventPut, KV: datastore.KV{Key: tt.key}})
		if r != tt.routing || b != tt.bgpLoop {
			t.Errorf("%s: routing %v bgp %v, want %v %v", tt.key, r, b, tt.routing, tt.bgpLoop)
		}
	}
	if r, b := a.affects(datastore.Event{Type: datastore.EventResync}); !r || !b {
		t.Error("a resync must wake both loops")
	}
}

func TestSyncLearnedKeepsStaleUntilConverged(t *testing.T) {
	cfg := Default()
	cfg.NodeName = "node1"
	stale := dataplane.Route{Dst: netip.MustParsePrefix("10.244.9.0/26"), Gateways: []netip.Addr{netip.MustParseAddr("198.18.0.19")}, Proto: dataplane.RouteProtoBGP}
	foreign := dataplane.Route{Dst: netip.MustParsePrefix("192.0.2.0/24"), Gateways: []netip.Addr{netip.MustParseAddr("198.18.0.1")}, Proto: 4}
	routes := fake.NewRoutes(stale, foreign)
	a := New(cfg, testLogger(), Deps{Routes: routes})
	a.nodeAddr = netip.MustParsePrefix("198.18.0.11/24")
	a.learned = []bgp.LearnedRoute{
		{Prefix: netip.MustParsePrefix("10.244.1.0/26"), NextHops: []netip.Addr{netip.MustParseAddr("198.18.0.13"), netip.MustParseAddr("198.18.0.12")}},
		{Prefix: netip.MustParsePrefix("10.244.2.0/26"), NextHops: []netip.Addr{netip.MustParseAddr("198.18.0.11")}}, // via ourselves: dropped
	}
	if _, err := a.syncLearned(); err != nil {
		t.Fatal(err)
	}
	got := routes.String()
	for _, want := range []string{"10.244.1.0/26", "nexthop via 198.18.0.12", "nexthop via 198.18.0.13", "10.244.9.0/26", "192.0.2.0/24"} {
		if !strings.Contains(got, want) {
			t.Errorf("before convergence, routes lack %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "10.244.2.0/26") {
		t.Errorf("a route via this node itself was installed:\n%s", got)
	}
	a.converged = true
	if _, err := a.syncLearned(); err != nil {
		t.Fatal(err)
	}
	got = routes.String()
	if strings.Contains(got, "10.244.9.0/26") {
		t.Errorf("stale learned route kept after convergence:\n%s", got)
	}
	if !strings.Contains(got, "192.0.2.0/24") {
		t.Errorf("a foreign route was touched:\n%s", got)
	}
}
