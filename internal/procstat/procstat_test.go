package procstat

import (
	"os"
	"runtime"
	"testing"
	"time"
)

// TestReadSelf reads this process while it spins until its threads' CPU,
// as Read sees it, has grown by 20 ms (on a loaded host the spin may take
// far longer than 20 ms of wall time): threads are counted, Total is at
// least the growth, and Since is exact while no thread exited.
func TestReadSelf(t *testing.T) {
	before, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	const want = 20 * time.Millisecond
	var after Process
	var d Counters
	exact := true
	for deadline := time.Now().Add(time.Minute); d.CPU < want; {
		if time.Now().After(deadline) {
			t.Fatalf("a minute of spinning: Read saw %s of CPU, want %s", d.CPU, want)
		}
		for start := time.Now(); time.Since(start) < 5*time.Millisecond; {
			runtime.Gosched()
		}
		if after, err = Read(os.Getpid()); err != nil {
			t.Fatal(err)
		}
		d, exact = after.Since(before)
	}
	if total := after.Total(); total.Threads != len(after) || total.CPU < d.CPU {
		t.Errorf("total %+v against since %+v over %d threads", total, d, len(after))
	}
	if !exact {
		// Only a thread that exited under the test runtime makes it
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
