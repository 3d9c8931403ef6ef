package agent

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/internal/testkit"
)

// The policy owner gives the firewall the node guard from the view: every
// node's addresses (the fake renders the IPv4 part), BGPPeers' addresses, the agent's ports; a node added
// later wakes the owner and joins the set, and a node's label change does
// not wake it.
func TestPolicyOwnerNodeGuard(t *testing.T) {
	ctx := context.Background()
	store := storetest.New(t)
	mustCreate(t, store, &api.Node{Metadata: api.ObjectMeta{Name: "node1"}, Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: "198.18.0.11/24", IPv6Address: "2001:db8::b/64"}}})
	mustCreate(t, store, &api.BGPPeer{Metadata: api.ObjectMeta{Name: "tor"}, Spec: api.BGPPeerSpec{PeerIP: "198.18.0.1", ASNumber: 65000}})
	fw := &fake.Firewall{}
	view := startView(t, store)
	p := newPolicyOwner("node1", view, fw, quietLog())
	p.agentPorts = []uint16{9099}
	if err := p.sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	members := func(set string) []string {
		m, _ := fw.Set(set)
		return m
	}
	if got := members("tabby-nodes"); !slices.Equal(got, []string{"198.18.0.11/32"}) {
		t.Errorf("tabby-nodes %v", got)
	}
	if got := members("tabby-bgp-peers"); !slices.Equal(got, []string{"198.18.0.1/32"}) {
		t.Errorf("tabby-bgp-peers %v", got)
	}
	rules, ok := fw.Rules("filter", "tabby-node-guard")
	if !ok || len(rules) == 0 {
		t.Fatalf("no guard chain: %v", rules)
	}
	if fw, ok := fw.Rules("filter", "tabby-FORWARD"); !ok || fw[0] != "-A tabby-FORWARD -i cali+ -j tabby-node-guard" {
		t.Errorf("tabby-FORWARD does not start with the guard: %v", fw)
	}

	<-p.sub.C() // the subscription's first kick
	n2 := &api.Node{Metadata: api.ObjectMeta{Name: "node2"}, Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: "198.18.0.12/24"}}}
	mustCreate(t, store, n2)
	select {
	case <-p.sub.C():
	case <-time.After(10 * time.Second):
		t.Fatal("a new node did not wake the policy owner")
	}
	if err := p.sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	if got := members("tabby-nodes"); !slices.Equal(got, []string{"198.18.0.11/32", "198.18.0.12/32"}) {
		t.Errorf("tabby-nodes after node2 joined: %v", got)
	}
	got, err := store.Get(ctx, api.KindNode, "", "node2")
	if err != nil {
		t.Fatal(err)
	}
	got.GetMeta().Labels = map[string]string{"rack": "a"}
	rev, err := store.Update(ctx, got)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the label change in the view", testkit.Cond(func() bool {
		n, ok := view.Node("node2")
		return ok && n.Metadata.ResourceVersion == rev.GetMeta().ResourceVersion
	}))
	select {
	case <-p.sub.C():
		t.Error("a node's label change woke the policy owner")
	default:
	}
}
