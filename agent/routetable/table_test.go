package routetable

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/dataplane/fake"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func wl(dst, dev string) dataplane.Route {
	return dataplane.Route{Dst: pfx(dst), Type: dataplane.RouteUnicast, Dev: dev, Proto: dataplane.RouteProtoWorkload}
}

func bh(dst string) dataplane.Route {
	return dataplane.Route{Dst: pfx(dst), Type: dataplane.RouteBlackhole, Proto: dataplane.RouteProtoWorkload}
}

func learned(dst string, gws ...string) dataplane.Route {
	rt := dataplane.Route{Dst: pfx(dst), Type: dataplane.RouteUnicast, Proto: dataplane.RouteProtoBGP}
	for _, g := range gws {
		rt.Gateways = append(rt.Gateways, netip.MustParseAddr(g))
	}
	return rt
}

// nodeRoutes are the node's own routes of both families: connected subnets
// (protocol kernel, 2) and static routes (protocol 4).
func nodeRoutes() []dataplane.Route {
	return []dataplane.Route{
		{Dst: pfx("198.18.0.0/24"), Dev: "eth0", Proto: 2},
		{Dst: pfx("fd00:198:18::/64"), Dev: "eth0", Proto: 2},
		{Dst: pfx("10.96.0.0/12"), Gateways: []netip.Addr{netip.MustParseAddr("198.18.0.1")}, Proto: 4},
		{Dst: pfx("fd00:96::/108"), Gateways: []netip.Addr{netip.MustParseAddr("fd00:198:18::1")}, Proto: 4},
	}
}

var nodeLines = []string{
	"10.96.0.0/12 via 198.18.0.1 proto 4",
	"198.18.0.0/24 dev eth0 scope link proto 2",
	"fd00:96::/108 via fd00:198:18::1 proto 4",
	"fd00:198:18::/64 dev eth0 scope link proto 2",
}

// remoteSet is what BGP learned in every step: other nodes' blocks, an
// address now (or once) of a local pod, local blocks and pool aggregates,
// and every node route, in both families.
var remoteSet = []dataplane.Route{
	learned("10.244.1.0/26", "198.18.0.12"),
	learned("fd00:10:244:1::/122", "fd00:198:18::12"),
	learned("10.244.0.5/32", "198.18.0.12"),
	learned("fd00:10:244::5/128", "fd00:198:18::12"),
	learned("10.244.0.0/26", "198.18.0.13"),
	learned("fd00:10:244::/122", "fd00:198:18::13"),
	learned("10.244.0.0/16", "198.18.0.13", "198.18.0.12"),
	learned("198.18.0.0/24", "198.18.0.12"),
	learned("fd00:198:18::/64", "fd00:198:18::12"),
	learned("10.96.0.0/12", "198.18.0.12"),
	learned("fd00:96::/108", "fd00:198:18::12"),
}

// stateStep is one desired state of every class and the `ip route` lines
// the kernel must then show, whatever state came before.
type stateStep struct {
	name    string
	classes map[Class][]dataplane.Route
	want    []string
}

