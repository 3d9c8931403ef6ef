package dataplane_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
)

// TestPrivilegedWatchSetElements: the watch reports the addresses the
// agent adds to and deletes from a set, also after the chain whose rule
// refers to the set was flushed (after which `nft monitor` prints none),
// and nothing for verdict-map or port elements.
func TestPrivilegedWatchSetElements(t *testing.T) {
	testkit.RequirePrivileged(t, "ip", "nft")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := testkit.NewNetNS(t, "tbdp-nftwatch")
	f := newNFT(t, ns, -1)
	if _, err := f.Apply(ctx, testState("10.244.1.7/32", false)); err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	events, err := dataplane.WatchSetElements(wctx, ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	run(t, "nsenter", "--net="+ns.Path, "--", "nft", "flush", "chain", "inet", dataplane.NFTTable, "tabby-fw-calia")
	// The repair rewrites the chain (new anonymous port set: no address),
	// then the member changes.
	if _, err := f.Apply(ctx, testState("10.244.1.7/32", false)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Apply(ctx, testState("10.244.1.8/32", false)); err != nil {
		t.Fatal(err)
	}
	// A verdict map's key is an interface name of 16 bytes, an IPv6
	// address's length: it must give no address.
	run(t, "nsenter", "--net="+ns.Path, "--", "nft", "add", "element", "inet", dataplane.NFTTable, "tabby-from-wl-map", `{ "calib" : goto tabby-fw-calia }`)
	// A last change marks the end: everything before it has come.
	run(t, "nsenter", "--net="+ns.Path, "--", "nft", "add", "element", "inet", dataplane.NFTTable, "tabby-s-peers", "{ 10.244.9.9 }")
	var got []string
	for ev := range events {
		if ev.Err != nil {
			t.Fatalf("watch error: %v", ev.Err)
		}
		verb := "delete"
		if ev.Add {
			verb = "add"
		}
		for _, a := range ev.Addrs {
			got = append(got, verb+" "+a.String())
		}
		if slices.Contains(got, "add 10.244.9.9") {
			break
		}
	}
	stop()
	if want := []string{"delete 10.244.1.7", "add 10.244.1.8", "add 10.244.9.9"}; !slices.Equal(got, want) {
		t.Errorf("element events %v, want %v", got, want)
	}
	for range events { // closes once stopped
	}
}
