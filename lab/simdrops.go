package lab

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/tabbynet/tabby/bgp"
)

// The harness's phases, in order: simulated sessions that end are counted
// by the phase they ended in (docs/scale.md, "Session drops").
const (
	phaseGrow     = "grow"    // adding simulated nodes, waiting for their sessions
	phaseFill     = "fill"    // their endpoints
	phaseSamples  = "samples" // block → route samples (after waitQuiet)
	phaseSettle   = "settle"  // waiting for every route in every client
	phaseRest     = "rest"    // the first rest
	phaseChurn    = "churn"   // the pod events
	phaseRestB    = "rest2"   // the rest after the churn
	phasePolicy   = "policy"  // policy → kernel samples
	phaseRestart  = "restart" // restart → Ready
	simDropsFile  = "session-drops.log"
	dropsExamples = 3
)

var simPhases = []string{phaseGrow, phaseFill, phaseSamples, phaseSettle, phaseRest, phaseChurn, phaseRestB, phasePolicy, phaseRestart}

// simDrops logs every simulated session that ends (one line each, with
// bgp.SimDrop's cause) and counts them by phase: drops of established
// sessions, and sessions that ended while opening (a reflector refusing a
// peer it holds Idle after a drop closes the connection at once). Safe for
// concurrent use.
type simDrops struct {
	mu       sync.Mutex
	w        io.Writer
	names    map[netip.Addr]string
	phase    string
	drops    map[string]int
	opens    map[string]int
	examples []string // the current phase's first drops
	progress func(format string, args ...any)
}

func newSimDrops(w io.Writer, names map[netip.Addr]string, progress func(string, ...any)) *simDrops {
	return &simDrops{w: w, names: names, phase: phaseGrow, drops: map[string]int{}, opens: map[string]int{}, progress: progress}
}

// enter starts phase, reporting the drops of the one before.
func (d *simDrops) enter(phase string) {
	d.mu.Lock()
	prev, n, opens, ex := d.phase, d.drops[d.phase], d.opens[d.phase], d.examples
	d.phase, d.examples = phase, nil
	d.mu.Unlock()
	if n > 0 || opens > 0 {
		d.progress("simulated sessions during %s: %d established sessions dropped, %d ended while opening (each in %s); first: %s",
			prev, n, opens, simDropsFile, strings.Join(ex, " | "))
	}
}

// record logs how node's session with the reflector at rr ended.
func (d *simDrops) record(node string, rr netip.Addr, err error) {
	var drop *bgp.SimDrop
	established := errors.As(err, &drop) && drop.Established > 0
	d.mu.Lock()
	defer d.mu.Unlock()
	line := fmt.Sprintf("%s → %s: %v", node, d.names[rr], err)
	if established {
		d.drops[d.phase]++
	} else {
		d.opens[d.phase]++
	}
	if len(d.examples) < dropsExamples {
		d.examples = append(d.examples, line)
	}
	if d.w != nil {
		fmt.Fprintf(d.w, "%s %s %s\n", time.Now().UTC().Format("15:04:05.000"), d.phase, line)
	}
}

// take returns the counts so far and starts new ones (one size's).
func (d *simDrops) take() (drops, opens map[string]int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	drops, opens = d.drops, d.opens
	d.drops, d.opens = map[string]int{}, map[string]int{}
	return drops, opens
}

// DropsTable renders the simulated session drops by phase, one row per
// size: "drops (ended while opening)".
func DropsTable(rs []SimResult) string {
	var b strings.Builder
	b.WriteString("| sim nodes | session drops (ended opening): " + strings.Join(simPhases, " | ") + " |\n|---|")
	b.WriteString(strings.Repeat("---|", len(simPhases)) + "\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %d |", r.Nodes)
		for _, p := range simPhases {
			fmt.Fprintf(&b, " %d (%d) |", r.SessionDrops[p], r.SessionOpensFailed[p])
		}
		b.WriteString("\n")
	}
	return b.String()
}
