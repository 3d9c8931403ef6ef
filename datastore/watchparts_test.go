package datastore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
)

// untilReached applies events to m until one says every part reached rev,
// and returns the keys of the puts and deletes seen on the way.
func untilReached(t *testing.T, ch <-chan datastore.Event, m mirror, rev int64) []string {
	t.Helper()
	var keys []string
	for {
		e := next(t, ch)
		if e.Reached == 0 {
			t.Fatalf("event %+v without Reached from a watch with Skip", e)
		}
		m.apply(e)
		if e.Type == datastore.EventPut || e.Type == datastore.EventDelete {
			keys = append(keys, e.KV.Key)
		}
		if e.Reached >= rev {
			return keys
		}
	}
}

// TestWatchKeysSkip: the skipped range is never delivered, writes in both
// parts are, in one transaction too, and Reached gets to every write's
// revision (a lagging part is moved by a progress report), also after a
// compaction forced a re-list.
func TestWatchKeysSkip(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := storetest.New(t)
	put := func(key string) int64 {
		t.Helper()
		rev, err := s.PutKV(ctx, key, []byte(key), 0)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	put("a/1")
	put("b/1")
	start := put("c/1")
	spec := datastore.WatchSpec{Skip: []datastore.KeyRange{{From: "b/", To: "c/"}}}
	ch := s.WatchKeys(ctx, spec, 0)
	m := mirror{}
	if e := next(t, ch); e.Type != datastore.EventResync || e.Reached != start || len(e.Snapshot) != 2 {
		t.Fatalf("first event %+v, want a resync of a/1 and c/1 reached at %d", e, start)
	} else {
		m.apply(e)
	}

	// A write in the skipped range, then one in the first part: the second
	// part lags until etcd reports progress (asked for here, or by the
	// watch itself).
	put("b/2")
	rev := put("a/2")
	if err := s.RequestWatchProgress(ctx); err != nil {
		t.Fatal(err)
	}
	if got := untilReached(t, ch, m, rev); fmt.Sprint(got) != "[a/2]" {
		t.Errorf("keys delivered = %v, want [a/2]", got)
	}
	rev, err := s.Txn(ctx, nil, []datastore.Op{{Key: "a/3", Value: []byte("x")}, {Key: "b/3", Value: []byte("x")}, {Key: "c/3", Value: []byte("x")}})
	if err != nil {
		t.Fatal(err)
	}
	if got := untilReached(t, ch, m, rev); len(got) != 2 || m["a/3"] != "x" || m["c/3"] != "x" {
		t.Errorf("keys delivered = %v, want a/3 and c/3", got)
	}
	if _, ok := m["b/3"]; ok {
		t.Error("a skipped key was delivered")
	}

	// From a compacted revision: one re-list without the skipped keys.
	if _, err := s.Client().Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	ch2 := s.WatchKeys(ctx, spec, start)
	e := next(t, ch2)
	if e.Type != datastore.EventResync || e.Reached != rev {
		t.Fatalf("first event from a compacted revision %+v, want a resync reached at %d", e, rev)
	}
	for _, kv := range e.Snapshot {
		if kv.Key[0] == 'b' {
			t.Errorf("resync holds skipped key %s", kv.Key)
		}
	}
	if len(e.Snapshot) != 5 {
		t.Errorf("resync holds %d keys, want a/1 a/2 a/3 c/1 c/3", len(e.Snapshot))
	}
}

// TestWatchKeysSkipProgressReachesEveryWatch: two watches with Skip on
// one Store (an agent's view and tabby-kube-controllers' in one test
// process), and writes only in the skipped range: no part of either watch
// receives an event, so only a progress report moves them, and
// RequestWatchProgress must ask the stream of each. It asked only the
// last one opened, and a view waiting for a revision waited forever.
func TestWatchKeysSkipProgressReachesEveryWatch(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := storetest.New(t)
	if _, err := s.PutKV(ctx, "a/1", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	spec := datastore.WatchSpec{Skip: []datastore.KeyRange{{From: "b/", To: "c/"}}}
	var chs []<-chan datastore.Event
	for range 2 {
		ch := s.WatchKeys(ctx, spec, 0)
		if e := next(t, ch); e.Type != datastore.EventResync {
			t.Fatalf("first event %+v, want a resync", e)
		}
		chs = append(chs, ch)
	}
	// Both streams are open once a write to a watched part reaches both.
	rev, err := s.PutKV(ctx, "a/2", []byte("x"), 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chs {
		untilReached(t, ch, mirror{}, rev)
	}
	if rev, err = s.PutKV(ctx, "b/1", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	for i, ch := range chs {
		// Asked again while waiting, as the view does: a request that
		// came before etcd's watchers were in step goes unanswered.
		done := make(chan struct{})
		stopAsking := sync.OnceFunc(func() { close(done) })
		defer stopAsking() // also when next fails the test
		go func() {
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				_ = s.RequestWatchProgress(ctx)
				select {
				case <-done:
					return
				case <-tick.C:
				}
			}
		}()
		e := next(t, ch)
		stopAsking()
		if e.Type != datastore.EventProgress || e.Reached != rev {
			t.Errorf("watch %d: event %+v, want progress reached at %d", i, e, rev)
		}
	}
}

// TestWatchKeysSkipCatchesUpUnderChurn: while writes keep coming to one
// part, the quiet part is moved by the watch's own progress requests
// (nobody else asks), so Reached follows the writes within
// progressMaxLag, not only once they stop.
func TestWatchKeysSkipCatchesUpUnderChurn(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := storetest.New(t)
	if _, err := s.PutKV(ctx, "c/1", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	spec := datastore.WatchSpec{Skip: []datastore.KeyRange{{From: "b/", To: "c/"}}}
	ch := s.WatchKeys(ctx, spec, 0)
	m := mirror{}
	m.apply(next(t, ch))
	// Writes every 50 ms to part a/ only, until an event says a write of
	// this loop was reached by every part.
	var first int64
	for i := 0; ; i++ {
		rev, err := s.PutKV(ctx, fmt.Sprintf("a/%d", i), []byte("x"), 0)
		if err != nil {
			t.Fatal(err)
		}
		if first == 0 {
			first = rev
		}
		deadline := time.After(50 * time.Millisecond)
	drain:
		for {
			select {
			case e := <-ch:
				if e.Reached >= first {
					return
				}
			case <-deadline:
				break drain
			}
		}
		if i > 200 { // 10 s: five times progressMaxLag
			t.Fatalf("the quiet part never caught up under churn (first write at %d)", first)
		}
	}
}

// TestWatchKeysSkipWithAuth: the parts' own watch stream carries the
// client's credentials (etcd with auth on refuses a watch without them).
func TestWatchKeysSkipWithAuth(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := storetest.Etcd(t)
	admin := storetest.Connect(t, e)
	cli := admin.Client()
	for _, step := range []func() error{
		func() error { _, err := cli.RoleAdd(ctx, "root"); return err },
		func() error { _, err := cli.UserAdd(ctx, "root", "pw"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatalf("enabling etcd auth: %v", err)
		}
	}
	s := storetest.Connect(t, e, func(c *datastore.Config) { c.Username, c.Password = "root", "pw" })
	ch := s.WatchKeys(ctx, datastore.WatchSpec{Skip: []datastore.KeyRange{{From: "b/", To: "c/"}}}, 0)
	m := mirror{}
	m.apply(next(t, ch))
	rev, err := s.PutKV(ctx, "c/1", []byte("x"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := untilReached(t, ch, m, rev); fmt.Sprint(got) != "[c/1]" {
		t.Errorf("keys delivered = %v, want [c/1]", got)
	}
}
