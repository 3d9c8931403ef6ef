package lab

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// kernelMonitor follows one namespace's kernel changes as they happen
// (`ip monitor route`, `nft monitor`): the harness times "in the kernel"
// without polling. It remembers when each token (a route's destination, an
// address in a set element) was first seen after the last reset.
type kernelMonitor struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	seen map[string]time.Time
	wake chan struct{} // closed and replaced on every line
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
			toks := tokens(sc.Text())
			m.mu.Lock()
			for _, t := range toks {
				if _, ok := m.seen[t]; !ok {
					m.seen[t] = now
				}
			}
			close(m.wake)
			m.wake = make(chan struct{})
			m.mu.Unlock()
		}
	}()
	return m, nil
}

// routeTokens: an added route's destination ("Deleted …" lines give none).
func routeTokens(line string) []string {
	f := strings.Fields(line)
	if len(f) == 0 || f[0] == "Deleted" {
		return nil
	}
	return f[:1]
}

// elementTokens: "add:<addr>" / "delete:<addr>" for every address of a set
// element line of `nft monitor`.
func elementTokens(line string) []string {
	verb, _, ok := strings.Cut(line, " element ")
	if !ok {
		return nil
	}
	_, body, ok := strings.Cut(line, "{")
	if !ok {
		return nil
	}
	body, _, _ = strings.Cut(body, "}")
	var out []string
	for _, e := range strings.Split(body, ",") {
		e = strings.TrimSpace(e)
		if e != "" {
			out = append(out, verb+":"+strings.Fields(e)[0])
		}
	}
	return out
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
