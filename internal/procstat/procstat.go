// Package procstat reads a process's CPU time per thread from /proc with
// nanosecond resolution (schedstat), for benchmarks and the scale
// harness: /proc/PID/stat's utime and stime count 10 ms clock ticks, which
// over a 20 s churn of 400 events is ±25 µs per event.
package procstat

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Counters are CPU time and context switches.
type Counters struct {
	CPU time.Duration // sum_exec_runtime (schedstat): ns, not clock ticks
	// Voluntary are switches away to wait (each one a sleep and a later
	// wake-up); Involuntary are preemptions.
	Voluntary, Involuntary int64
	Threads                int
}

// Sub is c less d.
func (c Counters) Sub(d Counters) Counters {
	return Counters{CPU: c.CPU - d.CPU, Voluntary: c.Voluntary - d.Voluntary, Involuntary: c.Involuntary - d.Involuntary, Threads: c.Threads}
}

// Process is one reading of a process's live threads, by thread ID.
type Process map[int]Counters

// Read reads process pid's threads. A thread that exits while it is read
// is left out.
func Read(pid int) (Process, error) {
	dirs, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	if err != nil || len(dirs) == 0 {
		return nil, fmt.Errorf("process %d: no threads in /proc (%v)", pid, err)
	}
	p := make(Process, len(dirs))
	for _, d := range dirs {
		tid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		c, ok, err := readThread(d)
		if err != nil {
			return nil, err
		}
		if ok {
			p[tid] = c
		}
	}
	if len(p) == 0 {
		return nil, fmt.Errorf("process %d: its threads exited while read", pid)
	}
	return p, nil
}

// readThread reads one /proc/PID/task/TID directory; ok is false when the
// thread exited meanwhile.
func readThread(dir string) (c Counters, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, "schedstat"))
	if err != nil {
		return c, false, nil
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return c, false, nil
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return c, false, fmt.Errorf("%s/schedstat: %q", dir, b)
	}
	st, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return c, false, nil
	}
	c.CPU, c.Threads = time.Duration(ns), 1
	for _, line := range strings.Split(string(st), "\n") {
		name, val, _ := strings.Cut(line, ":")
		n, _ := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
		switch name {
		case "voluntary_ctxt_switches":
			c.Voluntary += n
		case "nonvoluntary_ctxt_switches":
			c.Involuntary += n
		}
	}
	return c, true, nil
}

// Total is the sum over the threads.
func (p Process) Total() Counters {
	var t Counters
	for _, c := range p {
		t.CPU += c.CPU
		t.Voluntary += c.Voluntary
		t.Involuntary += c.Involuntary
		t.Threads++
	}
	return t
}

// Since is what the process used between earlier and p: each thread's
// difference, a thread new since earlier counted whole. exact is false when
// a thread of earlier has exited (what it used before its exit is lost with
// it; a Go process's threads rarely exit, but one that ends locked to its
// thread, as a network namespace switch does, takes the thread along).
func (p Process) Since(earlier Process) (d Counters, exact bool) {
	exact = true
	for tid := range earlier {
		if _, ok := p[tid]; !ok {
			exact = false
		}
	}
	for tid, c := range p {
		d.Threads++
		if e, ok := earlier[tid]; ok {
			c = c.Sub(e)
		}
		d.CPU += c.CPU
		d.Voluntary += c.Voluntary
		d.Involuntary += c.Involuntary
	}
	return d, exact
}
