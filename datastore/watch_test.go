package datastore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/internal/testkit"
)

// next returns the next event, failing the test after a deadline.
func next(t *testing.T, ch <-chan datastore.Event) datastore.Event {
	t.Helper()
	select {
	case e, ok := <-ch:
		if !ok {
			t.Fatal("watch channel closed")
		}
		return e
	case <-time.After(15 * time.Second):
		t.Fatal("no watch event within 15s")
	}
	panic("unreachable")
}

// mirror is what a watcher knows: key → value.
type mirror map[string]string

func (m mirror) apply(e datastore.Event) {
	switch e.Type {
	case datastore.EventPut:
		m[e.KV.Key] = string(e.KV.Value)
	case datastore.EventDelete:
		delete(m, e.KV.Key)
	case datastore.EventResync:
		clear(m)
		for _, kv := range e.Snapshot {
			m[kv.Key] = string(kv.Value)
		}
	}
}

// waitMirror applies events until m equals the store's state under prefix.
func waitMirror(t *testing.T, s *datastore.Store, ch <-chan datastore.Event, m mirror, prefix string) []datastore.Event {
	t.Helper()
	want := mirror{}
	kvs, rev, err := s.ListKV(context.Background(), prefix)
	if err != nil {
		t.Fatalf("ListKV: %v", err)
	}
	for _, kv := range kvs {
		want[kv.Key] = string(kv.Value)
	}
	var seen []datastore.Event
	for last := int64(0); last < rev; {
		e := next(t, ch)
		seen = append(seen, e)
		m.apply(e)
		last = e.Revision
	}
	if diff := cmp.Diff(want, m); diff != "" {
		t.Fatalf("watcher state (-store +watcher):\n%s", diff)
	}
	return seen
}