var stateSteps = []stateStep{
	{name: "nothing", want: nodeLines},
	{
		name:    "learned only",
		classes: map[Class][]dataplane.Route{Learned: remoteSet},
		want: append([]string{
			"10.244.0.0/16 proto 81 nexthop via 198.18.0.12 nexthop via 198.18.0.13",
			"10.244.0.0/26 via 198.18.0.13 proto 81",
			"10.244.0.5/32 via 198.18.0.12 proto 81",
			"10.244.1.0/26 via 198.18.0.12 proto 81",
			"fd00:10:244::/122 via fd00:198:18::13 proto 81",
			"fd00:10:244::5/128 via fd00:198:18::12 proto 81",
			"fd00:10:244:1::/122 via fd00:198:18::12 proto 81",
		}, nodeLines...),
	},
	{
		name: "local pod and blocks",
		classes: map[Class][]dataplane.Route{
			Learned:   remoteSet,
			Workload:  {wl("10.244.0.5/32", "cali0000000000a"), wl("fd00:10:244::5/128", "cali0000000000a")},
			Blackhole: {bh("10.244.0.0/26"), bh("fd00:10:244::/122")},
		},
		want: append([]string{
			"10.244.0.0/16 proto 81 nexthop via 198.18.0.12 nexthop via 198.18.0.13",
			"blackhole 10.244.0.0/26 proto 80",
			"10.244.0.5/32 dev cali0000000000a scope link proto 80",
			"10.244.1.0/26 via 198.18.0.12 proto 81",
			"blackhole fd00:10:244::/122 proto 80",
			"fd00:10:244::5/128 dev cali0000000000a scope link proto 80",
			"fd00:10:244:1::/122 via fd00:198:18::12 proto 81",
		}, nodeLines...),
	},
	{
		name: "aggregate, no learned",
		classes: map[Class][]dataplane.Route{
			Aggregate: {bh("10.244.0.0/16")},
			Blackhole: {bh("10.244.0.0/26")},
		},
		want: append([]string{
			"blackhole 10.244.0.0/16 proto 80",
			"blackhole 10.244.0.0/26 proto 80",
		}, nodeLines...),
	},
	{
		name: "everything",
		classes: map[Class][]dataplane.Route{
			Learned:   remoteSet,
			Workload:  {wl("10.244.0.5/32", "cali0000000000a"), wl("fd00:10:244::5/128", "cali0000000000b")},
			Blackhole: {bh("10.244.0.0/26"), bh("fd00:10:244::/122")},
			Aggregate: {bh("10.244.0.0/16")},
		},
		want: append([]string{
			"blackhole 10.244.0.0/16 proto 80",
			"blackhole 10.244.0.0/26 proto 80",
			"10.244.0.5/32 dev cali0000000000a scope link proto 80",
			"10.244.1.0/26 via 198.18.0.12 proto 81",
			"blackhole fd00:10:244::/122 proto 80",
			"fd00:10:244::5/128 dev cali0000000000b scope link proto 80",
			"fd00:10:244:1::/122 via fd00:198:18::12 proto 81",
		}, nodeLines...),
	},
}

// wantSorted is want in the fake's order: by destination.
func (s stateStep) wantSorted() []string {
	return sortByDst(append([]string(nil), s.want...))
}

func sortByDst(lines []string) []string {
	dst := func(l string) netip.Prefix {
		f := strings.Fields(l)
		if f[0] == "blackhole" {
			f = f[1:]
		}
		return pfx(f[0])
	}
	for i := 1; i < len(lines); i++ {
		for j := i; j > 0 && dst(lines[j]).Compare(dst(lines[j-1])) < 0; j-- {
			lines[j], lines[j-1] = lines[j-1], lines[j]
		}
	}
	return lines
}

// TestTableStates replays the steps in order and then in shuffled orders,
// handing each step's classes over in a shuffled order with an Apply (and
// now and then a full resync) after each: whatever came before, the kernel
// ends with the step's winners, never a learned route over a local or a
// node route, and a second Apply changes nothing.
func TestTableStates(t *testing.T) {
	orders := [][]int{{0, 1, 2, 3, 4, 0}, {4, 3, 2, 1, 0}}
	for seed := uint64(1); seed <= 20; seed++ {
		r := rand.New(rand.NewPCG(seed, 24))
		var o []int
		for range 8 {
			o = append(o, r.IntN(len(stateSteps)))
		}
		orders = append(orders, o)
	}
	for i, order := range orders {
		r := rand.New(rand.NewPCG(uint64(i), 42))
		kernel := fake.NewRoutes(nodeRoutes()...)
		table := New(kernel, time.Hour)
		for _, si := range order {
			st := stateSteps[si]
			classes := []Class{Learned, Aggregate, Blackhole, Workload}
			r.Shuffle(len(classes), func(a, b int) { classes[a], classes[b] = classes[b], classes[a] })
			for _, c := range classes {
				if err := table.SetClass(c, st.classes[c]); err != nil {
					t.Fatalf("order %v, step %q: SetClass(%v): %v", order, st.name, c, err)
				}
				if r.IntN(4) == 0 {
					table.Resync()
				}
				if err := table.Apply(); err != nil {
					t.Fatalf("order %v, step %q: Apply after %v: %v", order, st.name, c, err)
				}
			}
			if diff := cmp.Diff(st.wantSorted(), kernel.Lines()); diff != "" {
				t.Fatalf("order %v, step %q: kernel (-want +got):\n%s", order, st.name, diff)
			}
			kernel.ResetOps()
			table.Resync()
			if err := table.Apply(); err != nil {
				t.Fatal(err)
			}
			if ops := kernel.Ops(); len(ops) > 0 {
				t.Fatalf("order %v, step %q: a second Apply changed %v", order, st.name, ops)
			}
		}
	}
}

