package lab

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tabbynet/tabby/dataplane"
)

// kernelMonitor follows one namespace's kernel changes as they happen
// (`ip monitor route`, dataplane.WatchSetElements): the harness times "in
// the kernel" without polling. It remembers when each token (a route's
// destination, an address in a set element) was first seen after the last
// reset.
type kernelMonitor struct {
	cmd    *exec.Cmd          // a monitor command, or
	cancel context.CancelFunc // a watch in process
	mu     sync.Mutex
	seen   map[string]time.Time
	wake   chan struct{} // closed and replaced on every line
}

// note records toks as seen at now and wakes the waiters.
func (m *kernelMonitor) note(toks []string, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, t := range toks {
		if _, ok := m.seen[t]; !ok {
			m.seen[t] = now
		}
	}
	close(m.wake)
	m.wake = make(chan struct{})
}

// startMonitor runs argv inside the network namespace ns and indexes its
// output lines with tokens.
func startMonitor(ctx context.Context, ns string, tokens func(string) []string, argv ...string) (*kernelMonitor, error) {
	full := append([]string{"--net=" + NetNSPath(ns), "--"}, argv...)
	cmd := exec.CommandContext(ctx, "nsenter", full...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %v in %s: %w", argv, ns, err)
	}
	m := &kernelMonitor{cmd: cmd, seen: map[string]time.Time{}, wake: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			now := time.Now()
			m.note(tokens(sc.Text()), now)
		}
	}()
	return m, nil
}

// startElementWatch follows the set elements of the network namespace ns
// with tokens "add:<addr>" / "delete:<addr>". It replaces `nft monitor`,
// which stops printing a named set's elements once a rule that refers to
// the set is deleted (a chain the agent rewrites), so that a policy
// change was timed out while the kernel had the element (docs/scale.md,
// "nftables generation check").
func startElementWatch(ctx context.Context, ns string, log io.Writer) (*kernelMonitor, error) {
	wctx, cancel := context.WithCancel(ctx)
	events, err := dataplane.WatchSetElements(wctx, NetNSPath(ns))
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watching the set elements of %s: %w", ns, err)
	}
	m := &kernelMonitor{cancel: cancel, seen: map[string]time.Time{}, wake: make(chan struct{})}
	go func() {
		for ev := range events {
			now := time.Now()
			if ev.Err != nil {
				fmt.Fprintf(log, "set element watch in %s ended: %v\n", ns, ev.Err)
				continue
			}
			m.note(elementEventTokens(ev), now)
		}
	}()
	return m, nil
}

// elementEventTokens: "add:<addr>" / "delete:<addr>" for every address of
// an element event.
func elementEventTokens(ev dataplane.SetElementEvent) []string {
	verb := "delete"
	if ev.Add {
		verb = "add"
	}
	out := make([]string, 0, len(ev.Addrs))
	for _, a := range ev.Addrs {
		out = append(out, verb+":"+a.String())
	}
	return out
}

// routeTokens: an added route's destination ("Deleted …" lines give none).
func routeTokens(line string) []string {
	f := strings.Fields(line)
	if len(f) == 0 || f[0] == "Deleted" {
		return nil
	}
	return f[:1]
}

// forget drops token, so that the next time it shows is timed afresh.
func (m *kernelMonitor) forget(token string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.seen, token)
}

// wait returns when token was first seen, waiting for it until ctx ends.
func (m *kernelMonitor) wait(ctx context.Context, token string) (time.Time, error) {
	for {
		m.mu.Lock()
		t, ok := m.seen[token]
		wake := m.wake
		m.mu.Unlock()
		if ok {
			return t, nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("waiting for %s in the kernel: %w", token, ctx.Err())
		}
	}
}

// waitAll returns when each of ms first saw token, and the latest of
// those times.
func waitAll(ctx context.Context, ms []*kernelMonitor, token string) (each []time.Time, last time.Time, err error) {
	for _, m := range ms {
		t, err := m.wait(ctx, token)
		if err != nil {
			return nil, time.Time{}, err
		}
		each = append(each, t)
		if t.After(last) {
			last = t
		}
	}
	return each, last, nil
}

func (m *kernelMonitor) stop() {
	if m.cancel != nil {
		m.cancel()
		return
	}
	if m.cmd.Process != nil {
		_ = m.cmd.Process.Kill()
		_ = m.cmd.Wait()
	}
}

// ProcUsage is what a process has used: its CPU time so far (user and
// system), and its resident memory now and at its peak, from /proc.
type ProcUsage struct {
	CPUSeconds     float64
	RSSMiB, HWMMiB float64
}

// ReadProcUsage reads a process's ProcUsage.
func ReadProcUsage(pid int) (ProcUsage, error) {
	f, err := ProcStat(pid)
	if err != nil {
		return ProcUsage{}, err
	}
	if len(f) < 13 {
		return ProcUsage{}, fmt.Errorf("short /proc/%d/stat", pid)
	}
	// ProcStat's fields start after the command name: utime and stime
	// are fields 14 and 15 of stat, indices 11 and 12 here, in USER_HZ
	// (100) ticks.
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ProcUsage{}, err
	}
	pu := ProcUsage{CPUSeconds: (u + s) / 100}
	for _, line := range strings.Split(string(b), "\n") {
		name, v, ok := strings.Cut(line, ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		if name == "VmRSS" {
			pu.RSSMiB = kb / 1024
		} else {
			pu.HWMMiB = kb / 1024
		}
	}
	return pu, nil
}

// procUsage is a process's CPU time so far (seconds) and resident memory
// (MiB).
func procUsage(pid int) (cpu float64, rssMiB float64, err error) {
	pu, err := ReadProcUsage(pid)
	return pu.CPUSeconds, pu.RSSMiB, err
}
