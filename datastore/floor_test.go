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

// TestFloorWatch: the bare watch counts the events of the watched parts
// only (not a skipped range's, nor keys past End) and ends with ctx.
func TestFloorWatch(t *testing.T) {
	for _, mode := range []datastore.FloorMode{datastore.FloorClient, datastore.FloorStream} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) { testFloorWatch(t, mode) })
	}
}

func testFloorWatch(t *testing.T, mode datastore.FloorMode) {
	s := storetest.New(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	put := func(key string) int64 {
		t.Helper()
		rev, err := s.PutKV(ctx, key, []byte(key), 0)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	start := put("a/0") + 1
	var (
		mu     sync.Mutex
		events int
		atLast int // responses at the last revision: one per part once each delivered everything
		last   int64
	)
	done := make(chan error, 1)
	spec := datastore.WatchSpec{End: "d/", Skip: []datastore.KeyRange{{From: "b/", To: "c/"}}}
	go func() {
		done <- s.FloorWatch(ctx, spec, start, mode, func(n int, r int64) {
			mu.Lock()
			defer mu.Unlock()
			events += n
			if r == last {
				atLast++
			}
		})
	}()
	put("a/1")
	put("b/1") // skipped
	put("c/1")
	put("d/1") // past End
	if err := s.DeleteKV(ctx, "a/1", 0); err != nil {
		t.Fatal(err)
	}
	// The last write touches both parts: once each part's watch delivered
	// it, it delivered everything before it.
	// (Held while the write's revision is recorded, so that no response is
	// counted against the revision before it.)
	mu.Lock()
	rev, err := s.Txn(ctx, nil, []datastore.Op{{Key: "a/9", Value: []byte("x")}, {Key: "c/9", Value: []byte("x")}})
	last = rev
	mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n, k := events, atLast
		mu.Unlock()
		if k == 2 {
			if n != 5 {
				t.Errorf("counted %d events, want 5 (a/1 put and deleted, c/1, a/9, c/9)", n)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("floor watch: %d parts reached revision %d (%d events), want 2", k, last, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != context.Canceled {
			t.Errorf("FloorWatch returned %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("FloorWatch did not return after ctx ended")
	}
}