// A restarted agent finds an earlier run's routes: orphans of the local
// classes go at once, learned ones stay while learned deletes are held and
// go when the hold is lifted; what is desired is installed meanwhile.
func TestHoldDeletes(t *testing.T) {
	kernel := fake.NewRoutes(append(nodeRoutes(),
		learned("10.244.9.0/26", "198.18.0.19"),
		learned("10.244.1.0/26", "198.18.0.19"),
		bh("10.244.7.0/26"),
	)...)
	table := New(kernel, time.Hour)
	table.HoldDeletes(Learned, true)
	if err := table.SetClass(Learned, []dataplane.Route{learned("10.244.1.0/26", "198.18.0.12")}); err != nil {
		t.Fatal(err)
	}
	if err := table.Apply(); err != nil {
		t.Fatal(err)
	}
	want := sortByDst(append([]string{
		"10.244.1.0/26 via 198.18.0.12 proto 81",
		"10.244.9.0/26 via 198.18.0.19 proto 81",
	}, nodeLines...))
	if diff := cmp.Diff(want, kernel.Lines()); diff != "" {
		t.Errorf("while held (-want +got):\n%s", diff)
	}
	table.HoldDeletes(Learned, false)
	if err := table.Apply(); err != nil {
		t.Fatal(err)
	}
	want = sortByDst(append([]string{"10.244.1.0/26 via 198.18.0.12 proto 81"}, nodeLines...))
	if diff := cmp.Diff(want, kernel.Lines()); diff != "" {
		t.Errorf("after the hold (-want +got):\n%s", diff)
	}
}

// Between full syncs Apply reads nothing from the kernel and touches only
// what changed; a full sync (Resync, or the interval passing) repairs what
// changed behind the table's back.
func TestIncrementalBetweenResyncs(t *testing.T) {
	kernel := fake.NewRoutes(nodeRoutes()...)
	table := New(kernel, time.Minute)
	now := time.Unix(1000, 0)
	table.now = func() time.Time { return now }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(table.SetClass(Blackhole, []dataplane.Route{bh("10.244.0.0/26"), bh("10.244.0.64/26")}))
	must(table.Apply())
	kernel.SetFail("List", fake.ErrInjected)
	kernel.SetFail("NodeRoutes", fake.ErrInjected)
	kernel.ResetOps()
	must(table.SetClass(Blackhole, []dataplane.Route{bh("10.244.0.0/26"), bh("10.244.0.128/26")}))
	must(table.Apply())
	if diff := cmp.Diff([]string{"replace blackhole 10.244.0.128/26 proto 80", "delete blackhole 10.244.0.64/26 proto 80"}, kernel.Ops()); diff != "" {
		t.Errorf("incremental ops (-want +got):\n%s", diff)
	}
	// Behind the table's back: its route deleted, an orphan added.
	must(kernel.Delete(bh("10.244.0.0/26")))
	kernel.Add(bh("10.244.5.0/26"))
	must(table.Apply())
	now = now.Add(time.Minute)
	if err := table.Apply(); !errors.Is(err, fake.ErrInjected) {
		t.Fatalf("Apply at the resync interval = %v, want the injected List failure", err)
	}
	kernel.SetFail("List", nil)
	kernel.SetFail("NodeRoutes", nil)
	must(table.Apply())
	want := sortByDst(append([]string{"blackhole 10.244.0.0/26 proto 80", "blackhole 10.244.0.128/26 proto 80"}, nodeLines...))
	if diff := cmp.Diff(want, kernel.Lines()); diff != "" {
		t.Errorf("after the resync (-want +got):\n%s", diff)
	}
	if got := table.Stats().FullSyncs; got != 2 {
		t.Errorf("FullSyncs = %d, want 2", got)
	}
}

