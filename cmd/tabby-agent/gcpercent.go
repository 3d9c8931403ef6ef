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

// setGCPercent sets defaultGCPercent unless the environment sets GOGC (any
// value, "off" included: the runtime has read it already and the operator's
// word wins), and logs the headroom in force. GOGC is read once.
func setGCPercent(log *slog.Logger, lookupEnv func(string) (string, bool)) {
	if v, set := lookupEnv("GOGC"); set {
		log.Info("Go collector headroom from GOGC", "GOGC", v)
		return
	}
	debug.SetGCPercent(defaultGCPercent)
	log.Info("Go collector headroom (GOGC unset: the agent's default)", "gc_percent", defaultGCPercent)
}
