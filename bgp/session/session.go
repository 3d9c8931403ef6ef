// Package session names the states of a BGP session (RFC 4271 §8.2.2).
//
// It imports nothing but the standard library, so that readers of the
// published status (tabbyctl, the lab) compare states by type without
// linking GoBGP; package bgp reports its sessions with these states.
package session

import "fmt"

// State is a BGP session's finite-state-machine state. The zero value is
// Idle. Its text form (String, MarshalText) is the name RFC 4271 uses,
// which is what the status API and tabbyctl show.
type State int

// Session states, in the order a session passes them on its way up.
const (
	Idle State = iota
	Connect
	Active
	OpenSent
	OpenConfirm
	Established
)

var names = [...]string{
	Idle:        "Idle",
	Connect:     "Connect",
	Active:      "Active",
	OpenSent:    "OpenSent",
	OpenConfirm: "OpenConfirm",
	Established: "Established",
}

// String returns the state's RFC 4271 name ("Established").
func (s State) String() string {
	if s < 0 || int(s) >= len(names) {
		return fmt.Sprintf("State(%d)", int(s))
	}
	return names[s]
}

// Opening reports whether the session has a connection and is exchanging
// OPENs (OpenSent or OpenConfirm): a healthy session passes these in
// milliseconds.
func (s State) Opening() bool { return s == OpenSent || s == OpenConfirm }

// Parse returns the state named name (as String writes it); ok is false
// for any other string.
func Parse(name string) (s State, ok bool) {
	for i, n := range names {
		if n == name {
			return State(i), true
		}
	}
	return Idle, false
}

// MarshalText implements encoding.TextMarshaler.
func (s State) MarshalText() ([]byte, error) {
	if s < 0 || int(s) >= len(names) {
		return nil, fmt.Errorf("unknown BGP session state %d", int(s))
	}
	return []byte(names[s]), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *State) UnmarshalText(b []byte) error {
	st, ok := Parse(string(b))
	if !ok {
		return fmt.Errorf("unknown BGP session state %q", b)
	}
	*s = st
	return nil
}
