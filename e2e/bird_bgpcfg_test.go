package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
)

// Issue 30 with BIRD as the ToR: the ToR announces two prefixes, tagged
// (65001,100) and (65001,200); node1 peers with it as AS 65010
// (localASNumber) through a BGPFilter that accepts the first community
// only; node2 does not peer with the ToR, so node2's block reaches BIRD
// through node1 only, and its next hop says what nextHopMode does.
const (
	cfgLocalAS   = 65010
	cfgAccepted  = "198.19.78.0/24"
	cfgRefused   = "198.19.79.0/24"
	cfgTorSource = `# written by TestBIRDLocalASCommunitiesNextHop
log stderr all;
router id 198.18.0.1;
protocol device { scan time 10; }
protocol static tor_static {
	ipv4;
	route 198.19.78.0/24 blackhole;
	route 198.19.79.0/24 blackhole;
}
protocol bgp node1 {
	local 198.18.0.1 as 65001;
	neighbor %s as 65010;
	hold time 9; keepalive time 3; connect retry time 2;
	ipv4 {
		import all;
		export filter {
			if source != RTS_STATIC then reject;
			if net = 198.19.78.0/24 then bgp_community.add((65001,100));
			if net = 198.19.79.0/24 then bgp_community.add((65001,200));
			accept;
		};
	};
}
`
)

func TestBIRDLocalASCommunitiesNextHop(t *testing.T) {
	requireBIRD(t)
	l := upLab(t, lab.Options{Name: "cfgbird", Nodes: 2, PodsPerNode: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	nodes := l.State().Nodes
	n1, n2 := nodes[0], nodes[1]
	b := runBIRD(t, l, fmt.Sprintf(cfgTorSource, n1.IP.Addr()))
	if _, err := l.Store().Create(ctx, &api.BGPFilter{
		Metadata: api.ObjectMeta{Name: "tor-communities"},
		Spec: api.BGPFilterSpec{ImportV4: []api.BGPFilterRule{
			{Communities: &api.BGPFilterCommunityMatch{Values: []string{"65001:100"}}, Action: api.FilterActionAccept},
		}},
	}); err != nil {
		t.Fatal(err)
	}
	peer := &api.BGPPeer{
		Metadata: api.ObjectMeta{Name: "tor"},
		Spec: api.BGPPeerSpec{PeerIP: torAddr, ASNumber: torASN, Node: n1.Name, LocalASNumber: cfgLocalAS,
			Filters: []string{"tor-communities"}, NextHopMode: api.NextHopModeSelf},
	}
	if _, err := l.Store().Create(ctx, peer); err != nil {
		t.Fatal(err)
	}
	s2, err := l.NodeStatus(ctx, n2.Name)
	if err != nil || len(s2.Blocks) == 0 {
		t.Fatalf("node2's blocks: %v %v", s2.Blocks, err)
	}
	block2 := s2.Blocks[0]

	t.Run("LocalASSeenByBIRD", func(t *testing.T) {
		testkit.EventuallyEvery(t, 30*time.Second, 100*time.Millisecond, "BIRD's session from AS 65010", func() error {
			out, err := b.c(ctx, "show", "protocols", "all", "node1")
			if err != nil {
				return err
			}
			for _, line := range strings.Split(out, "\n") {
				if f := strings.Fields(line); len(f) == 3 && f[0] == "Neighbor" && f[1] == "AS:" && f[2] == "65010" && strings.Contains(out, "Established") {
					return nil
				}
			}
			return fmt.Errorf("want Established with neighbor AS 65010:\n%s", out)
		})
		routeAttrs(ctx, t, b, block2, "BGP.as_path: 65010")
	})
	t.Run("CommunityFilter", func(t *testing.T) {
		testkit.EventuallyEvery(t, 20*time.Second, 100*time.Millisecond, "node1 to hold the (65001,100) prefix only", func() error {
			out, err := l.Exec(ctx, n1.Name, "ip", "-4", "route", "show", "proto", "81")
			if err != nil {
				return err
			}
			if !strings.Contains(string(out), cfgAccepted+" via "+torAddr) || strings.Contains(string(out), cfgRefused) {
				return fmt.Errorf("want %s via %s and not %s:\n%s", cfgAccepted, torAddr, cfgRefused, out)
			}
			return nil
		})
	})
	t.Run("NextHopModes", func(t *testing.T) {
		routeAttrs(ctx, t, b, block2, "via "+n1.IP.Addr().String()) // Self
		cur, err := l.Store().Get(ctx, api.KindBGPPeer, "", "tor")
		if err != nil {
			t.Fatal(err)
		}
		p := cur.(*api.BGPPeer)
		p.Spec.NextHopMode, p.Spec.KeepOriginalNextHop = "", true
		if _, err := l.Store().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
		routeAttrs(ctx, t, b, block2, "via "+n2.IP.Addr().String()) // Keep: towards the ToR, node2's own address
	})
}

// routeAttrs waits until BIRD's route to prefix, with its attributes,
// contains want.
func routeAttrs(ctx context.Context, t *testing.T, b *bird, prefix, want string) {
	t.Helper()
	testkit.EventuallyEvery(t, 20*time.Second, 100*time.Millisecond, "BIRD's route to "+prefix+" to show "+want, func() error {
		out, err := b.c(ctx, "show", "route", "for", prefix, "all")
		if err != nil {
			return err
		}
		if !strings.Contains(out, want) {
			return fmt.Errorf("want %q in:\n%s", want, out)
		}
		return nil
	})
}
