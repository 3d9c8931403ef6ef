package bgp

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tabbynet/tabby/api"
)

type nodeOpt func(*api.Node)

func withLabels(kv ...string) nodeOpt {
	return func(n *api.Node) {
		n.Metadata.Labels = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			n.Metadata.Labels[kv[i]] = kv[i+1]
		}
	}
}

func withRR(clusterID string) nodeOpt {
	return func(n *api.Node) { n.Spec.BGP.RouteReflectorClusterID = clusterID }
}

func withASN(asn uint32) nodeOpt {
	return func(n *api.Node) { n.Spec.BGP.ASNumber = &asn }
}

func node(name, cidr string, opts ...nodeOpt) *api.Node {
	n := &api.Node{Metadata: api.ObjectMeta{Name: name}, Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: cidr}}}
	for _, o := range opts {
		o(n)
	}
	return n
}

func bgpPeer(name string, spec api.BGPPeerSpec) *api.BGPPeer {
	return &api.BGPPeer{Metadata: api.ObjectMeta{Name: name}, Spec: spec}
}

func meshOff() *api.BGPConfiguration {
	f := false
	return &api.BGPConfiguration{Spec: api.BGPConfigurationSpec{NodeToNodeMeshEnabled: &f}}
}

func sel(kv ...string) *api.LabelSelector {
	s := &api.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

var a = netip.MustParseAddr

func TestDesiredPeers(t *testing.T) {
	asn65000 := uint32(65000)
	port := uint16(1790)
	threeNodes := []*api.Node{
		node("n1", "198.18.0.1/24"),
		node("n2", "198.18.0.2/24"),
		node("n3", "198.18.0.3/24"),
		{Metadata: api.ObjectMeta{Name: "no-bgp"}},
	}
	rrCluster := []*api.Node{
		node("rr1", "198.18.0.11/24", withRR("1.1.1.1"), withLabels("role", "rr")),
		node("rr2", "198.18.0.12/24", withRR("1.1.1.1"), withLabels("role", "rr")),
		node("c1", "198.18.0.21/24"),
		node("c2", "198.18.0.22/24"),
	}
	rrPeers := []*api.BGPPeer{
		bgpPeer("to-rr", api.BGPPeerSpec{NodeSelector: &api.LabelSelector{}, PeerSelector: sel("role", "rr")}),
		bgpPeer("rr-to-all", api.BGPPeerSpec{NodeSelector: sel("role", "rr"), PeerSelector: &api.LabelSelector{}}),
	}
	oneRR := []*api.Node{rrCluster[0], rrCluster[2], rrCluster[3]} // rr1, c1, c2
	notRR := &api.LabelSelector{MatchExpressions: []api.LabelSelectorRequirement{{Key: "role", Operator: api.OpDoesNotExist}}}
	clientsToRR := []*api.BGPPeer{bgpPeer("clients-to-rr", api.BGPPeerSpec{NodeSelector: notRR, PeerSelector: sel("role", "rr")})}
	tests := []struct {
		name  string
		self  string
		nodes []*api.Node
		cfg   *api.BGPConfiguration
		peers []*api.BGPPeer
		want  []Peer
	}{
		{
			name:  "mesh of three, self excluded, node without address skipped",
			self:  "n2",
			nodes: threeNodes,
			want: []Peer{
				{Address: a("198.18.0.1"), ASN: 64512, Type: PeerMesh, Name: "n1", LocalAddress: a("198.18.0.2")},
				{Address: a("198.18.0.3"), ASN: 64512, Type: PeerMesh, Name: "n3", LocalAddress: a("198.18.0.2")},
			},
		},
		{
			name:  "mesh with password, timers, port and cluster ASN",
			self:  "n1",
			nodes: threeNodes,
			cfg: &api.BGPConfiguration{Spec: api.BGPConfigurationSpec{
				ASNumber: &asn65000, NodeMeshPassword: api.PlainPassword("s3cret"), ListenPort: &port,
				KeepaliveTime: &api.Duration{Duration: 3 * time.Second}, HoldTime: &api.Duration{Duration: 9 * time.Second},
				NodeMeshMaxRestartTime: &api.Duration{Duration: 2 * time.Minute},
			}},
			want: []Peer{
				{Address: a("198.18.0.2"), ASN: 65000, Type: PeerMesh, Name: "n2", Password: "s3cret", Keepalive: 3 * time.Second,
					Hold: 9 * time.Second, RestartTime: 2 * time.Minute, LocalAddress: a("198.18.0.1"), Port: 1790},
				{Address: a("198.18.0.3"), ASN: 65000, Type: PeerMesh, Name: "n3", Password: "s3cret", Keepalive: 3 * time.Second,
					Hold: 9 * time.Second, RestartTime: 2 * time.Minute, LocalAddress: a("198.18.0.1"), Port: 1790},
			},
		},
		{
			name:  "mesh: reflectors still mesh as plain iBGP",
			self:  "rr1",
			nodes: rrCluster,
			want: []Peer{
				{Address: a("198.18.0.12"), ASN: 64512, Type: PeerMesh, Name: "rr2", LocalAddress: a("198.18.0.11")},
				{Address: a("198.18.0.21"), ASN: 64512, Type: PeerMesh, Name: "c1", LocalAddress: a("198.18.0.11")},
				{Address: a("198.18.0.22"), ASN: 64512, Type: PeerMesh, Name: "c2", LocalAddress: a("198.18.0.11")},
			},
		},
		{
			name:  "mesh off, client peers only with reflectors",
			self:  "c1",
			nodes: rrCluster,
			cfg:   meshOff(),
			peers: rrPeers,
			want: []Peer{
				{Address: a("198.18.0.11"), ASN: 64512, Type: PeerRR, Name: "rr1", LocalAddress: a("198.18.0.21")},
				{Address: a("198.18.0.12"), ASN: 64512, Type: PeerRR, Name: "rr2", LocalAddress: a("198.18.0.21")},
			},
		},
		{
			name:  "mesh off, reflector: same cluster plain iBGP, own routes only, clients marked",
			self:  "rr2",
			nodes: rrCluster,
			cfg:   meshOff(),
			peers: rrPeers,
			want: []Peer{
				{Address: a("198.18.0.11"), ASN: 64512, Type: PeerRR, Name: "rr1", LocalAddress: a("198.18.0.12"), OwnRoutesOnly: true},
				{Address: a("198.18.0.21"), ASN: 64512, Type: PeerRRClient, Name: "c1", RRClient: true, LocalAddress: a("198.18.0.12")},
				{Address: a("198.18.0.22"), ASN: 64512, Type: PeerRRClient, Name: "c2", RRClient: true, LocalAddress: a("198.18.0.12")},
			},
		},
		{
			name: "mesh off, reflectors with different cluster IDs are each other's clients",
			self: "rr1",
			nodes: []*api.Node{
				node("rr1", "198.18.0.11/24", withRR("1.1.1.1"), withLabels("role", "rr")),
				node("rr2", "198.18.0.12/24", withRR("2.2.2.2"), withLabels("role", "rr")),
			},
			cfg:   meshOff(),
			peers: rrPeers,
			want: []Peer{
				{Address: a("198.18.0.12"), ASN: 64512, Type: PeerRRClient, Name: "rr2", RRClient: true, LocalAddress: a("198.18.0.11")},
			},
		},
		{
			name:  "mesh off, no BGPPeers: no sessions",
			self:  "n1",
			nodes: threeNodes,
			cfg:   meshOff(),
		},
		{
			name:  "global eBGP peer with port, mesh still on, sourceAddress None",
			self:  "n3",
			nodes: threeNodes,
			peers: []*api.BGPPeer{bgpPeer("tor", api.BGPPeerSpec{
				PeerIP: "198.18.0.254:1179", ASNumber: 65001, Password: api.PlainPassword("md5pw"), SourceAddress: api.SourceAddressNone,
				HoldTime: &api.Duration{Duration: 30 * time.Second},
			})},
			want: []Peer{
				{Address: a("198.18.0.1"), ASN: 64512, Type: PeerMesh, Name: "n1", LocalAddress: a("198.18.0.3")},
				{Address: a("198.18.0.2"), ASN: 64512, Type: PeerMesh, Name: "n2", LocalAddress: a("198.18.0.3")},
				{Address: a("198.18.0.254"), ASN: 65001, Type: PeerGlobal, Name: "tor", Password: "md5pw", Hold: 30 * time.Second, Port: 1179},
			},
		},
		{
			name:  "node-scoped peer applies to its node only",
			self:  "n1",
			nodes: threeNodes,
			cfg:   meshOff(),
			peers: []*api.BGPPeer{
				bgpPeer("n1-tor", api.BGPPeerSpec{Node: "n1", PeerIP: "198.18.0.253", ASNumber: 65002}),
				bgpPeer("n2-tor", api.BGPPeerSpec{Node: "n2", PeerIP: "198.18.0.252", ASNumber: 65002}),
			},
			want: []Peer{
				{Address: a("198.18.0.253"), ASN: 65002, Type: PeerNode, Name: "n1-tor", LocalAddress: a("198.18.0.1")},
			},
		},
		{
			name: "nodeSelector picks nodes by label",
			self: "n2",
			nodes: []*api.Node{
				node("n1", "198.18.0.1/24", withLabels("rack", "a")),
				node("n2", "198.18.0.2/24", withLabels("rack", "b")),
			},
			cfg: meshOff(),
			peers: []*api.BGPPeer{
				bgpPeer("rack-a", api.BGPPeerSpec{NodeSelector: sel("rack", "a"), PeerIP: "198.18.1.1", ASNumber: 65010}),
				bgpPeer("rack-b", api.BGPPeerSpec{NodeSelector: &api.LabelSelector{MatchExpressions: []api.LabelSelectorRequirement{
					{Key: "rack", Operator: api.OpIn, Values: []string{"b", "c"}}}}, PeerIP: "198.18.2.1", ASNumber: 65020}),
			},
			want: []Peer{
				{Address: a("198.18.2.1"), ASN: 65020, Type: PeerNode, Name: "rack-b", LocalAddress: a("198.18.0.2")},
			},
		},
		{
			name: "explicit beats mesh, smallest BGPPeer name wins, self's address and bad peerIP ignored",
			self: "n1",
			nodes: []*api.Node{
				node("n1", "198.18.0.1/24"),
				node("n2", "198.18.0.2/24", withASN(65099)),
			},
			peers: []*api.BGPPeer{
				bgpPeer("b", api.BGPPeerSpec{PeerIP: "198.18.0.2", Password: api.PlainPassword("second")}),
				bgpPeer("a", api.BGPPeerSpec{PeerIP: "198.18.0.2", Password: api.PlainPassword("first")}),
				bgpPeer("self", api.BGPPeerSpec{PeerIP: "198.18.0.1", ASNumber: 65000}),
				bgpPeer("bad", api.BGPPeerSpec{PeerIP: "not-an-ip", ASNumber: 65000}),
			},
			want: []Peer{
				{Address: a("198.18.0.2"), ASN: 65099, Type: PeerGlobal, Name: "n2", Password: "first", LocalAddress: a("198.18.0.1")},
			},
		},
		{
			name: "reflector makes an outside iBGP router its client, not an eBGP one",
			self: "rr1",
			nodes: []*api.Node{
				node("rr1", "198.18.0.11/24", withRR("1.1.1.1")),
			},
			cfg: meshOff(),
			peers: []*api.BGPPeer{
				bgpPeer("ibgp", api.BGPPeerSpec{PeerIP: "198.18.5.1"}),
				bgpPeer("ebgp", api.BGPPeerSpec{PeerIP: "198.18.5.2", ASNumber: 65005}),
			},
			want: []Peer{
				{Address: a("198.18.5.1"), ASN: 64512, Type: PeerGlobal, Name: "ibgp", RRClient: true, LocalAddress: a("198.18.0.11")},
				{Address: a("198.18.5.2"), ASN: 65005, Type: PeerGlobal, Name: "ebgp", LocalAddress: a("198.18.0.11")},
			},
		},
		{
			// A single BGPPeer "clients peer with the reflectors" must
			// configure both ends: the reflectors peer back with every
			// node the BGPPeer applies to.
			name:  "reflector peers back with the nodes of a clients-to-rr BGPPeer",
			self:  "rr1",
			nodes: oneRR,
			cfg:   meshOff(),
			peers: clientsToRR,
			want: []Peer{
				{Address: a("198.18.0.21"), ASN: 64512, Type: PeerRRClient, Name: "c1", RRClient: true, LocalAddress: a("198.18.0.11")},
				{Address: a("198.18.0.22"), ASN: 64512, Type: PeerRRClient, Name: "c2", RRClient: true, LocalAddress: a("198.18.0.11")},
			},
		},
		{
			name:  "client of a clients-to-rr BGPPeer peers with the reflector",
			self:  "c1",
			nodes: oneRR,
			cfg:   meshOff(),
			peers: clientsToRR,
			want: []Peer{
				{Address: a("198.18.0.11"), ASN: 64512, Type: PeerRR, Name: "rr1", LocalAddress: a("198.18.0.21")},
			},
		},
		{
			name:  "self unknown",
			self:  "ghost",
			nodes: threeNodes,
		},
		{
			name:  "self without address",
			self:  "no-bgp",
			nodes: threeNodes,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := DesiredPeers(tt.self, tt.nodes, tt.cfg, tt.peers, nil)
			// Every peer that is one of the nodes is a cluster peer.
			for i := range tt.want {
				for _, n := range tt.nodes {
					if p, ok := n.IPv4(); ok && p.Addr() == tt.want[i].Address {
						tt.want[i].ClusterNode = true
					}
				}
			}
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty(), cmpopts.EquateComparable(netip.Addr{})); diff != "" {
				t.Errorf("DesiredPeers(%q) mismatch (-want +got):\n%s", tt.self, diff)
			}
		})
	}
}

