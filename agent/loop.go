package agent

import (
	"context"
	"log/slog"
	"time"
)

// coalesceWindow is how long a loop waits after being woken before its
// pass, so that the writes of one operation (a pod's block claim and its
// endpoint) become one pass. It is short: a new block's advertisement waits
// for it.
const coalesceWindow = 5 * time.Millisecond

// loop is one owner's reconcile loop: a pass whenever woken, at least every
// resync interval, and again with backoff after a failed pass.
type loop struct {
	name  string
	every time.Duration
	// wake holds the channels that signal work (a view subscription, the
	// owner's own kick); a nil channel is never ready.
	wake [2]<-chan struct{}
	pass func(context.Context) error
	// full, when set, is the periodic pass instead of pass (one that also
	// repairs what the kernel lost behind the owner's back).
	full    func(context.Context) error
	observe func(loop string, d time.Duration, err error)
	log     *slog.Logger
}

func kick(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func drain(ch <-chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

// run blocks until ctx ends.
func (l loop) run(ctx context.Context) {
	t := time.NewTicker(l.every)
	defer t.Stop()
	failures := 0
	var retry <-chan time.Time
	for {
		periodic := false
		select {
		case <-ctx.Done():
			return
		case <-l.wake[0]:
			l.coalesce(ctx)
		case <-l.wake[1]:
			l.coalesce(ctx)
		case <-t.C:
			periodic = true
		case <-retry:
		}
		if ctx.Err() != nil {
			return
		}
		retry = nil
		pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		start := time.Now()
		pass := l.pass
		if periodic && l.full != nil {
			pass = l.full
		}
		err := pass(pctx)
		cancel()
		if l.observe != nil {
			l.observe(l.name, time.Since(start), err)
		}
		if err != nil && ctx.Err() == nil {
			failures++
			l.log.Warn("reconcile pass failed", "loop", l.name, "failures", failures, "err", err)
			retry = time.After(backoff(failures))
			continue
		}
		failures = 0
	}
}

func (l loop) coalesce(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(coalesceWindow):
	}
	for _, ch := range l.wake {
		if ch != nil {
			drain(ch)
		}
	}
}

func backoff(attempt int) time.Duration {
	d := 250 * time.Millisecond << min(attempt, 4)
	return min(d, 3*time.Second)
}