// A failed route is reported to its class's owner only, the others are
// applied, and the next Apply retries it.
func TestApplyKeepsGoingAndRetries(t *testing.T) {
	kernel := fake.NewRoutes()
	table := New(kernel, time.Hour)
	kernel.SetFail("Replace 10.244.1.0/26", fake.ErrInjected)
	kernel.SetFail("Replace 10.244.0.9/32", fake.ErrInjected)
	if err := table.SetClass(Learned, []dataplane.Route{learned("10.244.1.0/26", "198.18.0.12"), learned("10.244.2.0/26", "198.18.0.12")}); err != nil {
		t.Fatal(err)
	}
	if err := table.SetClass(Workload, []dataplane.Route{wl("10.244.0.9/32", "cali1")}); err != nil {
		t.Fatal(err)
	}
	err := table.Apply(Learned)
	if !errors.Is(err, fake.ErrInjected) || !strings.Contains(err.Error(), "10.244.1.0/26") || strings.Contains(err.Error(), "10.244.0.9") {
		t.Fatalf("Apply(Learned) = %v, want only the learned route's failure", err)
	}
	kernel.SetFail("Replace 10.244.1.0/26", nil)
	kernel.SetFail("Replace 10.244.0.9/32", nil)
	if err := table.Apply(Workload); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"10.244.0.9/32 dev cali1 scope link proto 80",
		"10.244.1.0/26 via 198.18.0.12 proto 81",
		"10.244.2.0/26 via 198.18.0.12 proto 81",
	}
	if diff := cmp.Diff(want, kernel.Lines()); diff != "" {
		t.Errorf("after the retry (-want +got):\n%s", diff)
	}
}

// Flush installs a destination's winner even when the table believes the
// kernel has it (the workload's link was recreated and lost its routes),
// and nothing else.
func TestFlush(t *testing.T) {
	kernel := fake.NewRoutes()
	table := New(kernel, time.Hour)
	if err := table.SetClass(Workload, []dataplane.Route{wl("10.244.0.9/32", "cali1")}); err != nil {
		t.Fatal(err)
	}
	if err := table.Apply(); err != nil {
		t.Fatal(err)
	}
	if err := kernel.Delete(wl("10.244.0.9/32", "cali1")); err != nil {
		t.Fatal(err)
	}
	if err := table.SetClass(Learned, []dataplane.Route{learned("10.244.1.0/26", "198.18.0.12")}); err != nil {
		t.Fatal(err)
	}
	if err := table.Flush([]netip.Prefix{pfx("10.244.0.9/32")}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"10.244.0.9/32 dev cali1 scope link proto 80"}, kernel.Lines()); diff != "" {
		t.Errorf("after Flush (-want +got):\n%s", diff)
	}
}

// A node route that appears after the last full sync, where a learned
// route is to go, keeps its place without an error; a local route there is
// an error (it is not the table's to replace).
func TestNodeRouteAppearsBetweenResyncs(t *testing.T) {
	kernel := fake.NewRoutes()
	table := New(kernel, time.Hour)
	if err := table.Apply(); err != nil {
		t.Fatal(err)
	}
	kernel.Add(dataplane.Route{Dst: pfx("fd00:10:244:1::/122"), Dev: "eth0", Proto: 2})
	kernel.Add(dataplane.Route{Dst: pfx("10.244.0.0/26"), Dev: "eth0", Proto: 2})
	if err := table.SetClass(Learned, []dataplane.Route{learned("fd00:10:244:1::/122", "fd00:198:18::12")}); err != nil {
		t.Fatal(err)
	}
	if err := table.Apply(); err != nil {
		t.Errorf("a learned route meeting a new node route: %v", err)
	}
	if got := table.NodeRoutes(); !slices.Equal(got, []netip.Prefix{pfx("fd00:10:244:1::/122")}) {
		t.Errorf("NodeRoutes = %v, want the one found in the way", got)
	}
	if err := table.SetClass(Blackhole, []dataplane.Route{bh("10.244.0.0/26")}); err != nil {
		t.Fatal(err)
	}
	if err := table.Apply(); !errors.Is(err, dataplane.ErrForeignRoute) {
		t.Errorf("a blackhole over a node route: %v, want ErrForeignRoute", err)
	}
}

func TestSetClassRejects(t *testing.T) {
	table := New(fake.NewRoutes(), 0)
	err := table.SetClass(Workload, []dataplane.Route{
		learned("10.244.1.0/26", "198.18.0.12"),
		wl("10.244.0.1/32", "cali1"),
		wl("10.244.0.1/32", "cali2"),
		{Dst: pfx("10.244.0.2/32"), Type: dataplane.RouteUnicast},
	})
	for _, want := range []string{"protocol is not 80", "share a destination", "needs a device or a gateway"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("SetClass error %v does not mention %q", err, want)
		}
	}
	if got := table.Winners(); len(got) != 1 || got[0].Dev != "cali1" {
		t.Errorf("Winners = %v, want the first route for 10.244.0.1/32 only", got)
	}
	if err := table.SetClass(Class(0), nil); err == nil {
		t.Error("SetClass of no class succeeded")
	}
}

