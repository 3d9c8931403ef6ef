package agent

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/internal/testkit"
)

// A mesh key rotation holds the learned routes: after the password
// changes, a peer's routes withdrawn (GoBGP re-creates the neighbour) stay
// in the kernel until BGP has converged again; the first password, at
// start, and the same password again change nothing. The hold starts when
// the change is seen, the new password reaches the speaker rotationDelay
// later (so that every agent holds before any session is re-created).
func TestRotationHoldsLearnedRoutes(t *testing.T) {
	routes := fake.NewRoutes()
	b := newTestBGPOwner(t, newFakeSpeaker(), routes)
	route := bgp.LearnedRoute{Prefix: netip.MustParsePrefix("10.244.1.0/26"), NextHops: []netip.Addr{netip.MustParseAddr("198.18.0.12")}}
	t0 := time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)
	rotate := func(pw string, at time.Duration, wantPassword string, wantWait time.Duration) {
		t.Helper()
		apply, wait := b.holdLearnedOnRotation(peerWithPassword(pw), t0.Add(at))
		if got := apply[0].Password; got != wantPassword || wait != wantWait {
			t.Fatalf("at %v with %s: the speaker gets %s, wait %v; want %s, %v", at, pw, got, wait, wantPassword, wantWait)
		}
	}
	rotate("key-1", 0, "key-1", 0)
	b.converged = true
	b.learned = []bgp.LearnedRoute{route}
	if _, err := b.syncLearned(); err != nil {
		t.Fatal(err)
	}
	rotate("key-1", time.Second, "key-1", 0)
	if !b.isConverged() {
		t.Fatal("the same password again started convergence over")
	}

	rotate("key-2", 10*time.Second, "key-1", rotationDelay)
	if b.isConverged() {
		t.Fatal("a new password did not start convergence over")
	}
	rotate("key-2", 10*time.Second+rotationDelay/2, "key-1", rotationDelay/2)
	rotate("key-2", 10*time.Second+rotationDelay, "key-2", 0)
	rotate("key-2", 11*time.Second+rotationDelay, "key-2", 0)
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

// The BGP owner asks for room for its signed peers' TCP-MD5 keys before
// setting them, again only when their count grows, and again after a
// failure.
func TestEnsureMD5Room(t *testing.T) {
	var asked []int
	fail := false
	b := &bgpOwner{log: testLogger(), md5Room: func(keys int) error {
		asked = append(asked, keys)
		if fail {
			return errors.New("read-only /proc/sys")
		}
		return nil
	}}
	peers := func(signed, plain int) []bgp.Peer {
		var out []bgp.Peer
		for i := range signed + plain {
			p := bgp.Peer{Address: netip.AddrFrom4([4]byte{198, 18, 4, byte(i + 1)}), Type: bgp.PeerMesh}
			if i < signed {
				p.Password = "key"
			}
			out = append(out, p)
		}
		return out
	}
	b.ensureMD5Room(peers(0, 3)) // nothing signed: nothing to ask
	b.ensureMD5Room(peers(2, 1))
	b.ensureMD5Room(peers(2, 5)) // no more keys
	b.ensureMD5Room(peers(1, 0)) // fewer: the room stays
	fail = true
	b.ensureMD5Room(peers(4, 0))
	fail = false
	b.ensureMD5Room(peers(4, 0)) // the failure is retried
	b.ensureMD5Room(peers(4, 0))
	if diff := cmp.Diff([]int{2, 4, 4}, asked); diff != "" {
		t.Errorf("room asked for (-want +got):\n%s", diff)
	}
}
