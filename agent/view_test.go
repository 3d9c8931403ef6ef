package agent

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/syncer"
)

// staticSource is a cluster that never changes: one list, then silence.
type staticSource []datastore.KV

func (s staticSource) Watch(ctx context.Context, prefix string, fromRev int64) <-chan datastore.Event {
	ch := make(chan datastore.Event, 1)
	ch <- datastore.Event{Type: datastore.EventResync, Snapshot: s, Revision: 1}
	go func() { <-ctx.Done(); close(ch) }()
	return ch
}

// startView runs a view over src until the test ends and waits for its
// first sync.
func startView(t testing.TB, src syncer.Source) *syncer.Syncer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	v := syncer.New(src, testLogger())
	done := make(chan struct{})
	go func() { defer close(done); _ = v.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := v.WaitSynced(wctx); err != nil {
		t.Fatalf("cluster view never synced: %v", err)
	}
	return v
}

// mustRev returns a stored object's revision.
func mustRev(t testing.TB, obj api.Object) int64 {
	t.Helper()
	rev, err := strconv.ParseInt(obj.GetMeta().ResourceVersion, 10, 64)
	if err != nil {
		t.Fatalf("resourceVersion %q: %v", obj.GetMeta().ResourceVersion, err)
	}
	return rev
}
