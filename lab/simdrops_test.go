package lab

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/bgp"
)

// Simulated session ends are counted by the phase they happened in,
// established drops apart from sessions that ended while opening, and
// each is logged with its cause.
func TestSimDropsByPhase(t *testing.T) {
	rr := netip.MustParseAddr("198.18.0.11")
	var log strings.Builder
	var progress []string
	d := newSimDrops(&log, map[netip.Addr]string{rr: "node1"}, func(f string, a ...any) { progress = append(progress, fmt.Sprintf(f, a...)) })
	hold := &bgp.SimDrop{Side: bgp.SimSideLocal, Cause: bgp.SimHoldExpired, Established: 90 * time.Second, Silent: 90 * time.Second, Keepalives: 1}
	refused := &bgp.SimDrop{Side: bgp.SimSidePeer, Cause: bgp.SimPeerClosed}
	d.enter(phaseFill)
	d.record("sim1", rr, hold)
	d.record("sim2", rr, refused)
	d.record("sim3", rr, errors.New("not a drop"))
	d.enter(phaseRest)
	d.record("sim1", rr, hold)
	d.enter(phaseChurn)
	drops, opens := d.take()
	if diff := cmp.Diff(map[string]int{phaseFill: 1, phaseRest: 1}, drops); diff != "" {
		t.Errorf("drops (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int{phaseFill: 2}, opens); diff != "" {
		t.Errorf("ended while opening (-want +got):\n%s", diff)
	}
	if n := strings.Count(log.String(), "\n"); n != 4 {
		t.Errorf("%d lines logged, want 4:\n%s", n, log.String())
	}
	if !strings.Contains(log.String(), " fill sim1 → node1: hold timer expired (local side): established 1m30s") {
		t.Errorf("log lacks the fill's hold timer drop:\n%s", log.String())
	}
	if len(progress) != 2 || !strings.Contains(progress[0], "during fill: 1 established sessions dropped, 2 ended while opening") {
		t.Errorf("progress = %q, want one line for the fill and one for the rest", progress)
	}
	if drops, _ := d.take(); len(drops) != 0 {
		t.Errorf("take did not start new counts: %v", drops)
	}
	table := DropsTable([]SimResult{{Nodes: 300, SessionDrops: map[string]int{phaseRest: 7}, SessionOpensFailed: map[string]int{phaseRest: 20}}})
	if !strings.Contains(table, "| 300 | 0 (0) | 0 (0) | 0 (0) | 0 (0) | 7 (20) | 0 (0) |") {
		t.Errorf("DropsTable:\n%s", table)
	}
}
