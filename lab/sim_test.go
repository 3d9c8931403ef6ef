package lab

import (
	"context"
	"image/png"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/procstat"
)

func TestCheckSimMemory(t *testing.T) {
	if err := checkSimMemory(1000, 24000); err != nil {
		t.Errorf("1000 nodes in 24000 MiB: %v", err)
	}
	err := checkSimMemory(1000, 3000)
	if err == nil || !strings.Contains(err.Error(), "at most 329 simulated nodes fit") {
		t.Errorf("1000 nodes in 3000 MiB: %v, want a refusal naming 329", err)
	}
	if err := checkSimMemory(1, 100); err == nil || !strings.Contains(err.Error(), "at most 0") {
		t.Errorf("1 node in 100 MiB: %v", err)
	}
}

func TestSimOptionsValidate(t *testing.T) {
	o := SimOptions{Sizes: []int{100, 10, 2000}, EndpointsPerNode: 99, ChurnEvents: 1}
	o.Default()
	err := o.Validate()
	for _, want := range []string{"sizes[1]: 10 not above 100", "sizes[2]: 2000 out of range", "endpoints per node: 99", "churn events: 1 out of range"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to say %q", err, want)
		}
	}
	ok := SimOptions{Sizes: []int{10}}
	ok.Default()
	if ok.ChurnEvents != 400 || ok.ChurnWindow != 10*time.Minute || ok.Policies != 1000 {
		t.Errorf("defaults: %+v", ok)
	}
}

func TestMonitorTokens(t *testing.T) {
	tests := []struct {
		line string
		fn   func(string) []string
		want []string
	}{
		{"10.244.3.0/26 via 198.18.4.5 dev eth0 proto 81", routeTokens, []string{"10.244.3.0/26"}},
		{"Deleted 10.244.3.0/26 via 198.18.4.5 dev eth0 proto 81", routeTokens, nil},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, tt.fn(tt.line)); diff != "" {
			t.Errorf("%q (-want +got):\n%s", tt.line, diff)
		}
	}
	a, b := netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("fd00::6")
	for _, tt := range []struct {
		ev   dataplane.SetElementEvent
		want []string
	}{
		{dataplane.SetElementEvent{Add: true, Addrs: []netip.Addr{a}}, []string{"add:10.244.1.5"}},
		{dataplane.SetElementEvent{Addrs: []netip.Addr{a, b}}, []string{"delete:10.244.1.5", "delete:fd00::6"}},
		{dataplane.SetElementEvent{Add: true}, []string{}},
	} {
		if diff := cmp.Diff(tt.want, elementEventTokens(tt.ev)); diff != "" {
			t.Errorf("%+v (-want +got):\n%s", tt.ev, diff)
		}
	}
}

func TestSimAddrAndPlot(t *testing.T) {
	if got := simAddr(1000).String(); got != "198.18.7.232" {
		t.Errorf("simAddr(1000) = %s", got)
	}
	if !simSubnet.Contains(simAddr(MaxSimNodes)) {
		t.Errorf("simAddr(%d) outside %s", MaxSimNodes, simSubnet)
	}
	dir := t.TempDir()
	rs := []SimResult{{Nodes: 10, AgentUsPerEvent: 900, RouteP99Ms: 40}, {Nodes: 100, Events: 400, ChurnSeconds: 21.4, AgentUsPerEvent: 1000, AgentUsPerEventNoise: 35,
		FloorMeasured: true, FloorUsPerEvent: 250, FloorUsPerEventNoise: 12, RouteP99Ms: 60}}
	if err := WriteSimResults(dir, rs); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, "scale.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Error(err)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "results.md"))
	if !strings.Contains(string(md), "| 10 | 0 | 0 (0) | 900 ± 0 | — |") || !strings.Contains(string(md), "| 100 | 0 | 400 (21) | 1000 ± 35 | 250 ± 12 (4.00) |") {
		t.Errorf("results.md:\n%s", md)
	}
}

// A block → route sample also counts from the advertisement on, when this
// ADD advertised the block.
func TestRouteLatencies(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	var l routeLatencies
	l.add(t0, t0.Add(40*time.Millisecond), t0.Add(100*time.Millisecond))
	l.add(t0, time.Time{}, t0.Add(70*time.Millisecond))
	if want := []time.Duration{100 * time.Millisecond, 70 * time.Millisecond}; !slices.Equal(l.total, want) {
		t.Errorf("total = %v, want %v", l.total, want)
	}
	if want := []time.Duration{60 * time.Millisecond}; !slices.Equal(l.fromAdvert, want) {
		t.Errorf("from the advertisement = %v, want %v", l.fromAdvert, want)
	}
}

