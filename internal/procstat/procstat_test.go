package procstat

import (
	"os"
	"runtime"
	"testing"
	"time"
)

// TestReadSelf reads this process while one thread spins: its CPU grows by
// about what it spun, threads are counted, and Since is exact.
func TestReadSelf(t *testing.T) {
	before, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	spin := 50 * time.Millisecond
	for start := time.Now(); time.Since(start) < spin; {
		runtime.Gosched()
	}
	after, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	d, exact := after.Since(before)
	if d.CPU < spin/2 {
		t.Errorf("CPU over a %s spin: %s", spin, d.CPU)
	}
	if total := after.Total(); total.Threads != len(after) || total.CPU < d.CPU {
		t.Errorf("total %+v against since %+v over %d threads", total, d, len(after))
	}
	if !exact && len(before) <= len(after) {
		// A thread may exit under the test runtime; only then may it be
		// inexact.
		for tid := range before {
			if _, ok := after[tid]; !ok {
				return
			}
		}
		t.Error("Since not exact with every thread still there")
	}
}

// TestSinceThreads: a new thread counts whole, an exited one makes the
// difference inexact.
func TestSinceThreads(t *testing.T) {
	ms := time.Millisecond
	earlier := Process{1: {CPU: 10 * ms, Voluntary: 3, Threads: 1}, 2: {CPU: 5 * ms, Threads: 1}}
	later := Process{1: {CPU: 14 * ms, Voluntary: 5, Threads: 1}, 2: {CPU: 6 * ms, Threads: 1}, 3: {CPU: 2 * ms, Involuntary: 1, Threads: 1}}
	d, exact := later.Since(earlier)
	if want := (Counters{CPU: 7 * ms, Voluntary: 2, Involuntary: 1, Threads: 3}); d != want || !exact {
		t.Errorf("Since = %+v, %v; want %+v, true", d, exact, want)
	}
	delete(later, 2)
	if _, exact := later.Since(earlier); exact {
		t.Error("Since exact with thread 2 gone")
	}
	if _, err := Read(-1); err == nil {
		t.Error("Read(-1) did not fail")
	}
}
