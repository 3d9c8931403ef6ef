package bgp

import (
	"context"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp/session"
)

// The mesh password reaches mesh sessions and cluster peers a BGPPeer
// selects without a password; a BGPPeer's own password and external
// peers are left alone; nodeMeshPassword, when set, wins over the
// generated key for every cluster session.
func TestWithMeshPassword(t *testing.T) {
	nodes := []*api.Node{node("a", "198.18.0.1/24"), node("b", "198.18.0.2/24"), node("rr", "198.18.0.3/24"), node("c", "198.18.0.4/24")}
	nodes[3].Metadata.Labels = map[string]string{"secret": "own"}
	nodes[2].Metadata.Labels = map[string]string{"rr": "yes"}
	off := false
	peers := []*api.BGPPeer{
		{Metadata: api.ObjectMeta{Name: "to-rr"}, Spec: api.BGPPeerSpec{PeerSelector: &api.LabelSelector{MatchLabels: map[string]string{"rr": "yes"}}}},
		{Metadata: api.ObjectMeta{Name: "to-c"}, Spec: api.BGPPeerSpec{PeerSelector: &api.LabelSelector{MatchLabels: map[string]string{"secret": "own"}}, Password: api.PlainPassword("own")}},
		{Metadata: api.ObjectMeta{Name: "tor"}, Spec: api.BGPPeerSpec{PeerIP: "198.18.0.254", ASNumber: 65000}},
		{Metadata: api.ObjectMeta{Name: "tor-pw"}, Spec: api.BGPPeerSpec{PeerIP: "198.18.0.253", ASNumber: 65000, Password: api.PlainPassword("tor")}},
	}
	for _, c := range []struct {
		name string
		cfg  *api.BGPConfiguration
		want map[string]string // peer address -> password
	}{
		{"mesh on", nil, map[string]string{
			"198.18.0.2": "k", "198.18.0.3": "k", "198.18.0.4": "own", "198.18.0.254": "", "198.18.0.253": "tor"}},
		{"mesh on, nodeMeshPassword", &api.BGPConfiguration{Spec: api.BGPConfigurationSpec{NodeMeshPassword: api.PlainPassword("explicit")}}, map[string]string{
			"198.18.0.2": "explicit", "198.18.0.3": "explicit", "198.18.0.4": "own", "198.18.0.254": "", "198.18.0.253": "tor"}},
		{"mesh off", &api.BGPConfiguration{Spec: api.BGPConfigurationSpec{NodeToNodeMeshEnabled: &off}}, map[string]string{
			"198.18.0.3": "k", "198.18.0.4": "own", "198.18.0.254": "", "198.18.0.253": "tor"}},
	} {
		got := map[string]string{}
		for _, p := range WithMeshPassword(DesiredPeers("a", nodes, c.cfg, peers, nil), MeshPassword(c.cfg, "k")) {
			got[p.Address.String()] = p.Password
		}
		if len(got) != len(c.want) {
			t.Errorf("%s: peers %v, want %v", c.name, got, c.want)
		}
		for addr, pw := range c.want {
			if got[addr] != pw {
				t.Errorf("%s: peer %s has password %q, want %q", c.name, addr, got[addr], pw)
			}
		}
	}
	if ps := WithMeshPassword(DesiredPeers("a", nodes, nil, nil, nil), ""); ps[0].Password != "" {
		t.Errorf("an empty mesh password set %q", ps[0].Password)
	}
}

// meshPeers are node i's cluster peers with the mesh password pw.
func (c *cluster) meshPeers(i int, pw string) []Peer {
	port := c.port
	cfg := &api.BGPConfiguration{Spec: api.BGPConfigurationSpec{ListenPort: &port}}
	return WithMeshPassword(DesiredPeers(c.nodes[i].name, c.api, cfg, nil, nil), MeshPassword(cfg, pw))
}

func (c *cluster) setPeers(t *testing.T, i int, peers []Peer) {
	t.Helper()
	if err := c.nodes[i].sp.SetPeers(context.Background(), peers); err != nil {
		t.Fatalf("SetPeers on %s: %v", c.nodes[i].name, err)
	}
}

// notEstablishedFor fails the test if n's sessions reach OpenConfirm or
// Established within d.
func notEstablishedFor(t *testing.T, n *testNode, d time.Duration, what string) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		st, err := n.sp.Peers(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range st {
			if p.State == session.Established || p.State == session.OpenConfirm {
				t.Fatalf("%s: %s reached %s with %v", what, n.name, p.State, p.Address)
			}
		}
	}
}

// TestMeshKeyRefusesImpostor: a node keyed with the mesh key refuses a
// session from its peer's address that carries no key (what a pod
// masqueraded to its stopped node's address would open), and one with
// another key; once the peer has the key, the session establishes.
func TestMeshKeyRefusesImpostor(t *testing.T) {
	c := newCluster(t, 60, 2, nil)
	if err := md5Supported(t, c.nodes[0].addr, c.nodes[1].addr); err != nil {
		t.Skipf("kernel refuses TCP MD5 on loopback: %v", err)
	}
	c.setPeers(t, 0, c.meshPeers(0, "mesh-key"))
	c.setPeers(t, 1, c.meshPeers(1, "")) // the impostor: node01's address, no key
	notEstablishedFor(t, c.nodes[0], 3*ConnectRetry/2, "an unkeyed speaker at the peer's address")
	c.setPeers(t, 1, c.meshPeers(1, "another-key"))
	notEstablishedFor(t, c.nodes[0], 3*ConnectRetry/2, "a speaker with another key")
	c.setPeers(t, 1, c.meshPeers(1, "mesh-key"))
	waitEstablished(t, c.nodes[0], 1, time.Now().Add(convergeTimeout))
}

// TestMeshKeyRotation: the rotation procedure of docs/bgp.md. Both ends
// have the old key and are established; the new key reaches one end,
// then the other (as each agent's view sees it); each session is
// re-created once and establishes with the new key, and a speaker still
// on the old key is refused.
func TestMeshKeyRotation(t *testing.T) {
	c := newCluster(t, 61, 3, nil)
	if err := md5Supported(t, c.nodes[0].addr, c.nodes[1].addr); err != nil {
		t.Skipf("kernel refuses TCP MD5 on loopback: %v", err)
	}
	for i := range c.nodes {
		c.setPeers(t, i, c.meshPeers(i, "old-key"))
	}
	before := waitEstablished(t, c.nodes[0], 2, time.Now().Add(convergeTimeout))
	start := time.Now()
	c.setPeers(t, 0, c.meshPeers(0, "new-key"))
	c.setPeers(t, 1, c.meshPeers(1, "new-key"))
	// node02 still has the old key: node00 and node01 reach each other,
	// not node02.
	deadline := time.Now().Add(convergeTimeout)
	for {
		st, err := c.nodes[0].sp.Peers(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(st) == 2 && st[0].State == session.Established && st[0].Since.After(before[0].Since) {
			if st[1].State == session.Established {
				t.Fatalf("node00 established with node02, which has the old key: %+v", st[1])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node00 and node01 not re-established with the new key:%s", peersString(c.nodes[0]))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("rotation: session node00-node01 re-established %v after the new key reached both", time.Since(start).Round(time.Millisecond))
	c.setPeers(t, 2, c.meshPeers(2, "new-key"))
	waitEstablished(t, c.nodes[0], 2, time.Now().Add(convergeTimeout))
	waitEstablished(t, c.nodes[2], 2, time.Now().Add(convergeTimeout))
}
