package testkit

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// DefaultInterval is how often Eventually calls its condition.
const DefaultInterval = 10 * time.Millisecond

// Eventually calls cond every DefaultInterval until it returns nil, and
// returns how long that took. When timeout passes first, it fails tb
// (FailNow) with what and cond's last error. Call it from the test's
// goroutine.
func Eventually(tb testing.TB, timeout time.Duration, what string, cond func() error) time.Duration {
	tb.Helper()
	return EventuallyEvery(tb, timeout, DefaultInterval, what, cond)
}

// EventuallyEvery is Eventually calling cond every interval, for a
// condition that is costly to evaluate (a command, a scrape).
func EventuallyEvery(tb testing.TB, timeout, interval time.Duration, what string, cond func() error) time.Duration {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	if err := Poll(ctx, interval, cond); err != nil {
		tb.Fatalf("%s: not within %v: %v", what, timeout, err)
	}
	return time.Since(start)
}

// Poll calls cond every interval until it returns nil (Poll returns nil)
// or ctx ends; then it returns ctx's error with cond's last error. cond is
// called at least once, also when ctx has already ended.
func Poll(ctx context.Context, interval time.Duration, cond func() error) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// Cond adapts a boolean condition for Eventually and Poll: its error is
// "not yet".
func Cond(ok func() bool) func() error {
	return func() error {
		if ok() {
			return nil
		}
		return errNotYet
	}
}

var errNotYet = errors.New("condition not met")
