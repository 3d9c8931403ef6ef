package datastore_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/relay"
	"github.com/tabbynet/tabby/datastore/storetest"
)

// serveRelay serves a watch relay in front of s's etcd on addr ("": a free
// port) until stop is called, and returns its URL.
func serveRelay(t *testing.T, s *datastore.Store, addr string, window time.Duration) (string, func()) {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(relay.ServerOptions()...)
	relay.New(s.Client(), datastore.DefaultPrefix, window, nil).Register(srv)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return "http://" + l.Addr().String(), srv.Stop
}

// A watch with WatchSpec.Skip through a relay: the relay's merged
// responses carry events of several revisions, which the watch delivers in
// order with Reached at the last; a progress request (WaitRevision's) gets
// what the relay holds at once; when the relay goes the watch watches
// again, through the next one.
func TestWatchKeysSkipThroughRelay(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := storetest.Etcd(t)
	w := storetest.Connect(t, e)                 // the writer, and the relay's client
	url, stop := serveRelay(t, w, "", time.Hour) // after the first event, nothing leaves but by a flush
	s := storetest.Connect(t, e, func(c *datastore.Config) { c.WatchEndpoints = []string{url} })
	put := func(key string) int64 {
		t.Helper()
		rev, err := w.PutKV(ctx, key, []byte(key), 0)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	start := put("c/1")
	ch := s.WatchKeys(ctx, datastore.WatchSpec{Skip: []datastore.KeyRange{{From: "b/", To: "c/"}}}, 0)
	m := mirror{}
	if e := next(t, ch); e.Type != datastore.EventResync || e.Reached != start {
		t.Fatalf("first event %+v, want a resync reached at %d", e, start)
	} else {
		m.apply(e)
	}
	// a/1 goes at once (the first event: an hour's window begins); the
	// rest are held by the relay until asked.
	put("a/1")
	put("a/2")
	put("b/1")
	put("a/3")
	rev := put("c/2")
	// Each part's events in their order; etcd orders the responses of two
	// watches of one stream as each watch catches up (a watch still
	// replaying from its start revision sends later than one that is in
	// step), so c/2 may come before the a/ keys.
	if got := untilReachedAsking(t, s, ch, m, rev); fmt.Sprint(part(got, "a/")) != "[a/1 a/2 a/3]" || fmt.Sprint(part(got, "c/")) != "[c/2]" {
		t.Errorf("keys delivered = %v, want a/1 a/2 a/3 in order and c/2", got)
	}

	// The relay goes; the watch watches again through the next one on
	// the same address (no batching).
	stop()
	addr := url[len("http://"):]
	put("a/4")
	serveRelay(t, w, addr, -1)
	rev = put("a/5")
	if got := untilReachedAsking(t, s, ch, m, rev); fmt.Sprint(got) != "[a/4 a/5]" {
		t.Errorf("after the relay came back, keys delivered = %v, want [a/4 a/5]", got)
	}
	for _, k := range []string{"a/1", "a/2", "a/3", "a/4", "a/5", "c/2"} {
		if m[k] != k {
			t.Errorf("%s = %q in the mirror, want %q", k, m[k], k)
		}
	}
}

// untilReachedAsking is untilReached asking for progress (as WaitRevision
// does) now and every half second: the watch's stream may not be open yet.
func untilReachedAsking(t *testing.T, s *datastore.Store, ch <-chan datastore.Event, m mirror, rev int64) []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			_ = s.RequestWatchProgress(ctx)
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	return untilReached(t, ch, m, rev)
}

// part is the keys of keys under prefix, in their order.
func part(keys []string, prefix string) []string {
	var out []string
	for _, k := range keys {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	return out
}
