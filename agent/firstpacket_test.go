package agent

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// ADD of a pod whose address opened a new block returns only once BGP
// advertises that block (and a pod with a borrowed address, once its /32
// is): other nodes can route the pod's replies when its first packet goes.
func TestCNIAddWaitsForItsRouteToBeAdvertised(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := newHandlerEnv(t)
	sp := newFakeSpeaker()
	b := newBGPOwner("node1", netip.MustParsePrefix("198.18.0.11/24"), e.view, nil, sp, nil, time.Second, newMetrics(), testLogger())
	done := make(chan struct{})
	go func() { defer close(done); b.loop(time.Minute).run(ctx) }()
	defer func() { cancel(); <-done }()
	e.h.advertised = b.waitAdvertised

	for i, id := range []string{"first", "second"} {
		req, conf, args := addReq(id)
		res, err := e.h.Add(ctx, req, conf, args)
		if err != nil {
			t.Fatal(err)
		}
		ip, _ := netip.AddrFromSlice(res.IPs[0].Address.IP)
		_, adv := sp.snapshot()
		if !slices.ContainsFunc(adv, func(p netip.Prefix) bool { return p.Contains(ip.Unmap()) }) {
			t.Errorf("pod %d: ADD returned before a route to %s was advertised (advertised: %v)", i+1, ip, adv)
		}
	}
}

// The node claims its first block at start, before any pod.
func TestEnsureBlockBeforeFirstPod(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t)
	blk, err := e.h.ipam.EnsureBlock(ctx, "node1")
	if err != nil || !blk.IsValid() {
		t.Fatalf("EnsureBlock = %v, %v", blk, err)
	}
	req, conf, args := addReq("c1")
	res, err := e.h.Add(ctx, req, conf, args)
	if err != nil {
		t.Fatal(err)
	}
	ip, _ := netip.AddrFromSlice(res.IPs[0].Address.IP)
	if !blk.Contains(ip.Unmap()) {
		t.Errorf("first pod got %s outside the block %s claimed at start", ip, blk)
	}
}
