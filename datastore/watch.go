package datastore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// EventType says what an Event is.
type EventType int

// Event types.
const (
	// EventPut: KV was created or updated; PrevKV holds the previous value
	// of an update when etcd still had it.
	EventPut EventType = iota + 1
	// EventDelete: KV.Key was deleted at Revision; PrevKV holds the deleted
	// value when etcd still had it.
	EventDelete
	// EventResync: Snapshot holds every key under the prefix at Revision,
	// replacing whatever the receiver knew; events after it continue from
	// Revision+1.
	EventResync
)

// String returns "put", "delete" or "resync".
func (t EventType) String() string {
	switch t {
	case EventPut:
		return "put"
	case EventDelete:
		return "delete"
	case EventResync:
		return "resync"
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// Event is one change under a watched prefix.
type Event struct {
	Type     EventType
	KV       KV  // EventPut, EventDelete (Value empty for a delete)
	PrevKV   *KV // EventPut (nil for a create), EventDelete
	Snapshot []KV
	Revision int64
}

// Backoff between watch or re-list attempts while etcd is unreachable.
const (
	watchBackoffMin = 100 * time.Millisecond
	watchBackoffMax = 3 * time.Second
)

// errGap means events may have been missed and the watcher must re-list.
var errGap = errors.New("watch gap")

// Watch streams the changes below prefix (a plain string prefix, as in
// ListKV) in revision order.
//
// fromRev > 0 starts with the events at revision fromRev (so pass the
// revision of a ListKV plus one); fromRev <= 0 starts with an EventResync
// holding the current state. Whenever events may have been lost — fromRev
// or a reconnect point has been compacted, or etcd's revision went back —
// the watch re-lists and sends one EventResync with the full state, then
// continues after it. Disconnections and leader loss are retried with
// backoff for as long as ctx lives. The channel is closed when ctx is done
// (or the Store is closed).
func (s *Store) Watch(ctx context.Context, prefix string, fromRev int64) <-chan Event {
	out := make(chan Event, 16)
	w := &watcher{s: s, prefix: prefix, out: out, next: fromRev}
	go w.run(ctx)
	return out
}

type watcher struct {
	s      *Store
	prefix string
	out    chan<- Event
	next   int64 // first revision not yet delivered
}

func (w *watcher) run(ctx context.Context) {
	defer close(w.out)
	if w.next <= 0 && !w.resync(ctx) {
		return
	}
	b := backoff{d: watchBackoffMin}
	for ctx.Err() == nil && w.s.client.Ctx().Err() == nil {
		err := w.watchOnce(ctx, &b)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errGap) {
			w.s.log.Info("etcd watch resyncing", "prefix", w.prefix, "reason", err)
			if !w.resync(ctx) {
				return
			}
			continue
		}
		w.s.log.Debug("etcd watch interrupted, retrying", "prefix", w.prefix, "next", w.next, "err", err)
		if !b.wait(ctx) {
			return
		}
	}
}

// watchOnce runs one etcd watch from w.next until it fails.
func (w *watcher) watchOnce(ctx context.Context, b *backoff) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := w.s.client.Watch(wctx, w.s.abs(w.prefix),
		clientv3.WithPrefix(), clientv3.WithRev(w.next), clientv3.WithPrevKV(),
		clientv3.WithCreatedNotify(), clientv3.WithProgressNotify())
	for resp := range wch {
		if resp.CompactRevision != 0 {
			return fmt.Errorf("%w: revision %d compacted (up to %d)", errGap, w.next, resp.CompactRevision)
		}
		if err := resp.Err(); err != nil {
			return w.s.etcdErr(fmt.Sprintf("watching %s", w.prefix), err)
		}
		if resp.Created {
			b.reset()
			if resp.Header.Revision < w.next-1 {
				return fmt.Errorf("%w: etcd revision %d is behind %d", errGap, resp.Header.Revision, w.next-1)
			}
			continue
		}
		for _, ev := range resp.Events {
			if !w.send(ctx, w.event(ev)) {
				return ctx.Err()
			}
			w.next = ev.Kv.ModRevision + 1
		}
		if resp.IsProgressNotify() && resp.Header.Revision >= w.next {
			w.next = resp.Header.Revision + 1
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return w.s.etcdErr(fmt.Sprintf("watching %s", w.prefix), errors.New("watch closed"))
}

func (w *watcher) event(ev *clientv3.Event) Event {
	e := Event{Type: EventPut, KV: w.s.toKV(ev.Kv), Revision: ev.Kv.ModRevision}
	if ev.Type == mvccpb.DELETE {
		e.Type = EventDelete
		e.KV = KV{Key: e.KV.Key, ModRevision: ev.Kv.ModRevision}
	}
	if ev.PrevKv != nil {
		prev := w.s.toKV(ev.PrevKv)
		e.PrevKV = &prev
	}
	return e
}

// resync lists the prefix until it succeeds, sends the snapshot and moves
// w.next after it. It returns false when ctx is done.
func (w *watcher) resync(ctx context.Context) bool {
	b := backoff{d: watchBackoffMin}
	for {
		kvs, rev, err := w.s.ListKV(ctx, w.prefix)
		if err == nil {
			if !w.send(ctx, Event{Type: EventResync, Snapshot: kvs, Revision: rev}) {
				return false
			}
			w.next = rev + 1
			return true
		}
		if ctx.Err() != nil || w.s.client.Ctx().Err() != nil {
			return false
		}
		w.s.log.Debug("etcd watch re-list failed, retrying", "prefix", w.prefix, "err", err)
		if !b.wait(ctx) {
			return false
		}
	}
}

func (w *watcher) send(ctx context.Context, e Event) bool {
	select {
	case w.out <- e:
		return true
	case <-ctx.Done():
		return false
	}
}

// backoff is an exponential delay between retries.
type backoff struct{ d time.Duration }

func (b *backoff) reset() { b.d = watchBackoffMin }

// wait sleeps for the current delay and doubles it; false if ctx ended.
func (b *backoff) wait(ctx context.Context) bool {
	t := time.NewTimer(b.d)
	defer t.Stop()
	b.d = min(2*b.d, watchBackoffMax)
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