// The per-event cost is the churn's CPU beyond the mean rest rate, per
// event; the noise is what the two rests' difference makes over the churn.
func TestPerEvent(t *testing.T) {
	w := func(cpu, secs float64) window {
		return window{from: map[string]usage{"a": {cpu: 100}}, to: map[string]usage{"a": {cpu: 100 + cpu}}, secs: secs}
	}
	tests := []struct {
		name                string
		restA, churn, restB window
		events              int
		us, noise           float64
	}{
		// Rests at 1 % and 3 %: 2 % of 20 s is 0.4 s; 0.8 s more over 400 events is 2,000 µs each, ±1 % of 20 s.
		{"above the rest", w(0.6, 60), w(1.2, 20), w(1.8, 60), 400, 2000, 500},
		{"steady rest", w(0.6, 60), w(0.3, 20), w(0.6, 60), 100, 1000, 0},
		// The churn used less than the rest would have: said so, not clamped.
		{"below the rest", w(1.2, 60), w(0.2, 20), w(1.2, 60), 200, -1000, 0},
		{"no event", w(0.6, 60), w(0.2, 20), w(0.6, 60), 0, 0, 0},
	}
	for _, tt := range tests {
		us, noise := perEvent("a", tt.restA, tt.churn, tt.restB, tt.events)
		if math.Abs(us-tt.us) > 1e-6 || math.Abs(noise-tt.noise) > 1e-6 {
			t.Errorf("%s: perEvent = %.3f ± %.3f µs, want %.3f ± %.3f", tt.name, us, noise, tt.us, tt.noise)
		}
	}
}

// A window's CPU comes from the threads' nanosecond counts while every
// thread of the first reading is still there, from the clock ticks when one
// exited, and from the ticks when threads were not read.
func TestWindowCPU(t *testing.T) {
	ms := time.Millisecond
	from := usage{cpu: 10, threads: procstat.Process{1: {CPU: 400 * ms}, 2: {CPU: 100 * ms}}}
	to := usage{cpu: 10.03, threads: procstat.Process{1: {CPU: 412 * ms}, 2: {CPU: 101 * ms}, 3: {CPU: 4 * ms}}}
	w := window{from: map[string]usage{"a": from}, to: map[string]usage{"a": to}, secs: 1}
	if got := w.cpu("a"); math.Abs(got-0.017) > 1e-9 {
		t.Errorf("every thread there: cpu = %g s, want 0.017 (12 + 1 + 4 ms)", got)
	}
	delete(to.threads, 2)
	if got := w.cpu("a"); math.Abs(got-0.03) > 1e-9 {
		t.Errorf("thread 2 exited: cpu = %g s, want the ticks' 0.03", got)
	}
	w.to["a"] = usage{cpu: 10.05}
	if got := w.rate("a"); math.Abs(got-0.05) > 1e-9 {
		t.Errorf("no threads read: rate = %g /s, want 0.05", got)
	}
}

// Context switches per event: the churn's beyond the rests' mean rate;
// none when a thread exited in a window.
func TestWakesPerEvent(t *testing.T) {
	w := func(from, to int64, secs float64) window {
		return window{from: map[string]usage{"a": {threads: procstat.Process{1: {Voluntary: from}}}},
			to: map[string]usage{"a": {threads: procstat.Process{1: {Voluntary: to}}}}, secs: secs}
	}
	// Rests at 10 and 30 a second: 20 a second over 20 s is 400; 1,200
	// more over 400 events is 3 each.
	got, ok := wakesPerEvent("a", w(0, 600, 60), w(1000, 2600, 20), w(5000, 6800, 60), 400)
	if !ok || math.Abs(got-3) > 1e-9 {
		t.Errorf("wakesPerEvent = %g, %v; want 3, true", got, ok)
	}
	gone := w(0, 600, 60)
	gone.from["a"].threads[2] = procstat.Counters{Voluntary: 5}
	if _, ok := wakesPerEvent("a", gone, w(1000, 2600, 20), w(5000, 6800, 60), 400); ok {
		t.Error("wakesPerEvent ok with a thread gone in the first rest")
	}
}

