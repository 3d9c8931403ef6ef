package main

import (
	"fmt"
	"log/slog"
	"runtime"
)

// setMaxProcs sets how many threads run Go code at once (GOMAXPROCS) to n,
// when n > 0; 0 leaves the runtime's own choice (the GOMAXPROCS
// environment variable, else the CPUs the process may use: the
// container's CPU limit, else the node's CPUs). Calico's Felix has the same
// knob (goMaxProcs).
//
// What it trades (docs/scale.md, "GOMAXPROCS"): at 1 an agent that is
// woken by a batch of watch events runs it on the thread that read it,
// where with more every hand-off between goroutines wakes a second thread
// that finds nothing to do: a remote pod event cost ×0.8 at 1 in the scale
// harness, ×0.5–0.8 in process; but an agent's passes, its collector and a burst of CNI ADDs then share
// one thread. Keep reflectors at the default: they take in every node's
// routes.
func setMaxProcs(log *slog.Logger, n int) error {
	switch {
	case n < 0:
		return fmt.Errorf("--max-procs %d: want 0 (the runtime's choice) or more", n)
	case n == 0:
		log.Info("Go threads running at once (GOMAXPROCS: the runtime's choice)", "gomaxprocs", runtime.GOMAXPROCS(0))
		return nil
	}
	prev := runtime.GOMAXPROCS(n)
	log.Info("Go threads running at once (GOMAXPROCS) set by --max-procs", "gomaxprocs", n, "was", prev)
	return nil
}