// TestDesiredPeersSymmetric checks the whole cluster of reflector
// sessions for symmetry: every session one side wants, the other side wants
// too, with the reflector flag on the reflector side only.
func TestDesiredPeersSymmetric(t *testing.T) {
	nodes := []*api.Node{
		node("rr1", "198.18.0.11/24", withRR("1.1.1.1"), withLabels("role", "rr")),
		node("rr2", "198.18.0.12/24", withRR("1.1.1.1"), withLabels("role", "rr")),
	}
	for i := range 6 {
		nodes = append(nodes, node("c"+string(rune('a'+i)), netip.AddrFrom4([4]byte{198, 18, 0, byte(21 + i)}).String()+"/24"))
	}
	peers := []*api.BGPPeer{
		bgpPeer("to-rr", api.BGPPeerSpec{NodeSelector: &api.LabelSelector{}, PeerSelector: sel("role", "rr")}),
		bgpPeer("rr-to-all", api.BGPPeerSpec{NodeSelector: sel("role", "rr"), PeerSelector: &api.LabelSelector{}}),
	}
	type edge struct{ from, to netip.Addr }
	want := map[edge]Peer{}
	addrOf := map[string]netip.Addr{}
	for _, n := range nodes {
		p, _ := n.IPv4()
		addrOf[n.Metadata.Name] = p.Addr()
	}
	for _, n := range nodes {
		for _, p := range DesiredPeers(n.Metadata.Name, nodes, meshOff(), peers, nil) {
			want[edge{addrOf[n.Metadata.Name], p.Address}] = p
		}
	}
	if len(want) != 2*(1+2*6) {
		t.Fatalf("got %d directed sessions, want %d", len(want), 2*(1+2*6))
	}
	for e, p := range want {
		back, ok := want[edge{e.to, e.from}]
		if !ok {
			t.Errorf("%v wants %v but not the reverse", e.from, e.to)
			continue
		}
		if p.RRClient && back.RRClient {
			t.Errorf("%v and %v both mark each other as clients", e.from, e.to)
		}
	}
}