// While a learned route is kept off a node route, RefreshNodeRoutes
// re-reads the node's routes, and the learned route takes the destination
// once the node route is gone; with nothing kept off, it reads nothing.
func TestRefreshNodeRoutes(t *testing.T) {
	kernel := fake.NewRoutes(dataplane.Route{Dst: pfx("::/0"), Gateways: []netip.Addr{netip.MustParseAddr("fd00:198:18::1")}, Proto: 3})
	table := New(kernel, time.Hour)
	if err := table.SetClass(Learned, []dataplane.Route{learned("::/0", "fd00:198:18::12")}); err != nil {
		t.Fatal(err)
	}
	if err := table.Apply(); err != nil {
		t.Fatal(err)
	}
	if got := table.Suppressed(); !slices.Equal(got, []netip.Prefix{pfx("::/0")}) {
		t.Errorf("Suppressed = %v, want ::/0", got)
	}
	if changed, err := table.RefreshNodeRoutes(); changed || err != nil {
		t.Errorf("RefreshNodeRoutes with the node route in place = %v, %v", changed, err)
	}
	kernel.Remove(pfx("::/0"))
	if changed, err := table.RefreshNodeRoutes(); !changed || err != nil {
		t.Errorf("RefreshNodeRoutes after the node route went = %v, %v; want a change", changed, err)
	}
	if err := table.Apply(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"default via fd00:198:18::12 proto 81"}, kernel.Lines()); diff != "" {
		t.Errorf("kernel (-want +got):\n%s", diff)
	}
	kernel.SetFail("NodeRoutes", fake.ErrInjected)
	if changed, err := table.RefreshNodeRoutes(); changed || err != nil {
		t.Errorf("RefreshNodeRoutes with nothing kept off = %v, %v; want no read", changed, err)
	}
}

// A restarted agent's table finds the earlier run's routes, and its owners
// make their first passes in any order: BGP (learned and Service classes)
// may apply before the route owner has handed over the local classes. No
// route an owner still to pass will want again is deleted meanwhile (a
// pod's host route deleted and re-added a pass later loses the packets in
// flight to the pod); an orphan of the local classes (a block released
// while the agent was away) goes once every expected class of its
// protocol was set.
func TestExpectKeepsRoutesUntilTheirOwnerPassed(t *testing.T) {
	pod, block := wl("10.244.0.5/32", "cali0000000000a"), bh("10.244.0.0/26")
	peer := learned("10.244.1.0/26", "198.18.0.12")
	owners := map[string]map[Class][]dataplane.Route{
		"routes":   {Workload: {pod}, Blackhole: {block}, Aggregate: nil},
		"services": {Service: nil},
		"bgp":      {Learned: {peer}},
	}
	kept := sortByDst(append([]string{
		"10.244.0.5/32 dev cali0000000000a scope link proto 80",
		"blackhole 10.244.0.0/26 proto 80",
		"10.244.1.0/26 via 198.18.0.12 proto 81",
	}, nodeLines...))
	orphan := "blackhole 10.244.7.0/26 proto 80"
	for _, order := range [][]string{
		{"bgp", "services", "routes"},
		{"services", "routes", "bgp"},
		{"bgp", "routes", "services"},
		{"routes", "services", "bgp"},
	} {
		t.Run(strings.Join(order, ","), func(t *testing.T) {
			kernel := fake.NewRoutes(append(nodeRoutes(), pod, block, peer, bh("10.244.7.0/26"))...)
			table := New(kernel, time.Hour)
			table.Expect(Workload, Blackhole, Aggregate, Service)
			table.HoldDeletes(Learned, true) // as the BGP owner does until it converged
			passed := map[string]bool{}
			for _, o := range order {
				passed[o] = true
				var classes []Class
				for c, routes := range owners[o] {
					if err := table.SetClass(c, routes); err != nil {
						t.Fatal(err)
					}
					classes = append(classes, c)
				}
				if err := table.Apply(classes...); err != nil {
					t.Fatal(err)
				}
				want := kept // the orphan goes once both local owners passed
				if !passed["routes"] || !passed["services"] {
					want = sortByDst(append(slices.Clone(kept), orphan))
				}
				if diff := cmp.Diff(want, kernel.Lines()); diff != "" {
					t.Fatalf("after %s's first pass (-want +got):\n%s", o, diff)
				}
			}
			if diff := cmp.Diff([]string{"delete " + orphan}, kernel.Ops()); diff != "" {
				t.Errorf("kernel operations (-want +got):\n%s", diff)
			}
		})
	}
}
