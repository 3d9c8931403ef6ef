package main

import (
	"io"
	"log/slog"
	"runtime"
	"testing"
)

func TestSetMaxProcs(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	before := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(before)
	if err := setMaxProcs(log, 0); err != nil || runtime.GOMAXPROCS(0) != before {
		t.Errorf("0: err %v, GOMAXPROCS %d; want nil and the runtime's %d", err, runtime.GOMAXPROCS(0), before)
	}
	if err := setMaxProcs(log, 1); err != nil || runtime.GOMAXPROCS(0) != 1 {
		t.Errorf("1: err %v, GOMAXPROCS %d; want nil and 1", err, runtime.GOMAXPROCS(0))
	}
	if err := setMaxProcs(log, -1); err == nil || runtime.GOMAXPROCS(0) != 1 {
		t.Errorf("-1: err %v, GOMAXPROCS %d; want an error and no change", err, runtime.GOMAXPROCS(0))
	}
}
