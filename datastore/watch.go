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
	// EventProgress: the watch reached Revision without a change the
	// receiver takes (every key of the watch response was refused by
	// WatchSpec.Keep, or etcd reported progress).
	EventProgress
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
	case EventProgress:
		return "progress"
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
	// Reached, when not 0, is the revision through which the watch has
	// delivered every event, this one included. Only a watch with
	// WatchSpec.Skip sets it: its parts arrive independently, so Revision
	// may go back between events of different parts; a receiver that
	// tracks how far it got uses Reached. Without Skip events come in
	// revision order and Revision says it.
	Reached int64
}

// Backoff between watch or re-list attempts while etcd is unreachable.
const (
	watchBackoffMin = 100 * time.Millisecond
	watchBackoffMax = 3 * time.Second
)

// errGap means events may have been missed and the watcher must re-list.
var errGap = errors.New("watch gap")

// Watch streams the changes below prefix (a plain string prefix, as in
// ListKV) in revision order, with the previous values of updated and
// deleted keys: WatchKeys with WatchSpec{Prefix: prefix, PrevKV: true}.
func (s *Store) Watch(ctx context.Context, prefix string, fromRev int64) <-chan Event {
	return s.WatchKeys(ctx, WatchSpec{Prefix: prefix, PrevKV: true}, fromRev)
}

// WatchSpec says which keys a watch follows and what it hands out.
type WatchSpec struct {
	// Prefix: the keys starting with it (relative to the store's prefix).
	Prefix string
	// End, when set, bounds the range instead of Prefix's own end: the keys
	// in [Prefix, End). A watcher that needs most of the layout but not
	// the keys sorting after End (status/: every agent's status, rewritten
	// as it changes) does not receive them at all, nor pay for their
	// re-list.
	End string
	// PrevKV asks etcd for the previous value of every update and delete
	// (Event.PrevKV). etcd reads it for every event and watcher and sends
	// it along: twice the bytes of an update.
	PrevKV bool
	// Keep, when set, drops the keys it refuses before anything is copied
	// or sent (the key is relative, and must not be retained); a watch
	// response of refused keys only moves the revision.
	Keep func(key []byte) bool
	// Skip names ranges of keys inside the watched range that are not
	// received at all (not even by etcd's gRPC stream): the watch is one
	// etcd watch per remaining part, on one stream, and sets
	// Event.Reached (see watchparts.go). A re-list still reads them and
	// drops them.
	Skip []KeyRange
}

// KeyRange is the keys [From, To), relative to the store's prefix.
type KeyRange struct{ From, To string }

// WatchKeys streams the changes of the keys spec names in revision order.
//
// fromRev > 0 starts with the events at revision fromRev (so pass the
// revision of a ListKV plus one); fromRev <= 0 starts with an EventResync
// holding the current state. Whenever events may have been lost — fromRev
// or a reconnect point has been compacted, or etcd's revision went back —
// the watch re-lists and sends one EventResync with the full state, then
// continues after it. Disconnections and leader loss are retried with
// backoff for as long as ctx lives. The channel is closed when ctx is done
// (or the Store is closed). The events of one watch response are sent
// back to back, so that a receiver that drains the channel takes them in
// one go.
func (s *Store) WatchKeys(ctx context.Context, spec WatchSpec, fromRev int64) <-chan Event {
	out := make(chan Event, 16)
	go func() {
		defer close(out)
		s.watchKeys(ctx, spec, fromRev, func(evs []Event) bool {
			for _, e := range evs {
				select {
				case out <- e:
				case <-ctx.Done():
					return false
				}
			}
			return true
		})
	}()
	return out
}

// WatchKeysFunc is WatchKeys calling fn instead of sending on a channel:
// in the watch's own goroutine, with the events of one watch response (or
// one EventResync), so that a receiver that applies them at once (the
// cluster view) costs every event one goroutine wake-up less. fn must not
// keep evs (it may keep the events). WatchKeysFunc returns when ctx is
// done or the Store is closed.
func (s *Store) WatchKeysFunc(ctx context.Context, spec WatchSpec, fromRev int64, fn func(evs []Event)) {
	s.watchKeys(ctx, spec, fromRev, func(evs []Event) bool {
		fn(evs)
		return ctx.Err() == nil
	})
}

// emitFunc hands a watch response's events to the receiver; false when
// ctx ended first.
type emitFunc func(evs []Event) bool

func (s *Store) watchKeys(ctx context.Context, spec WatchSpec, fromRev int64, emit emitFunc) {
	if len(spec.Skip) > 0 {
		if s.watchProgressAnswered(ctx) {
			w := &partsWatcher{s: s, spec: spec, emit: emit, parts: s.watchParts(spec)}
			w.run(ctx, fromRev)
			return
		}
		// The parts' Reached needs progress reports: without them
		// (etcd's gRPC proxy), one watch of the whole range, the
		// skipped keys received and dropped.
		spec = withoutSkip(spec)
	}
	w := &watcher{s: s, spec: spec, emit: emit, next: fromRev}
	w.run(ctx)
}

type watcher struct {
	s    *Store
	spec WatchSpec
	emit emitFunc
	next int64 // first revision not yet delivered
}

