package syncer_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/syncer"
	"github.com/tabbynet/tabby/syncer/syncertest"
)

// partsSource is a scripted watch of several parts, as the datastore's
// is: events carry Reached, and progress requests are counted.
type partsSource struct {
	syncertest.Script
	asks atomic.Int32
}

func (s *partsSource) RequestWatchProgress(context.Context) error {
	s.asks.Add(1)
	return nil
}

// waitAsync runs wait in a goroutine; the channel gets its error.
func waitAsync(wait func(context.Context) error) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- wait(ctx)
	}()
	return done
}

func notYet(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s: the wait ended (%v)", what, err)
	case <-time.After(50 * time.Millisecond):
	}
}

func ended(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: still waiting", what)
	}
}

// WaitHeld returns once the view has reached since and holds the key's
// write at rev, before the view as a whole reaches rev (which would take a
// progress report); it asks for one only while short of since.
func TestWaitHeld(t *testing.T) {
	src := &partsSource{Script: make(syncertest.Script, 1)}
	src.Script <- datastore.Event{Type: datastore.EventResync, Revision: 10, Reached: 10}
	v := syncertest.Start(t, src, nil, true)
	key, err := datastore.ResourceKey(api.KindWorkloadEndpoint, "default", "pa")
	if err != nil {
		t.Fatal(err)
	}
	val, err := json.Marshal(wep("a", "pa", "10.244.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	put := func(k string, rev, reached int64) {
		src.Script <- datastore.Event{Type: datastore.EventPut, KV: datastore.KV{Key: k, Value: val, ModRevision: rev}, Revision: rev, Reached: reached}
	}

	// Short of since: it asks for progress at once, and the key's write
	// alone does not end the wait.
	done := waitAsync(func(ctx context.Context) error { return v.WaitHeld(ctx, 12, key, 15) })
	put(key, 15, 10)
	notYet(t, done, "the key at 15, the view at 10 (since 12)")
	if src.asks.Load() == 0 {
		t.Error("no progress request while the view was short of since")
	}
	src.Script <- datastore.Event{Type: datastore.EventProgress, Revision: 12, Reached: 12}
	ended(t, done, "the key at 15, the view at 12")
	if got := v.Revision(); got != 12 {
		t.Fatalf("view at %d, want 12", got)
	}

	// Since reached and the key held: at once, without asking.
	asks := src.asks.Load()
	ended(t, waitAsync(func(ctx context.Context) error { return v.WaitHeld(ctx, 12, key, 15) }), "the key already held")
	if got := src.asks.Load(); got != asks {
		t.Errorf("%d progress requests for a wait that was already over", got-asks)
	}

	// The key held at an older write: the wait goes on until its write at
	// rev arrives.
	done = waitAsync(func(ctx context.Context) error { return v.WaitHeld(ctx, 12, key, 17) })
	notYet(t, done, "the key at 15, waited for at 17")
	put(key, 17, 12)
	ended(t, done, "the key at 17")

	// A key whose write never shows (deleted before its event came): the
	// view reaching rev ends the wait, and the wait asks for it.
	other, _ := datastore.ResourceKey(api.KindWorkloadEndpoint, "default", "gone")
	asks = src.asks.Load()
	done = waitAsync(func(ctx context.Context) error { return v.WaitHeld(ctx, 12, other, 20) })
	notYet(t, done, "a key not in the view")
	deadline := time.Now().Add(5 * time.Second)
	for src.asks.Load() == asks && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if src.asks.Load() == asks {
		t.Error("a wait for a key that never came did not ask for progress")
	}
	src.Script <- datastore.Event{Type: datastore.EventProgress, Revision: 20, Reached: 20}
	ended(t, done, "the view at 20")
}

var _ syncer.Source = (*partsSource)(nil)
