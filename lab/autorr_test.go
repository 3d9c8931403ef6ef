package lab

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/bgp"
)

func TestAutoExpectedPeers(t *testing.T) {
	node := func(i int, zone string) NodeState {
		return NodeState{Name: NodeName(i), Zone: zone, IP: netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, 0, byte(10 + i)}), 24)}
	}
	a, b := ZoneName(0), ZoneName(1)
	nodes := []NodeState{node(1, a), node(2, b), node(3, a), node(4, b), node(5, a)}
	rr := func(zones map[string][]string) *bgp.ReflectorChoice {
		c := &bgp.ReflectorChoice{Zones: map[string][]bgp.Reflector{}}
		for z, ns := range zones {
			for _, n := range ns {
				c.Zones[z] = append(c.Zones[z], bgp.Reflector{Node: n, ClusterID: bgp.ZoneClusterID(z)})
			}
		}
		return c
	}
	// Only node1 and node2 may be elected (Options.ReflectorCandidates).
	candidates := slices.Clone(nodes)
	for i := 2; i < len(candidates); i++ {
		candidates[i].NotCandidate = true
	}
	tests := []struct {
		name    string
		nodes   []NodeState
		perZone int
		choice  *bgp.ReflectorChoice
		want    map[string][]string
		wantErr string
	}{
		{"none elected", nil, 1, nil, nil, "no route reflector elected"},
		{"zone short", nil, 2, rr(map[string][]string{a: {"node1", "node3"}, b: {"node2"}}), nil, `zone "zone-b" has 1 reflectors, want 2`},
		{"one per zone", nil, 1, rr(map[string][]string{a: {"node1"}, b: {"node2"}}), map[string][]string{
			// Reflectors peer with each other and their zone's clients;
			// clients with their zone's reflector only.
			"node1": {"198.18.0.12", "198.18.0.13", "198.18.0.15"},
			"node2": {"198.18.0.11", "198.18.0.14"},
			"node3": {"198.18.0.11"},
			"node4": {"198.18.0.12"},
			"node5": {"198.18.0.11"},
		}, ""},
		{"a zone without reflectors", nil, 1, rr(map[string][]string{a: {"node1"}}), nil, `zone "zone-b" has 0 reflectors, want 1`},
		// Two per zone wanted, but each zone has one candidate: complete.
		{"zones with fewer candidates", candidates, 2, rr(map[string][]string{a: {"node1"}, b: {"node2"}}), map[string][]string{
			"node1": {"198.18.0.12", "198.18.0.13", "198.18.0.15"},
			"node2": {"198.18.0.11", "198.18.0.14"},
			"node3": {"198.18.0.11"},
			"node4": {"198.18.0.12"},
			"node5": {"198.18.0.11"},
		}, ""},
		// The same choice when every node is a candidate lacks reflectors.
		{"zones with more candidates", nil, 2, rr(map[string][]string{a: {"node1"}, b: {"node2"}}), nil, `has 1 reflectors, want 2`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.nodes
			if in == nil {
				in = nodes
			}
			got, err := autoExpectedPeers(in, tt.perZone, tt.choice, true)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("autoExpectedPeers() error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("autoExpectedPeers (-want +got):\n%s", diff)
			}
		})
	}
}
