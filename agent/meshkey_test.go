package agent

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/dataplane/fake"
)

// A mesh key rotation holds the learned routes: after the password
// changes, a peer's routes withdrawn (GoBGP re-creates the neighbour) stay
// in the kernel until BGP has converged again; the first password, at
// start, and the same password again change nothing.
func TestRotationHoldsLearnedRoutes(t *testing.T) {
	routes := fake.NewRoutes()
	b := newTestBGPOwner(t, newFakeSpeaker(), routes)
	route := bgp.LearnedRoute{Prefix: netip.MustParsePrefix("10.244.1.0/26"), NextHops: []netip.Addr{netip.MustParseAddr("198.18.0.12")}}
	b.holdLearnedOnRotation("key-1")
	b.converged = true
	b.learned = []bgp.LearnedRoute{route}
	if _, err := b.syncLearned(); err != nil {
		t.Fatal(err)
	}
	b.holdLearnedOnRotation("key-1")
	if !b.isConverged() {
		t.Fatal("the same password again started convergence over")
	}

	b.holdLearnedOnRotation("key-2")
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