func TestWatchOrderAndTypes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s := storetest.New(t)
	if _, err := s.PutKV(ctx, "w/before", []byte("0"), 0); err != nil {
		t.Fatal(err)
	}
	ch := s.Watch(ctx, "w/", 0)
	first := next(t, ch)
	if first.Type != datastore.EventResync || len(first.Snapshot) != 1 || first.Snapshot[0].Key != "w/before" {
		t.Fatalf("first event = %+v, want a resync holding w/before", first)
	}

	rev1, err := s.CreateKV(ctx, "w/a", []byte("1"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutKV(ctx, "other/x", []byte("ignored"), 0); err != nil {
		t.Fatal(err)
	}
	rev2, err := s.UpdateKV(ctx, "w/a", []byte("2"), rev1)
	if err != nil {
		t.Fatal(err)
	}
	rev3, err := s.Txn(ctx, nil, []datastore.Op{{Key: "w/b", Value: []byte("b")}, {Key: "w/before", Delete: true}})
	if err != nil {
		t.Fatal(err)
	}

	type ev struct {
		Type  datastore.EventType
		Key   string
		Value string
		Prev  string
		Rev   int64
	}
	want := []ev{
		{datastore.EventPut, "w/a", "1", "", rev1},
		{datastore.EventPut, "w/a", "2", "1", rev2},
		{datastore.EventPut, "w/b", "b", "", rev3},
		{datastore.EventDelete, "w/before", "", "0", rev3},
	}
	var got []ev
	for range want {
		e := next(t, ch)
		g := ev{e.Type, e.KV.Key, string(e.KV.Value), "", e.Revision}
		if e.PrevKV != nil {
			g.Prev = string(e.PrevKV.Value)
		}
		got = append(got, g)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}

	// A watch from a past revision replays from there.
	replay := s.Watch(ctx, "w/", rev2)
	if e := next(t, replay); e.Type != datastore.EventPut || e.Revision != rev2 {
		t.Errorf("replay from %d starts with %+v", rev2, e)
	}

	cancel()
	for range ch {
	}
	for range replay {
	}
}

// TestWatchAcrossCompaction starts a watch from a revision that a compaction
// has removed: the watcher resyncs with the full state and loses nothing.
func TestWatchAcrossCompaction(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := storetest.New(t)
	start, err := s.PutKV(ctx, "c/0", []byte("v0"), 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 20; i++ {
		if _, err := s.PutKV(ctx, fmt.Sprintf("c/%d", i%7), fmt.Appendf(nil, "v%d", i), 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteKV(ctx, "c/3", 0); err != nil {
		t.Fatal(err)
	}
	_, rev, err := s.ListKV(ctx, "c/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client().Compact(ctx, rev); err != nil {
		t.Fatalf("compacting: %v", err)
	}

	ch := s.Watch(ctx, "c/", start+1)
	m := mirror{"c/0": "v0"} // what the watcher knew at start
	seen := waitMirror(t, s, ch, m, "c/")
	if len(seen) != 1 || seen[0].Type != datastore.EventResync || seen[0].Revision != rev {
		t.Errorf("events after compaction = %+v, want one resync at %d", seen, rev)
	}
	// The watch continues after the resync.
	if _, err := s.PutKV(ctx, "c/new", []byte("n"), 0); err != nil {
		t.Fatal(err)
	}
	seen = waitMirror(t, s, ch, m, "c/")
	if len(seen) != 1 || seen[0].Type != datastore.EventPut {
		t.Errorf("events after resync = %+v, want one put", seen)
	}
}

// TestWatchAndCallsSurviveRestart stops etcd under a store and a watch, and
// starts it again on the same ports and data.
func TestWatchAndCallsSurviveRestart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, e := storetest.NewWithEtcd(t)
	writer := storetest.Connect(t, e)
	ch := s.Watch(ctx, "r/", 0)
	m := mirror{}
	m.apply(next(t, ch))
	if _, err := writer.PutKV(ctx, "r/a", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	waitMirror(t, s, ch, m, "r/")

	t0 := time.Now()
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("stop took %v", time.Since(t0))
	shortCtx, shortCancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err := s.GetKV(shortCtx, "r/a")
	shortCancel()
	if err == nil {
		t.Fatal("GetKV with etcd stopped succeeded")
	}
	t0 = time.Now()
	if err := e.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	t.Logf("restart took %v", time.Since(t0))
	t0 = time.Now()
	// Calls work again once the client has reconnected.
	testkit.EventuallyEvery(t, 20*time.Second, 100*time.Millisecond, "PutKV after restart", func() error {
		_, err := s.PutKV(ctx, "r/b", []byte("2"), 0)
		return err
	})
	t.Logf("reconnect took %v", time.Since(t0))
	if _, err := writer.PutKV(ctx, "r/a", []byte("3"), 0); err != nil {
		t.Fatalf("second client after restart: %v", err)
	}
	waitMirror(t, s, ch, m, "r/")
}

func TestWatchClosesWhenContextDone(t *testing.T) {
	s := storetest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	ch := s.Watch(ctx, "x/", 0)
	next(t, ch)
	cancel()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("watch channel still open 10s after cancel")
		}
	}
}

// TestWatchKeysRefusedTailReachesRevision: a response whose last events
// are of refused keys (a kept write, then refused ones, replayed in one
// response) still tells the receiver it reached the last of them, so that
// a view waiting for that revision does not wait for etcd's next progress
// notification (ten minutes). TestAddTakesLabelsAndAddressFromPodRecord
// hung so in CI.
func TestWatchKeysRefusedTailReachesRevision(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := storetest.New(t)
	keep := func(key []byte) bool { return string(key[:2]) == "k/" }
	rev1, err := s.PutKV(ctx, "k/a", []byte("1"), 0)
	if err != nil {
		t.Fatal(err)
	}
	var last int64
	for i := range 3 {
		if last, err = s.PutKV(ctx, fmt.Sprintf("r/%d", i), []byte("x"), 0); err != nil {
			t.Fatal(err)
		}
	}
	ch := s.WatchKeys(ctx, datastore.WatchSpec{Keep: keep}, rev1)
	if e := next(t, ch); e.Type != datastore.EventPut || e.KV.Key != "k/a" || e.Revision != rev1 {
		t.Fatalf("first event = %+v, want the put of k/a at %d", e, rev1)
	}
	if e := next(t, ch); e.Type != datastore.EventProgress || e.Revision != last {
		t.Fatalf("second event = %+v, want progress to %d (the refused writes)", e, last)
	}
}
