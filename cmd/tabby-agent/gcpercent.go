package main

import (
	"log/slog"
	"runtime/debug"
)

// defaultGCPercent is the collector's headroom when GOGC is not set: the
// heap may grow to 1.5× what is live before a collection, not Go's 2×.
// The agent's live heap grows with the cluster's endpoints, so headroom in
// proportion to it (unlike a fixed soft limit) is right at any size; it
// costs collector CPU in proportion to allocation (docs/scale.md, "Agent
// memory"). Calico's Felix makes the same choice (goGCThreshold).
const defaultGCPercent = 50

// gcPercent is the GOGC the agent sets: defaultGCPercent, unless the
// environment sets GOGC (any value, "off" included: the runtime has read
// it already and the operator's word wins).
func gcPercent(lookupEnv func(string) (string, bool)) (int, bool) {
	if _, set := lookupEnv("GOGC"); set {
		return 0, false
	}
	return defaultGCPercent, true
}

// setGCPercent applies gcPercent and logs the headroom in force.
func setGCPercent(log *slog.Logger, lookupEnv func(string) (string, bool)) {
	p, ok := gcPercent(lookupEnv)
	if !ok {
		v, _ := lookupEnv("GOGC")
		log.Info("Go collector headroom from GOGC", "GOGC", v)
		return
	}
	debug.SetGCPercent(p)
	log.Info("Go collector headroom (GOGC unset: the agent's default)", "gc_percent", p)
}
