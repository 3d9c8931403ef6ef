package agent

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/internal/testkit"
)

// A mesh key rotation holds the learned routes: after the password
// changes, a peer's routes withdrawn (GoBGP re-creates the neighbour) stay
// in the kernel until BGP has converged again; the first password, at
// start, and the same password again change nothing.
func TestRotationHoldsLearnedRoutes(t *testing.T) {
	routes := fake.NewRoutes()
	b := newTestBGPOwner(t, newFakeSpeaker(), routes)
	route := bgp.LearnedRoute{Prefix: netip.MustParsePrefix("10.244.1.0/26"), NextHops: []netip.Addr{netip.MustParseAddr("198.18.0.12")}}
	b.holdLearnedOnRotation(peerWithPassword("key-1"))
	b.converged = true
	b.learned = []bgp.LearnedRoute{route}
	if _, err := b.syncLearned(); err != nil {
		t.Fatal(err)
	}
	b.holdLearnedOnRotation(peerWithPassword("key-1"))
	if !b.isConverged() {
		t.Fatal("the same password again started convergence over")
	}

	b.holdLearnedOnRotation(peerWithPassword("key-2"))
	if b.isConverged() {
		t.Fatal("a new password did not start convergence over")
	}
	b.learned = nil // the re-created session's paths are gone
	if _, err := b.syncLearned(); err != nil {
		t.Fatal(err)
	}
	if got := routes.String(); !strings.Contains(got, "10.244.1.0/26") {
		t.Errorf("during the rotation the learned route went:\n%s", got)
	}
	b.converged = true // converged again: what is not learned goes
	if _, err := b.syncLearned(); err != nil {
		t.Fatal(err)
	}
	if got := routes.String(); strings.Contains(got, "10.244.1.0/26") {
		t.Errorf("after converging again the withdrawn route stayed:\n%s", got)
	}
}

// peerWithPassword is one cluster peer with password pw.
func peerWithPassword(pw string) []bgp.Peer {
	return []bgp.Peer{{Address: netip.MustParseAddr("198.18.0.12"), Type: bgp.PeerMesh, Password: pw}}
}

// The view losing the mesh key (deleted, or rewritten so that it does not
// decode) does not turn the cluster sessions unauthenticated: the last key
// stays; a new one replaces it.
func TestMeshKeyKeptWhenLost(t *testing.T) {
	ctx := context.Background()
	store := storetest.New(t)
	if _, err := store.SetBGPMeshKey(ctx, "key-1"); err != nil {
		t.Fatal(err)
	}
	view := startView(t, store)
	b := newBGPOwner("node1", netip.MustParsePrefix("198.18.0.11/24"), view, nil, newFakeSpeaker(), nil, time.Second, newMetrics(), testLogger())
	if got := b.meshKey(); got != "key-1" {
		t.Fatalf("mesh key %q, want key-1", got)
	}
	if err := store.DeleteKV(ctx, datastore.BGPMeshKeyKey, 0); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the deletion in the view", testkit.Cond(func() bool { return view.BGPMeshKey() == "" }))
	if got := b.meshKey(); got != "key-1" {
		t.Errorf("after the key was deleted: %q, want the last key, key-1", got)
	}
	if _, err := store.SetBGPMeshKey(ctx, "key-2"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the new key", testkit.Cond(func() bool { return b.meshKey() == "key-2" }))
}
