package flowlog

import (
	"errors"
	"fmt"
	"time"
)

// Mode says which flows are logged.
type Mode string

// Modes.
const (
	ModeOff  Mode = "off"
	ModeDeny Mode = "deny" // denied flows only (NFLOG on deny rules)
	ModeAll  Mode = "all"  // denied and allowed flows (plus conntrack events)
)

// ParseMode parses off, deny or all.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeOff, ModeDeny, ModeAll:
		return m, nil
	}
	return "", fmt.Errorf("flow log mode %q: want off, deny or all", s)
}

// Set implements flag.Value.
func (m *Mode) Set(s string) error {
	v, err := ParseMode(s)
	if err != nil {
		return err
	}
	*m = v
	return nil
}

func (m Mode) String() string { return string(m) }

// Denies reports whether denied flows are logged; Allows whether allowed ones are.
func (m Mode) Denies() bool { return m == ModeDeny || m == ModeAll }

// Allows reports whether allowed flows are logged.
func (m Mode) Allows() bool { return m == ModeAll }

// Config configures an Aggregator.
type Config struct {
	Mode Mode
	// Group is the NFLOG group the rules log to.
	Group uint16
	// Interval is how often flows are turned into records.
	Interval time.Duration
	// MaxFlows bounds the flows tracked at once; a new flow beyond it is
	// not logged (FlowsDropped counts it).
	MaxFlows int
	// MaxRecords bounds the records kept for GET /flows; the oldest go
	// first (RecordsEvicted counts them).
	MaxRecords int
	// Idle is how long an allowed flow with no conntrack event is kept.
	Idle time.Duration
}

// Default is off (docs/flows.md says why), group 1700, 1 s intervals, 16384 flows, 65536
// records, 5 min idle.
func Default() Config {
	return Config{Mode: ModeOff, Group: 1700, Interval: time.Second, MaxFlows: 16384, MaxRecords: 65536, Idle: 5 * time.Minute}
}

// Validate reports every problem.
func (c Config) Validate() error {
	var errs []error
	if _, err := ParseMode(string(c.Mode)); err != nil {
		errs = append(errs, err)
	}
	if c.Group == 0 {
		errs = append(errs, errors.New("flow log group: must be 1-65535"))
	}
	if c.Interval < 100*time.Millisecond || c.Interval > time.Minute {
		errs = append(errs, fmt.Errorf("flow log interval %v: must be between 100ms and 1m", c.Interval))
	}
	if c.MaxFlows < 1 || c.MaxFlows > 1<<22 {
		errs = append(errs, fmt.Errorf("flow log max flows %d: must be between 1 and %d", c.MaxFlows, 1<<22))
	}
	if c.MaxRecords < 1 || c.MaxRecords > 1<<22 {
		errs = append(errs, fmt.Errorf("flow log max records %d: must be between 1 and %d", c.MaxRecords, 1<<22))
	}
	if c.Idle <= 0 {
		errs = append(errs, fmt.Errorf("flow log idle %v: must be positive", c.Idle))
	}
	return errors.Join(errs...)
}
