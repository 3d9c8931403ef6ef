package lab

import (
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
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
	o := SimOptions{Sizes: []int{100, 10, 2000}, EndpointsPerNode: 99}
	o.Default()
	err := o.Validate()
	for _, want := range []string{"sizes[1]: 10 not above 100", "sizes[2]: 2000 out of range", "endpoints per node: 99"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to say %q", err, want)
		}
	}
	ok := SimOptions{Sizes: []int{10}}
	ok.Default()
	if ok.ChurnWindow != 20*time.Second || ok.Policies != 1000 {
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
		{"add element inet tabby s-abc { 10.244.1.5 }", elementTokens, []string{"add:10.244.1.5"}},
		{"delete element inet tabby s-abc { 10.244.1.5, 10.244.1.6 }", elementTokens, []string{"delete:10.244.1.5", "delete:10.244.1.6"}},
		{"add rule inet tabby c { ip saddr 1.2.3.4 }", elementTokens, nil},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, tt.fn(tt.line)); diff != "" {
			t.Errorf("%q (-want +got):\n%s", tt.line, diff)
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
	rs := []SimResult{{Nodes: 10, AgentUsPerEvent: 900, RouteP99Ms: 40}, {Nodes: 100, AgentUsPerEvent: 1000, RouteP99Ms: 60}}
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
	if !strings.Contains(string(md), "| 100 | 0 | 1000 |") {
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
