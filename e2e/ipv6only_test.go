package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/lab"
)

// birdIPv6OnlyConf: BIRD as the ToR of an IPv6-only lab, one IPv6 session
// per node carrying IPv6 only; it imports everything into the ToR's kernel
// and sends the nodes nothing. Its router ID is an identifier only (the
// ToR has no IPv4 address).
const birdIPv6OnlyConf = `# written by TestIPv6Only
log stderr all;
router id 198.18.0.1;
protocol device { scan time 10; }
protocol kernel {
	ipv6 { import none; export where source = RTS_BGP; };
	merge paths on;
}
template bgp tabby_node {
	local ` + torAddr6 + ` as 65001;
	hold time 9;
	keepalive time 3;
	connect retry time 2;
	error wait time 1, 10;
	ipv6 { import all; export none; };
}
`

// TestIPv6Only: a lab with an IPv6-only fabric (tabby-lab up --ipv6-only):
// no IPv4 address on any node's underlay link, Node records with an IPv6
// address only, every mesh session over IPv6 carrying IPv6 only, IPv6-only
// pods whose blocks every other node routes via the owner's IPv6 address
// (BGP-learned, proto 81); every pod pings every other and TCP works
// between every ordered pair, each server seeing the client's own address.
// An IPv4 BGPPeer is refused with the reason in tabbyctl node status,
// and BIRD peering with every node over IPv6 learns every node's blocks
// via their owners and sees the router IDs derived from the node names.
func TestIPv6Only(t *testing.T) {
	l := upLab(t, lab.Options{Name: "v6only", Nodes: 3, PodsPerNode: 1, IPv6OnlyFabric: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	nodes := l.State().Nodes

	t.Run("NoIPv4", func(t *testing.T) { checkNoIPv4(ctx, t, l, nodes) })

	var pods []lab.PodState
	for _, p := range l.State().Pods {
		if len(p.IPs) != 1 || !p.IPs[0].Addr().Is6() || p.IPs[0].Bits() != 128 {
			t.Fatalf("pod %s has addresses %v, want one IPv6 /128", p.Name, p.IPs)
		}
		pods = append(pods, p)
	}
	if len(pods) != len(nodes) {
		t.Fatalf("%d pods, want one per node", len(pods))
	}

	t.Run("PingMatrix", func(t *testing.T) { pingMatrix(t, l) })

	t.Run("TCPMatrix", func(t *testing.T) {
		port := uint16(8090)
		for _, server := range pods {
			for _, client := range pods {
				if server.Name == client.Name {
					continue
				}
				port++
				got := tcp6Exchange(t, l, server.Name, client.Name, netip.AddrPortFrom(server.IPs[0].Addr(), port))
				if want := client.IPs[0].Addr().String(); got != want {
					t.Errorf("TCP %s(%s) -> %s(%s): the server saw %q, want %q", client.Name, client.Node, server.Name, server.Node, got, want)
				}
			}
		}
	})

	t.Run("IPv4PeerRefused", func(t *testing.T) {
		peer := &api.BGPPeer{Metadata: api.ObjectMeta{Name: "tor-v4"},
			Spec: api.BGPPeerSpec{Node: "node1", PeerIP: torAddr, ASNumber: torASN}}
		peer.SetDefaults()
		if _, err := l.Store().Create(ctx, peer); err != nil {
			t.Fatal(err)
		}
		want := "ERROR: BGP session bgppeer/tor-v4 (" + torAddr + ") refused: spec.peerIP " + torAddr + " is IPv4 and node node1 has no IPv4 address"
		testkit.EventuallyEvery(t, 20*time.Second, 200*time.Millisecond, "tabbyctl node status to show the refusal", func() error {
			out, err := tabbyctl(t, l, "node", "status", "--node", "node1")
			if err != nil || !strings.Contains(out, want) || !strings.Contains(out, "2 of 2 BGP sessions established") {
				return fmt.Errorf("tabbyctl node status: %v\n%s", err, out)
			}
			return nil
		})
		if err := l.Store().Delete(ctx, api.KindBGPPeer, "", "tor-v4", ""); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("BIRDOverIPv6", func(t *testing.T) {
		requireBIRD(t)
		testBIRDIPv6Only(ctx, t, l, nodes)
	})
}

// checkNoIPv4: no node has an IPv4 address on its fabric link or an IPv4
// route of Tabby's; Node records carry only an IPv6 address; every mesh
// session is IPv6 and carries IPv6 only; every node has a BGP-learned
// route to every other node's block via the owner's IPv6 address
// (upLab's WaitRoutes checked that).
func checkNoIPv4(ctx context.Context, t *testing.T, l *lab.Lab, nodes []lab.NodeState) {
	for _, n := range nodes {
		if n.IP.IsValid() || !n.IP6.IsValid() {
			t.Errorf("%s: lab addresses %v and %v, want IPv6 only", n.Name, n.IP, n.IP6)
		}
		for _, argv := range [][]string{{"ip", "-4", "addr", "show", "dev", "eth0"}, {"ip", "-4", "route", "show", "table", "all", "proto", "80"}, {"ip", "-4", "route", "show", "table", "all", "proto", "81"}} {
			out, err := l.Exec(ctx, n.Name, argv...)
			if err != nil || strings.TrimSpace(string(out)) != "" {
				t.Errorf("%s: %s: %v %q, want nothing", n.Name, strings.Join(argv, " "), err, out)
			}
		}
		node, err := l.Store().Get(ctx, api.KindNode, "", n.Name)
		if err != nil {
			t.Fatal(err)
		}
		if b := node.(*api.Node).Spec.BGP; b == nil || b.IPv4Address != "" || b.IPv6Address != n.IP6.String() {
			t.Errorf("%s: Node spec.bgp %+v, want ipv6Address %s only", n.Name, b, n.IP6)
		}
		st, err := l.NodeStatus(ctx, n.Name)
		if err != nil {
			t.Fatal(err)
		}
		if st.Address != n.IP6.String() {
			t.Errorf("%s: status address %q, want %s", n.Name, st.Address, n.IP6)
		}
		for _, p := range st.Peers {
			if a, err := netip.ParseAddr(p.Address); err != nil || !a.Is6() || strings.Join(p.Families, ",") != "ipv6" || p.State != "Established" {
				t.Errorf("%s: session %+v, want an Established IPv6 session carrying ipv6", n.Name, p)
			}
		}
		out, err := l.Exec(ctx, n.Name, "ip", "-6", "route", "show", "proto", "81")
		if err != nil || strings.Count(string(out), " via 2001:db8::") < len(nodes)-1 {
			t.Errorf("%s: BGP-learned IPv6 routes %v:\n%s\nwant one per other node via its fabric address", n.Name, err, out)
		}
	}
}

// testBIRDIPv6Only peers BIRD on the ToR with every node over IPv6 and
// checks that BIRD learns every node's blocks via the owner's IPv6 address,
// that the nodes' router IDs are the ones derived from their names, and
// that the ToR reaches every pod through the routes BIRD installed.
func testBIRDIPv6Only(ctx context.Context, t *testing.T, l *lab.Lab, nodes []lab.NodeState) {
	conf := birdIPv6OnlyConf
	for _, n := range nodes {
		conf += fmt.Sprintf("protocol bgp %s from tabby_node { neighbor %s as %d; }\n", n.Name, n.IP6.Addr(), api.DefaultASNumber)
	}
	b := runBIRD(t, l, conf)
	peer := &api.BGPPeer{Metadata: api.ObjectMeta{Name: "tor6"}, Spec: api.BGPPeerSpec{PeerIP: torAddr6, ASNumber: torASN}}
	peer.SetDefaults()
	if _, err := l.Store().Create(ctx, peer); err != nil {
		t.Fatal(err)
	}
	owner := map[string]string{}
	for _, n := range nodes {
		s, err := l.NodeStatus(ctx, n.Name)
		if err != nil {
			t.Fatal(err)
		}
		for _, blk := range s.Blocks {
			owner[blk] = n.IP6.Addr().String()
		}
	}
	if len(owner) < len(nodes) {
		t.Fatalf("blocks %v, want one per node at least", owner)
	}
	testkit.EventuallyEvery(t, 40*time.Second, 200*time.Millisecond, "BIRD to learn every node's blocks over IPv6", func() error {
		var errs []error
		for _, n := range nodes {
			out, err := b.c(ctx, "show", "protocols", "all", n.Name)
			if err != nil {
				return err
			}
			if birdProtocolState(out, n.Name) != "Established" {
				errs = append(errs, fmt.Errorf("BIRD protocol %s not Established:\n%s", n.Name, out))
			} else if id := bgp.RouterIDFor(n.Name, ""); !strings.Contains(strings.Join(strings.Fields(out), " "), "Neighbor ID: "+id.String()) {
				errs = append(errs, fmt.Errorf("BIRD protocol %s: want neighbor ID %s:\n%s", n.Name, id, out))
			}
		}
		out, err := b.c(ctx, "show", "route")
		if err != nil {
			return err
		}
		routes := parseBIRDRoutes(out)
		for blk, via := range owner {
			paths := routes[blk]
			if !slices.ContainsFunc(paths, func(p birdPath) bool { return p.best && p.via == via }) {
				errs = append(errs, fmt.Errorf("BIRD has no best route to %s via its owner %s: %+v", blk, via, paths))
			}
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("%w\nbirdc show route:\n%s", err, out)
		}
		return nil
	})
	for _, p := range l.State().Pods {
		ip := p.IPs[0].Addr().String()
		testkit.EventuallyEvery(t, 15*time.Second, 200*time.Millisecond, "the ToR to reach pod "+p.Name+" at "+ip, func() error {
			if out, err := l.Exec(ctx, "tor", "ping", "-c1", "-W1", "-n", ip); err != nil {
				return fmt.Errorf("%w: %s", err, out)
			}
			return nil
		})
	}
}