func TestDesiredAdvertisements(t *testing.T) {
	p := netip.MustParsePrefix
	tests := []struct {
		name             string
		affine, borrowed []Block
		want             []netip.Prefix
	}{
		{name: "empty"},
		{
			name: "blocks and borrowed, sorted, masked, deduplicated, export disabled skipped",
			affine: []Block{
				{CIDR: p("10.244.1.0/26")},
				{CIDR: p("10.244.0.64/26")},
				{CIDR: p("10.244.0.70/26")}, // masks to 10.244.0.64/26
				{CIDR: p("10.245.0.0/26"), DisableBGPExport: true},
				{},
			},
			borrowed: []Block{
				{CIDR: p("10.244.9.7/32")},
				{CIDR: p("10.244.9.7/32")},
				{CIDR: p("10.245.9.7/32"), DisableBGPExport: true},
			},
			want: []netip.Prefix{p("10.244.0.64/26"), p("10.244.1.0/26"), p("10.244.9.7/32")},
		},
		{
			name:     "same address, different lengths sort shorter first",
			affine:   []Block{{CIDR: p("10.244.0.0/26")}},
			borrowed: []Block{{CIDR: p("10.244.0.0/32")}},
			want:     []netip.Prefix{p("10.244.0.0/26"), p("10.244.0.0/32")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := DesiredAdvertisements(tt.affine, tt.borrowed)
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty(), cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
				t.Errorf("DesiredAdvertisements mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