func (w *watcher) run(ctx context.Context) {
	if w.next <= 0 && !w.resync(ctx) {
		return
	}
	w.s.follow(ctx, w.spec.Prefix, w.watchOnce, w.resync, func() int64 { return w.next })
}

// follow runs watchOnce until ctx ends: after a gap it re-lists (resync;
// false: ctx ended), after any other failure it waits with backoff and
// watches again from where it got (next, for the log).
func (s *Store) follow(ctx context.Context, prefix string, watchOnce func(context.Context, *backoff) error, resync func(context.Context) bool, next func() int64) {
	b := backoff{d: watchBackoffMin}
	for ctx.Err() == nil && s.client.Ctx().Err() == nil {
		err := watchOnce(ctx, &b)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errGap) {
			s.log.Info("etcd watch resyncing", "prefix", prefix, "reason", err)
			if !resync(ctx) {
				return
			}
			continue
		}
		s.log.Debug("etcd watch interrupted, retrying", "prefix", prefix, "next", next(), "err", err)
		if !b.wait(ctx) {
			return
		}
	}
}

// watchOnce runs one etcd watch from w.next until it fails.
func (w *watcher) watchOnce(ctx context.Context, b *backoff) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithRev(w.next), clientv3.WithCreatedNotify(), clientv3.WithProgressNotify()}
	if w.spec.End != "" {
		opts = append(opts, clientv3.WithRange(w.s.abs(w.spec.End)))
	} else {
		opts = append(opts, clientv3.WithPrefix())
	}
	if w.spec.PrevKV {
		opts = append(opts, clientv3.WithPrevKV())
	}
	wch := w.s.client.Watch(wctx, w.s.abs(w.spec.Prefix), opts...)
	for resp := range wch {
		if resp.CompactRevision != 0 {
			return fmt.Errorf("%w: revision %d compacted (up to %d)", errGap, w.next, resp.CompactRevision)
		}
		if err := resp.Err(); err != nil {
			return w.s.etcdErr(fmt.Sprintf("watching %s", w.spec.Prefix), err)
		}
		if resp.Created {
			b.reset()
			if resp.Header.Revision < w.next-1 {
				return fmt.Errorf("%w: etcd revision %d is behind %d", errGap, resp.Header.Revision, w.next-1)
			}
			continue
		}
		sent := w.next - 1 // the last revision the receiver has been given
		var batch []Event
		for _, ev := range resp.Events {
			if w.keep(ev.Kv.Key) {
				batch = append(batch, w.s.watchEvent(ev))
				sent = ev.Kv.ModRevision
			}
			w.next = ev.Kv.ModRevision + 1
		}
		if resp.IsProgressNotify() && resp.Header.Revision >= w.next {
			w.next = resp.Header.Revision + 1
		}
		// Whoever waits for a revision of a refused key still sees it
		// reached: one event without a value, not a copy of each. Also
		// when the response's refused events follow kept ones (a burst of
		// writes in one response): the receiver must reach the last.
		if sent < w.next-1 {
			batch = append(batch, Event{Type: EventProgress, Revision: w.next - 1})
		}
		if len(batch) > 0 && !w.emit(batch) {
			return ctx.Err()
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return w.s.etcdErr(fmt.Sprintf("watching %s", w.spec.Prefix), errors.New("watch closed"))
}

// keep applies spec.Keep to an absolute key.
func (w *watcher) keep(abs []byte) bool {
	return w.spec.Keep == nil || w.spec.Keep(abs[min(len(w.s.base), len(abs)):])
}

func (s *Store) watchEvent(ev *clientv3.Event) Event {
	e := Event{Type: EventPut, KV: s.toKV(ev.Kv), Revision: ev.Kv.ModRevision}
	if ev.Type == mvccpb.DELETE {
		e.Type = EventDelete
		e.KV = KV{Key: e.KV.Key, ModRevision: ev.Kv.ModRevision}
	}
	if ev.PrevKv != nil {
		prev := s.toKV(ev.PrevKv)
		e.PrevKV = &prev
	}
	return e
}

// resync lists the prefix until it succeeds, sends the snapshot and moves
// w.next after it. It returns false when ctx is done.
func (w *watcher) resync(ctx context.Context) bool {
	kvs, rev, ok := w.s.relist(ctx, w.spec, w.keep)
	if !ok || !w.emit([]Event{{Type: EventResync, Snapshot: kvs, Revision: rev}}) {
		return false
	}
	w.next = rev + 1
	return true
}

// relist lists spec's range (the keys keep takes) until it succeeds, with
// backoff; false when ctx or the store ended first.
func (s *Store) relist(ctx context.Context, spec WatchSpec, keep func([]byte) bool) ([]KV, int64, bool) {
	b := backoff{d: watchBackoffMin}
	for {
		kvs, rev, err := s.listRange(ctx, spec.Prefix, spec.End, keep)
		if err == nil {
			return kvs, rev, true
		}
		if ctx.Err() != nil || s.client.Ctx().Err() != nil {
			return nil, 0, false
		}
		s.log.Debug("etcd watch re-list failed, retrying", "prefix", spec.Prefix, "err", err)
		if !b.wait(ctx) {
			return nil, 0, false
		}
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