// counterSteps: each client's growth between consecutive readings; a
// client missing from any reading, or its counter, is left out.
func TestCounterSteps(t *testing.T) {
	read := func(vals map[string]float64) map[string]map[string]float64 {
		out := map[string]map[string]float64{}
		for c, v := range vals {
			out[c] = map[string]float64{"n": v}
		}
		return out
	}
	got := counterSteps("n", read(map[string]float64{"a": 1, "b": 5, "c": 0}), read(map[string]float64{"a": 3, "b": 5}), read(map[string]float64{"a": 7, "b": 6, "c": 2}))
	want := map[string][]float64{"a": {2, 4}, "b": {0, 1}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("counterSteps (-want +got):\n%s", diff)
	}
}

// A sample's stages: the claim, each reflector's UPDATE at the observer
// (one it did not send is left out), and each node's kernel by kind.
func TestRouteStages(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	log := newReflectLog()
	rr1, rr2 := netip.MustParseAddr("198.18.0.11"), netip.MustParseAddr("198.18.0.12")
	block := netip.MustParsePrefix("10.244.3.0/26")
	log.add(rr1, []netip.Prefix{block})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if got := log.wait(ctx, block, []netip.Addr{rr1, rr2}); got[0].IsZero() || !got[1].IsZero() {
		t.Fatalf("wait = %v, want rr1's time and none for rr2", got)
	}
	var l routeLatencies
	l.addStages(t0, ms(40), []time.Time{ms(60), {}}, []time.Time{ms(90), ms(300), ms(100), ms(120)}, 2)
	l.add(t0, ms(40), ms(300))
	var res SimResult
	l.fill(&res)
	want := &RouteStages{ClaimP50Ms: 40, ClaimMaxMs: 40, ReflectedP50Ms: 20, ReflectedMaxMs: 20,
		RRKernelP50Ms: 50, RRKernelMaxMs: 260, ClientKernelP50Ms: 60, ClientKernelMaxMs: 80} // p50: nearest rank, the lower of two
	if diff := cmp.Diff(want, res.Stages); diff != "" {
		t.Errorf("stages (-want +got):\n%s", diff)
	}
	if res.RouteP99Ms != 300 || res.AdvertP50Ms != 260 {
		t.Errorf("route %v / advert %v ms, want 300 / 260", res.RouteP99Ms, res.AdvertP50Ms)
	}
}

func TestSimOptionsZones(t *testing.T) {
	tests := []struct {
		name string
		o    SimOptions
		want []string // substrings of the error; none = valid
	}{
		{"three zones", SimOptions{Zones: 3}, nil},
		{"negative", SimOptions{Zones: -1}, []string{"zones: -1 out of range 0-26"}},
		{"more zones than letters", SimOptions{Zones: 27}, []string{"zones: 27 out of range 0-26"}},
		{"more reflectors than the host runs", SimOptions{Zones: 8, RouteReflectors: 2},
			[]string{"route reflectors 2 per zone × 8 zones = 16 reflectors: want at least 1 of each, 20 real agents together at most"}},
		{"more per zone than routeReflectorsPerZone", SimOptions{Zones: 1, RouteReflectors: 17, RealNodes: 1},
			[]string{"route reflectors: 17 per zone out of range 1-16"}},
		{"a zone without a real client", SimOptions{Zones: 3, RealNodes: 2}, []string{"real nodes: 2 for 3 zones"}},
		{"three zones, Calico's peering", SimOptions{Zones: 3, ReflectorPeering: "Client"}, nil},
		{"peering without zones", SimOptions{ReflectorPeering: "Client"}, []string{"reflector peering Client: only with zones"}},
		{"peering misspelt", SimOptions{Zones: 3, ReflectorPeering: "client"}, []string{`reflector peering "client": want NonClient or Client`}},
		{"no zones, too many agents", SimOptions{RouteReflectors: 19, RealNodes: 2}, []string{"route reflectors 19: want at least 1 of each, 20 real agents"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := tt.o
			o.Sizes = []int{1}
			o.Default()
			err := o.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v", err)
				}
				return
			}
			for _, w := range tt.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %v, want it to say %q", err, w)
				}
			}
		})
	}
	o := SimOptions{Zones: 3}
	o.Default()
	if o.RealNodes != 3 || o.RouteReflectors != 2 || o.reflectors() != 6 {
		t.Errorf("defaults with 3 zones: %d real nodes, %d reflectors per zone, %d reflectors; want 3, 2, 6", o.RealNodes, o.RouteReflectors, o.reflectors())
	}
	o = SimOptions{}
	o.Default()
	if o.RealNodes != 2 || o.reflectors() != 2 {
		t.Errorf("defaults without zones: %d real nodes, %d reflectors; want 2, 2", o.RealNodes, o.reflectors())
	}
}

