package main

import (
	"log/slog"
	"math"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// memLimitRatio is the share of the container's memory limit given to the
// Go runtime as its soft limit: the rest is for what the runtime does not
// count (the binary's pages, which the cgroup charges, and memory outside
// Go's heap).
const memLimitRatio = 0.9

// setMemoryLimit makes a container memory limit (the cgroup's, v1 or v2)
// the garbage collector's soft limit at memLimitRatio, so that an agent
// near its limit collects harder instead of being killed for the heap's
// growth headroom. GOMEMLIMIT, when set, wins; AUTOMEMLIMIT=off or a ratio
// overrides the default (docs/scale.md, "Agent memory"). It returns the
// limit set, 0 when there is none.
func setMemoryLimit(log *slog.Logger) int64 {
	limit, err := memlimit.Set(memlimit.WithProvider(memlimit.FromCgroup), memlimit.WithRatio(memLimitRatio))
	switch {
	case err != nil:
		log.Warn("no soft memory limit: reading the cgroup's memory limit failed", "err", err)
		return 0
	case limit == math.MaxInt64:
		return 0
	}
	log.Info("Go soft memory limit (GOMEMLIMIT, else the container's memory limit)", "limit_mib", limit>>20)
	return limit
}
