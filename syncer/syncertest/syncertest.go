// Package syncertest drives a cluster view in tests: a scripted source of
// watch events and a helper that runs a view until the test ends.
package syncertest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/syncer"
)

// Script is a Source whose events the test sends one at a time; the first
// should be an EventResync (the initial list).
type Script chan datastore.Event

// WatchKeysFunc implements syncer.Source: each event the test sends is
// one watch response.
func (s Script) WatchKeysFunc(ctx context.Context, _ datastore.WatchSpec, fromRev int64, fn func([]datastore.Event)) {
	for {
		select {
		case ev := <-s:
			fn([]datastore.Event{ev})
		case <-ctx.Done():
			return
		}
	}
}

// Static is a cluster that never changes: one list, then silence.
type Static []datastore.KV

// WatchKeysFunc implements syncer.Source.
func (s Static) WatchKeysFunc(ctx context.Context, _ datastore.WatchSpec, fromRev int64, fn func([]datastore.Event)) {
	fn([]datastore.Event{{Type: datastore.EventResync, Snapshot: s, Revision: 1}})
	<-ctx.Done()
}

// Start runs a view over src until the test ends. With wait it returns
// once the view has synced (the source must send its list on its own);
// without, the caller sends the list (a Script) and waits itself.
func Start(tb testing.TB, src syncer.Source, log *slog.Logger, wait bool) *syncer.Syncer {
	tb.Helper()
	ctx, cancel := context.WithCancel(tb.Context())
	v := syncer.New(src, log)
	done := make(chan struct{})
	go func() { defer close(done); _ = v.Run(ctx) }()
	tb.Cleanup(func() { cancel(); <-done })
	if !wait {
		return v
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := v.WaitSynced(wctx); err != nil {
		tb.Fatalf("cluster view never synced: %v", err)
	}
	return v
}
