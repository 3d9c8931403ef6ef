package dataplane_test

import (
	"context"
	"testing"
	"time"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
)

func TestPrivilegedWatchLinks(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	ns := testkit.NewNetNS(t, "tbhep-links")
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := dataplane.WatchLinks(ctx, ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	run(t, "ip", "-n", ns.Name, "link", "add", "hep7", "type", "veth", "peer", "name", "hep7p")
	seen := map[string]bool{}
	deadline := time.After(10 * time.Second)
	for !seen["hep7"] {
		select {
		case n, ok := <-ch:
			if !ok {
				t.Fatal("watch ended")
			}
			seen[n] = true
		case <-deadline:
			t.Fatalf("no update for hep7; saw %v", seen)
		}
	}
	cancel()
	for range ch { // closes once ctx ended
	}
}
