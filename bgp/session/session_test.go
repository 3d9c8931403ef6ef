package session

import (
	"encoding/json"
	"testing"
)

func TestStateNames(t *testing.T) {
	for s := Idle; s <= Established; s++ {
		b, err := s.MarshalText()
		if err != nil {
			t.Fatalf("%d: %v", s, err)
		}
		var back State
		if err := back.UnmarshalText(b); err != nil || back != s {
			t.Errorf("%q parses as %v, %v; want %v", b, back, err, s)
		}
		if got, ok := Parse(s.String()); !ok || got != s {
			t.Errorf("Parse(%q) = %v, %v", s, got, ok)
		}
	}
	if Established.String() != "Established" || Idle.String() != "Idle" || OpenConfirm.String() != "OpenConfirm" {
		t.Errorf("names changed: the status API and tabbyctl show them")
	}
	if _, ok := Parse("established"); ok {
		t.Error("Parse accepted a name of the wrong case")
	}
	if State(42).String() != "State(42)" {
		t.Errorf("State(42) = %q", State(42))
	}
	out, err := json.Marshal(map[string]State{"s": OpenSent})
	if err != nil || string(out) != `{"s":"OpenSent"}` {
		t.Errorf("JSON %s, %v", out, err)
	}
	if !OpenSent.Opening() || !OpenConfirm.Opening() || Established.Opening() || Active.Opening() {
		t.Error("Opening is wrong")
	}
}