// Simulated nodes take zones round robin, as the lab's real nodes do
// (registerZone), so each zone has as many within one.
func TestSimZone(t *testing.T) {
	var got []string
	for i := 1; i <= 7; i++ {
		got = append(got, simZone(i, 3))
	}
	want := []string{"zone-a", "zone-b", "zone-c", "zone-a", "zone-b", "zone-c", "zone-a"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("simZone (-want +got):\n%s", diff)
	}
	if z := simZone(5, 0); z != "" {
		t.Errorf("simZone without zones = %q", z)
	}
}

func TestCheckSimChoice(t *testing.T) {
	choice := func(zones map[string][]string) *bgp.ReflectorChoice {
		c := &bgp.ReflectorChoice{Zones: map[string][]bgp.Reflector{}}
		for z, ns := range zones {
			for _, n := range ns {
				c.Zones[z] = append(c.Zones[z], bgp.Reflector{Node: n, ClusterID: bgp.ZoneClusterID(z)})
			}
		}
		return c
	}
	// Candidates node1-node4 in two zones, round robin.
	rrs := []string{"node1", "node2", "node3", "node4"}
	tests := []struct {
		name    string
		c       *bgp.ReflectorChoice
		wantErr string
	}{
		{"the candidates", choice(map[string][]string{"zone-a": {"node1", "node3"}, "zone-b": {"node2", "node4"}}), ""},
		{"none", nil, "no route reflector elected"},
		{"a zone short", choice(map[string][]string{"zone-a": {"node1", "node3"}, "zone-b": {"node2"}}), "zone zone-b has 1 elected reflectors, want 2"},
		{"a client elected", choice(map[string][]string{"zone-a": {"node1", "node5"}, "zone-b": {"node2", "node4"}}), "want the candidates"},
		{"a zone more", choice(map[string][]string{"zone-a": {"node1", "node3"}, "zone-b": {"node2", "node4"}, "": {"node6"}}), "want the candidates"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkSimChoice(tt.c, rrs, 2, 2)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("checkSimChoice() = %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("checkSimChoice() = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestReflectorsTable(t *testing.T) {
	rs := []SimResult{{Nodes: 300, Zones: 3, Reflectors: []ReflectorFigures{
		{Node: "node1", Zone: "zone-a", Sessions: 106, RSSMiB: 201.4, IdlePct: 1.234},
		{Node: "node2", Zone: "zone-b", Sessions: 105, RSSMiB: 199.6, IdlePct: 1.1}}},
		{Nodes: 10, Reflectors: []ReflectorFigures{{Node: "node1", Sessions: 13, RSSMiB: 80, IdlePct: 0.5}}}}
	want := "| sim nodes | reflector | zone | BGP sessions | RSS MiB | idle CPU % |\n|---|---|---|---|---|---|\n" +
		"| 300 | node1 | zone-a | 106 | 201 | 1.23 |\n| 300 | node2 | zone-b | 105 | 200 | 1.10 |\n| 10 | node1 | — | 13 | 80 | 0.50 |\n"
	if diff := cmp.Diff(want, ReflectorsTable(rs)); diff != "" {
		t.Errorf("ReflectorsTable (-want +got):\n%s", diff)
	}
}

// A simulated node names its sessions that lack a block other than its
// own, in reflector order, at most max.
func TestSimNodeLacking(t *testing.T) {
	own, b1, b2 := netip.MustParsePrefix("10.244.1.0/26"), netip.MustParsePrefix("10.244.2.0/26"), netip.MustParsePrefix("10.244.3.0/26")
	rr1, rr2 := netip.MustParseAddr("198.18.0.11"), netip.MustParseAddr("198.18.0.12")
	track := bgp.SimConfig{Track: func(netip.Prefix) bool { return true }}
	n := &simNode{name: "sim1", blocks: map[netip.Prefix]bool{own: true},
		sessions: map[netip.Addr]*bgp.SimSession{rr2: bgp.NewSimSession(nil, track), rr1: bgp.NewSimSession(nil, track)}}
	got := n.lacking([]netip.Prefix{b1, own, b2}, 1)
	if want := []string{"sim1 ← 198.18.0.11 lacks [10.244.2.0/26 10.244.3.0/26]"}; !slices.Equal(got, want) {
		t.Errorf("lacking = %q, want %q", got, want)
	}
	if got := n.lacking([]netip.Prefix{own}, 3); got != nil {
		t.Errorf("lacking with only its own block = %q, want none", got)
	}
}
