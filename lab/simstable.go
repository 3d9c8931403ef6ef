package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// stableFor is how long every simulated session must have been
// established before a measurement; stableTimeout bounds the wait.
const (
	stableFor     = 5 * time.Second
	stableTimeout = 3 * time.Minute
)

// stableRounds bounds how many times waitStable starts again because
// sessions dropped while it waited for the reflectors to be quiet.
const stableRounds = 5

// waitStable waits until every simulated node has a session with every
// reflector, established for stableFor at least, on which the reflector
// has sent something since it was established, and the reflectors are
// quiet (they send a re-established session their whole table) — both at
// once: a session that drops while the reflectors send (at 1,000, minutes
// after a fill) starts the wait again, at most stableRounds times. At
// 1,000 nodes hundreds of sessions dropped late in the fill and
// re-established through the "rest", which measured that, and once
// through the block samples, which the quiet wait had let begin after
// the sessions were checked (docs/scale.md, "Session drops"). Past
// stableTimeout in one round it fails, naming how many sessions are not
// stable and why; before names the measurement it guards.
func (r *simRun) waitStable(ctx context.Context, before string) error {
	for round := 1; ; round++ {
		if err := r.waitEstablished(ctx, before); err != nil {
			return err
		}
		_, _ = r.waitQuiet(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		bad, _, _ := r.unstableSessions()
		if bad == 0 {
			return nil
		}
		if round == stableRounds {
			return fmt.Errorf("before %s: %d simulated sessions were not stable after the reflectors went quiet, %d times over (each drop's cause in %s)",
				before, bad, stableRounds, simDropsFile)
		}
		r.l.Progress("%d simulated sessions dropped or are new since the reflectors were last checked: waiting again (round %d of %d)", bad, round+1, stableRounds)
	}
}

// waitEstablished waits until unstableSessions finds none, at most
// stableTimeout.
func (r *simRun) waitEstablished(ctx context.Context, before string) error {
	total := 0
	for _, n := range r.nodes {
		total += len(n.rrs)
	}
	start := time.Now()
	for {
		bad, counts, examples := r.unstableSessions()
		if bad == 0 {
			break
		}
		if time.Since(start) > stableTimeout || ctx.Err() != nil {
			return fmt.Errorf("before %s: after %s, %d of %d simulated sessions are not established for %s with a message from the reflector since: %d down, %d established less than %s ago, %d with nothing from the reflector since established (e.g. %s; each drop's cause in %s)",
				before, time.Since(start).Round(time.Second), bad, total, stableFor, counts["down"], counts["young"], stableFor, counts["mute"],
				strings.Join(examples, ", "), simDropsFile)
		}
		sleepCtx(ctx, 500*time.Millisecond)
	}
	r.l.Progress("all %d simulated sessions established for %s or more (waited %s)", total, stableFor, time.Since(start).Round(100*time.Millisecond))
	return ctx.Err()
}

// unstableSessions counts the simulated sessions that are down, younger
// than stableFor or mute, by reason, with a few examples.
func (r *simRun) unstableSessions() (bad int, counts map[string]int, examples []string) {
	names := r.rrNames()
	counts = map[string]int{}
	now := time.Now()
	for _, n := range r.nodes {
		n.unstable(now, stableFor, func(rr netip.Addr, why string) {
			counts[why]++
			if len(examples) < 5 {
				examples = append(examples, fmt.Sprintf("%s → %s %s", n.name, names[rr], why))
			}
		})
	}
	return counts["down"] + counts["young"] + counts["mute"], counts, examples
}

// rrNames maps each reflector's address to its node's name.
func (r *simRun) rrNames() map[netip.Addr]string {
	st := r.l.State()
	out := map[netip.Addr]string{}
	for _, n := range st.Nodes {
		out[n.IP.Addr()] = n.Name
	}
	return out
}

// openDropLog opens where simDrops writes: o.Out's session-drops.log, or
// o.Log without o.Out.
func openDropLog(o SimOptions) (io.Writer, func() error, error) {
	if o.Out == "" {
		if o.Log == nil {
			return io.Discard, func() error { return nil }, nil
		}
		return o.Log, func() error { return nil }, nil
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, nil, err
	}
	f, err := os.Create(filepath.Join(o.Out, simDropsFile))
	if err != nil {
		return nil, nil, err
	}
	return f, f.Close, nil
}

// keepLabLogs copies the lab's logs (every agent's, etcd's, the proxy's)
// into dir before the lab is taken down: a failed run keeps them.
func keepLabLogs(l *Lab, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var errs []error
	copyTo := func(from, name string) {
		b, err := os.ReadFile(from)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, name), b, 0o644)
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("keeping %s: %w", from, err))
		}
	}
	for _, n := range l.State().Nodes {
		copyTo(filepath.Join(l.NodeDir(n.Name), "agent.log"), n.Name+".log")
	}
	logs, _ := filepath.Glob(filepath.Join(l.Dir(), "*.log"))
	for _, f := range logs {
		copyTo(f, filepath.Base(f))
	}
	if len(errs) == 0 {
		l.Progress("kept the lab's logs in %s", dir)
	}
	return errors.Join(errs...)
}
