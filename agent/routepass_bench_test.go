package agent

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/internal/testkit"
)

// passLearned is how many learned routes the route pass benchmarks hold.
const passLearned = 10_000

// benchPodDev is the host interface every benchmark pod's route uses (the
// privileged variant makes it a dummy link).
const benchPodDev = "cali0000000000a"

// BenchmarkRoutePass10kLearned measures one pass of the node's route
// owners (the workload routes pass and the learned routes sync) over the
// fake kernel holding 10,000 learned routes and 50 pod routes: "steady"
// with nothing changed, "workload-pass" the routes owner's pass alone (what
// every local pod change costs), "one-changed" after one learned route
// changed its next hop, and (after issue 24) "full-resync", a pass that
// diffs against the whole kernel, as every resync interval. See
// BENCHMARKS.md.
func BenchmarkRoutePass10kLearned(b *testing.B) {
	benchRoutePass(b, fake.NewRoutes(
		dataplane.Route{Dst: netip.MustParsePrefix("198.18.0.0/24"), Dev: "eth0", Proto: 2},
		dataplane.Route{Dst: netip.MustParsePrefix("0.0.0.0/0"), Gateways: []netip.Addr{netip.MustParseAddr("198.18.0.1")}, Proto: 4},
	))
}

// BenchmarkPrivilegedRoutePass10kLearned is BenchmarkRoutePass10kLearned
// over the real kernel, in a namespace of its own.
func BenchmarkPrivilegedRoutePass10kLearned(b *testing.B) {
	testkit.RequirePrivileged(b, "ip")
	n := testkit.NewNetNS(b, "tbrp")
	name, path := n.Name, n.Path
	run(b, "ip", "-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1") // both ends stay here
	run(b, "ip", "-n", name, "link", "set", "eth1", "up")
	run(b, "ip", "-n", name, "addr", "add", "198.18.0.11/24", "dev", "eth0")
	run(b, "ip", "-n", name, "link", "set", "eth0", "up")
	run(b, "ip", "-n", name, "route", "add", "default", "via", "198.18.0.1", "proto", "static")
	run(b, "ip", "-n", name, "link", "add", benchPodDev, "type", "veth", "peer", "name", "calipeer0")
	run(b, "ip", "-n", name, "link", "set", "calipeer0", "up")
	run(b, "ip", "-n", name, "link", "set", benchPodDev, "up")
	kernel, err := dataplane.NewRoutes(path)
	if err != nil {
		b.Fatal(err)
	}
	defer kernel.Close()
	benchRoutePass(b, kernel)
}

func benchRoutePass(b *testing.B, kernel dataplane.Routes) {
	ctx := context.Background()
	ro, bo, resync := newPassOwners(b, kernel)
	for i := range 50 {
		a := netip.AddrFrom4([4]byte{10, 244, 200, byte(i + 1)})
		rt := dataplane.Route{Dst: netip.PrefixFrom(a, 32), Type: dataplane.RouteUnicast, Dev: benchPodDev, Proto: dataplane.RouteProtoWorkload}
		if err := ro.Wire(fmt.Sprintf("calibench%06d", i), []dataplane.Route{rt}); err != nil {
			b.Fatal(err)
		}
	}
	learned := make([]bgp.LearnedRoute, passLearned)
	for i := range learned {
		learned[i] = bgp.LearnedRoute{
			Prefix:   netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i / 64), byte(i % 64 * 4)}), 30),
			NextHops: []netip.Addr{netip.AddrFrom4([4]byte{198, 18, 0, byte(12 + i%8)})},
		}
	}
	bo.learned = learned
	pass := func() {
		if err := ro.pass(ctx); err != nil {
			b.Fatal(err)
		}
		if _, err := bo.syncLearned(); err != nil {
			b.Fatal(err)
		}
	}
	pass()
	if rs, err := kernel.List(dataplane.RouteProtoBGP); err != nil || len(rs) != passLearned {
		b.Fatalf("%d learned routes in the kernel (%v), want %d", len(rs), err, passLearned)
	}
	b.Run("steady", func(b *testing.B) {
		for b.Loop() {
			pass()
		}
	})
	b.Run("workload-pass", func(b *testing.B) {
		for b.Loop() {
			if err := ro.pass(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("one-changed", func(b *testing.B) {
		i := 0
		for b.Loop() {
			bo.mu.Lock()
			l := &bo.learned[i%passLearned]
			l.NextHops = []netip.Addr{netip.AddrFrom4([4]byte{198, 18, 0, byte(12 + (i/passLearned+i+1)%8)})}
			bo.mu.Unlock()
			i++
			pass()
		}
	})
	if resync != nil {
		b.Run("full-resync", func(b *testing.B) {
			for b.Loop() {
				resync()
				pass()
			}
		})
	}
}
