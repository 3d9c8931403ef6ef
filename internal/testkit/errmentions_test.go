package testkit

import (
	"errors"
	"runtime"
	"testing"
)

// recorder is a testing.TB that records failures instead of failing.
type recorder struct {
	testing.TB
	failed, fatal bool
}

func (r *recorder) Helper()               {}
func (r *recorder) Errorf(string, ...any) { r.failed = true }

// Fatalf stops the calling goroutine, as testing.T's does.
func (r *recorder) Fatalf(string, ...any) { r.failed, r.fatal = true, true; runtime.Goexit() }

func TestErrMentions(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want []string
		fail bool
	}{
		{"nil wanted and got", nil, nil, false},
		{"nil wanted, error got", errors.New("x"), nil, true},
		{"error wanted, nil got", nil, []string{"x"}, true},
		{"every string mentioned", errors.New("pods: -1; runs: 101"), []string{"pods: -1", "runs: 101"}, false},
		{"one string missing", errors.New("pods: -1"), []string{"pods: -1", "runs: 101"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &recorder{TB: t}
			done := make(chan struct{})
			go func() { defer close(done); ErrMentions(r, "Validate()", tt.err, tt.want) }()
			<-done
			if r.failed != tt.fail {
				t.Errorf("failed = %v, want %v", r.failed, tt.fail)
			}
		})
	}
}
