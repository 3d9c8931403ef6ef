package agent

import (
	"context"
	"testing"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/ipam"
)

// newGCAgent is an agent on a real etcd with a pool and one address
// (handle h1) assigned to node.
func newGCAgent(t *testing.T, node string) *Agent {
	t.Helper()
	ctx := context.Background()
	store := storetest.New(t)
	if _, err := store.Create(ctx, &api.IPPool{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/24", BlockSize: 28}}); err != nil {
		t.Fatal(err)
	}
	a := New(Default(), testLogger(), Deps{})
	a.store, a.ipam = store, ipam.New(store)
	if _, err := a.ipam.Assign(ctx, ipam.AssignRequest{Node: node, Handle: "h1"}); err != nil {
		t.Fatal(err)
	}
	return a
}

func TestReleaseGoneNodes(t *testing.T) {
	ctx := context.Background()
	a := newGCAgent(t, "gone")
	live := map[string]bool{"node1": true}
	pass := func() {
		t.Helper()
		blocks, err := a.ipam.Blocks(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.releaseGoneNodes(ctx, live, blocks); err != nil {
			t.Fatal(err)
		}
	}
	old := NodeGCGrace
	t.Cleanup(func() { NodeGCGrace = old })

	pass()
	blocks, _ := a.ipam.Blocks(ctx)
	for _, b := range blocks {
		if b.Affinity == "gone" {
			t.Errorf("block %s still affine to the deleted node", b.CIDR)
		}
	}
	if addrs, _ := a.ipam.AddressesByHandle(ctx, "h1"); len(addrs) != 1 {
		t.Errorf("addresses released before the grace period: %v", addrs)
	}

	NodeGCGrace = 0
	pass()
	if addrs, _ := a.ipam.AddressesByHandle(ctx, "h1"); len(addrs) != 0 {
		t.Errorf("addresses of the deleted node still allocated after the grace period: %v", addrs)
	}
}

func TestSpeakerRestartsWhenIdentityChanges(t *testing.T) {
	ctx := context.Background()
	store := storetest.New(t)
	var made []*fakeSpeaker
	first := newFakeSpeaker()
	a := New(Default(), testLogger(), Deps{Speaker: first, NewSpeaker: func() bgp.Speaker {
		s := newFakeSpeaker()
		made = append(made, s)
		return s
	}})
	a.store, a.ipam = store, ipam.New(store)
	a.speakerCfg = bgp.Config{ASN: 64512}
	bc := &api.BGPConfiguration{}
	bc.SetDefaults()
	node := &api.Node{Metadata: api.ObjectMeta{Name: a.cfg.NodeName}, Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: "198.18.0.11/24"}}}

	if err := a.ensureSpeakerIdentity(ctx, []*api.Node{node}, bc); err != nil || len(made) != 0 {
		t.Fatalf("unchanged identity: err %v, %d new speakers", err, len(made))
	}
	node.Spec.BGP.RouteReflectorClusterID = "244.0.0.1"
	if err := a.ensureSpeakerIdentity(ctx, []*api.Node{node}, bc); err != nil {
		t.Fatal(err)
	}
	if len(made) != 1 || a.currentSpeaker() != made[0] {
		t.Fatalf("speaker not replaced: %d made", len(made))
	}
	if !first.stopped || !first.graceful {
		t.Errorf("old speaker stopped=%v graceful=%v, want a graceful stop", first.stopped, first.graceful)
	}
	if got := made[0].cfg; got.ClusterID != "244.0.0.1" || !got.LocalRestarting {
		t.Errorf("new speaker config %+v", got)
	}
}
