package main

import (
	"io"
	"log/slog"
	"runtime/debug"
	"testing"
)

func TestSetGCPercent(t *testing.T) {
	env := func(vals map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := vals[k]; return v, ok }
	}
	cases := []struct {
		name string
		env  map[string]string
		want int // the percent in force afterwards; -2: unchanged
	}{
		{"unset: the agent's default", map[string]string{}, defaultGCPercent},
		{"GOGC set: left to the runtime", map[string]string{"GOGC": "100"}, -2},
		{"GOGC off: left to the runtime", map[string]string{"GOGC": "off"}, -2},
		{"GOGC empty but set: left to the runtime", map[string]string{"GOGC": ""}, -2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			const before = 77 // a value neither side uses
			prev := debug.SetGCPercent(before)
			defer debug.SetGCPercent(prev)
			reads := 0
			lookup := func(k string) (string, bool) { reads++; return env(c.env)(k) }
			setGCPercent(slog.New(slog.NewTextHandler(io.Discard, nil)), lookup)
			if reads != 1 {
				t.Errorf("setGCPercent read the environment %d times, want once", reads)
			}
			got := debug.SetGCPercent(before)
			want := c.want
			if want == -2 {
				want = before
			}
			if got != want {
				t.Errorf("GC percent after setGCPercent = %d, want %d", got, want)
			}
		})
	}
}
