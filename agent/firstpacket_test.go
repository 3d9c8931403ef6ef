package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/tabbynet/tabby/agent/attach"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
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
	e.h.advert = attach.AdvertFunc(b.waitAdvertised)

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
	blk, err := e.alloc.EnsureBlock(ctx, "node1")
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

// A dual-stack ADD on a node with an IPv6 address returns once BGP
// advertises both new blocks; on a node without one it does not wait for
// the IPv6 block, which BGP does not carry there (and is not passed to the
// speaker).
func TestCNIAddDualStackWaitsForBothRoutes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		nodeAddr6 netip.Prefix
	}{{"node with IPv6", netip.MustParsePrefix("2001:db8::11/64")}, {"node without IPv6", netip.Prefix{}}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			e := newHandlerEnv(t)
			mustCreate(t, e.store, &api.IPPool{Metadata: api.ObjectMeta{Name: "v6"}, Spec: api.IPPoolSpec{CIDR: "fd00:10:244::/64"}})
			sp := newFakeSpeaker()
			b := newBGPOwner("node1", netip.MustParsePrefix("198.18.0.11/24"), e.view, nil, sp, nil, time.Second, newMetrics(), testLogger())
			b.nodeAddr6 = tc.nodeAddr6
			done := make(chan struct{})
			go func() { defer close(done); b.loop(time.Minute).run(ctx) }()
			defer func() { cancel(); <-done }()
			e.h.advert = attach.AdvertFunc(b.waitAdvertised)

			req, conf, args := addReq("ds")
			conf.AssignIPv6 = flex(true)
			res, err := e.h.Add(ctx, req, conf, args)
			if err != nil {
				t.Fatal(err)
			}
			_, adv := sp.snapshot()
			for _, ipc := range res.IPs {
				ip, _ := netip.AddrFromSlice(ipc.Address.IP)
				ip = ip.Unmap()
				covered := slices.ContainsFunc(adv, func(p netip.Prefix) bool { return p.Contains(ip) })
				if want := ip.Is4() || tc.nodeAddr6.IsValid(); covered != want {
					t.Errorf("%s: advertised %v when ADD returned; covered = %v, want %v", ip, adv, covered, want)
				}
			}
		})
	}
}

// Learned routes of both families become kernel routes, each with next
// hops of its own family; routes via the node itself are dropped.
func TestDesiredLearnedRoutesIPv6(t *testing.T) {
	self := []netip.Addr{netip.MustParseAddr("198.18.0.11"), netip.MustParseAddr("2001:db8::11")}
	got := desiredLearnedRoutes(self, []bgp.LearnedRoute{
		{Prefix: netip.MustParsePrefix("10.244.1.0/26"), NextHops: []netip.Addr{netip.MustParseAddr("198.18.0.12")}},
		{Prefix: netip.MustParsePrefix("fd00:10:244::40/122"), NextHops: []netip.Addr{netip.MustParseAddr("2001:db8::12"), netip.MustParseAddr("2001:db8::13")}},
		{Prefix: netip.MustParsePrefix("fd00:10:244::80/122"), NextHops: []netip.Addr{netip.MustParseAddr("198.18.0.13")}},  // wrong family
		{Prefix: netip.MustParsePrefix("fd00:10:244::c0/122"), NextHops: []netip.Addr{netip.MustParseAddr("2001:db8::11")}}, // ourselves
	})
	var lines []string
	for _, r := range got {
		lines = append(lines, fmt.Sprintf("%s via %v proto %d", r.Dst, r.Gateways, r.Proto))
	}
	want := []string{
		"10.244.1.0/26 via [198.18.0.12] proto 81",
		"fd00:10:244::40/122 via [2001:db8::12 2001:db8::13] proto 81",
	}
	if !slices.Equal(lines, want) {
		t.Errorf("got %q, want %q", lines, want)
	}
}
