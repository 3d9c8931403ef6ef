package datastore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A watch with WatchSpec.Skip is one etcd watch per part of its range
// outside the skipped ranges. etcd has no watch of several ranges, and
// the parts' responses arrive on separate channels, so nothing orders
// events of different parts: each part's events are delivered as they
// come (in revision order within the part), and Event.Reached says up to
// which revision every part has been delivered — the least revision the
// parts have reached. A part that sees no writes does not move by itself;
// while one lags the others, the watch asks etcd for a progress report of
// the stream once the stream has been quiet for progressEvery, or once the
// lag has lasted progressMaxLag (a steady stream of writes to one part),
// and RequestWatchProgress asks at once (the cluster view does when
// someone waits for a revision). Each report wakes every watch of the
// stream (the agent's other watches too), so a churn of pod events asks
// once per progressMaxLag, not once per progressEvery.
// A gap in any part (compaction, a wiped etcd) re-lists the whole range
// at one revision and restarts every part after it.

// progressEvery is how long a lagging watch's stream must be quiet before
// it asks etcd for progress; progressMaxLag bounds how long it lags
// without asking while writes keep coming.
const (
	progressEvery  = 200 * time.Millisecond
	progressMaxLag = 2 * time.Second
)

// progressEveryRelayed is progressEvery of a watch through a watch relay
// (Config.WatchEndpoints): its stream is quiet between the relay's batches
// (1 s apart by default, relay.DefaultWindow), and etcd's answer to a
// progress request makes the relay send what it holds; asking in every gap
// would add a wake-up (the request's) to every batch.
const progressEveryRelayed = 3 * time.Second

// progressMaxLagRelayed is progressMaxLag of a watch through a watch
// relay: each request costs the agent a write, and the relay a send out of
// its batches' step; nothing waits on it (WaitRevision asks itself), and
// the stream's quiet after a churn still asks within progressEveryRelayed.
const progressMaxLagRelayed = 10 * time.Second

// absRange is a part of a watch, in absolute keys.
type absRange struct{ from, to string }

// watchParts splits spec's range around its skipped ranges.
func (s *Store) watchParts(spec WatchSpec) []absRange {
	from := s.abs(spec.Prefix)
	end := clientv3.GetPrefixRangeEnd(from)
	if spec.End != "" {
		end = s.abs(spec.End)
	}
	skips := slices.Clone(spec.Skip)
	slices.SortFunc(skips, func(x, y KeyRange) int { return strings.Compare(x.From, y.From) })
	var parts []absRange
	for _, sk := range skips {
		a, b := s.abs(sk.From), s.abs(sk.To)
		if a > from {
			parts = append(parts, absRange{from, min(a, end)})
		}
		from = max(from, b)
	}
	if from < end {
		parts = append(parts, absRange{from, end})
	}
	return slices.DeleteFunc(parts, func(p absRange) bool { return p.from >= p.to })
}

// skipped reports whether an absolute key lies in none of the parts.
func skipped(parts []absRange, abs []byte) bool {
	k := string(abs)
	for _, p := range parts {
		if k >= p.from && k < p.to {
			return false
		}
	}
	return true
}

// progressProbeTimeout bounds how long watchProgressAnswered waits for an
// answer: etcd answers at once when its watches are in step.
const progressProbeTimeout = 3 * time.Second

// watchProgressAnswered reports whether the etcd endpoint answers watch
// progress requests with a revision, as etcd does and its gRPC proxy does
// not (it answers with an empty header, or not at all): a watch with
// WatchSpec.Skip needs them to tell how far a quiet part has got. Asked
// once per Store, with a watch of one key.
func (s *Store) watchProgressAnswered(ctx context.Context) bool {
	s.progressOnce.Do(func() {
		pctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), progressProbeTimeout)
		defer cancel()
		wch := s.client.Watch(pctx, s.abs("progress-probe"), clientv3.WithCreatedNotify())
		asked := false
		defer func() {
			if !s.progressOK {
				s.log.Info("etcd does not answer watch progress requests (a gRPC proxy?): watching whole ranges")
			}
		}()
		for resp := range wch {
			switch {
			case resp.Canceled || resp.Err() != nil:
				return
			case resp.Created && !asked:
				asked = true
				if s.client.RequestProgress(pctx) != nil {
					return
				}
			case asked && len(resp.Events) == 0 && !resp.Created:
				s.progressOK = resp.Header.Revision > 0
				return
			}
		}
	})
	return s.progressOK
}

// withoutSkip is spec as one watch of its whole range whose Keep also
// drops the skipped keys.
func withoutSkip(spec WatchSpec) WatchSpec {
	skip, keep := spec.Skip, spec.Keep
	spec.Skip = nil
	spec.Keep = func(key []byte) bool {
		for _, r := range skip {
			if string(key) >= r.From && string(key) < r.To {
				return false
			}
		}
		return keep == nil || keep(key)
	}
	return spec
}

// RequestWatchProgress asks etcd to report how far the store's watches
// have got; a watch with WatchSpec.Skip then moves Event.Reached to etcd's
// revision. Cheap (one message on each watch stream), answered only when
// every watch of a stream is in step with etcd.
func (s *Store) RequestWatchProgress(ctx context.Context) error {
	s.partsMu.Lock()
	streams := make([]*partsStream, 0, len(s.partsStreams))
	for p := range s.partsStreams {
		streams = append(streams, p)
	}
	s.partsMu.Unlock()
	if len(streams) == 0 {
		// The watches' stream is the one of their context's metadata.
		return s.client.RequestProgress(clientv3.WithRequireLeader(ctx))
	}
	var errs []error
	for _, p := range streams {
		errs = append(errs, p.requestProgress()) // each watch's own stream
	}
	return errors.Join(errs...)
}

// addParts registers a watch's stream for RequestWatchProgress until the
// returned func runs.
func (s *Store) addParts(p *partsStream) (remove func()) {
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	if s.partsStreams == nil {
		s.partsStreams = map[*partsStream]struct{}{}
	}
	s.partsStreams[p] = struct{}{}
	return func() {
		s.partsMu.Lock()
		defer s.partsMu.Unlock()
		delete(s.partsStreams, p)
	}
}

type partsWatcher struct {
	s     *Store
	spec  WatchSpec
	emit  emitFunc
	parts []absRange
	// reached is, per part, the revision through which its events have
	// been delivered.
	reached []int64
}

func (w *partsWatcher) least() int64 { return slices.Min(w.reached) }

func (w *partsWatcher) run(ctx context.Context, fromRev int64) {
	w.reached = make([]int64, len(w.parts))
	if fromRev > 0 {
		for i := range w.reached {
			w.reached[i] = fromRev - 1
		}
	} else if !w.resync(ctx) {
		return
	}
	w.s.follow(ctx, w.spec.Prefix, w.watchOnce, w.resync, w.least)
}

func (w *partsWatcher) keep(abs []byte) bool {
	return !skipped(w.parts, abs) && (w.spec.Keep == nil || w.spec.Keep(abs[min(len(w.s.base), len(abs)):]))
}

// resync lists the whole range at one revision (the skipped keys are read
// and dropped) and moves every part after it.
func (w *partsWatcher) resync(ctx context.Context) bool {
	kvs, rev, ok := w.s.relist(ctx, w.spec, w.keep)
	if !ok || !w.emit([]Event{{Type: EventResync, Snapshot: kvs, Revision: rev, Reached: rev}}) {
		return false
	}
	for i := range w.reached {
		w.reached[i] = rev
	}
	return true
}

type partResp struct {
	i    int
	resp clientv3.WatchResponse
}

// nudger asks for a progress report (send) once a lagging watch's stream
// has been quiet for progressEvery, and no later than progressMaxLag after
// the lag began (nudgeAfter). The receiver tells it of every response
// (seen), but the timer is not moved per response: resetting a timer
// wakes another thread to look at the new deadline (the runtime's
// wakeNetPoller), once per remote pod event of an agent's view. It is
// armed when the lag begins and, when it fires while responses still
// came, set again for the time left: under a steady churn it fires a few
// times a second instead of being reset on every event. Safe for
// concurrent use.
type nudger struct {
	mu            sync.Mutex
	t             *time.Timer
	armed         bool
	stopped       bool      // stop ran: fire neither re-arms nor sends
	lagSince      time.Time // zero: the parts are in step
	last          time.Time // the last response
	quiet, maxLag time.Duration
	send          func()
}

// newNudger asks by send once a lagging stream was quiet for quiet, or
// had lagged for maxLag.
func newNudger(quiet, maxLag time.Duration, send func()) *nudger {
	n := &nudger{quiet: quiet, maxLag: maxLag, send: send}
	n.t = time.AfterFunc(time.Hour, n.fire)
	n.t.Stop()
	return n
}

// seen records a response at now, after which the parts lag or are in
// step.
func (n *nudger) seen(now time.Time, lagging bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.last = now
	if n.stopped {
		return
	}
	if !lagging {
		n.lagSince = time.Time{} // an armed timer finds nothing to do
		return
	}
	if n.lagSince.IsZero() {
		n.lagSince = now
	}
	if !n.armed {
		n.armed = true
		n.t.Reset(nudgeAfter(n.quiet, n.maxLag, n.lagSince, now))
	}
}

func (n *nudger) fire() {
	n.mu.Lock()
	if n.stopped || n.lagSince.IsZero() {
		n.armed = false
		n.mu.Unlock()
		return
	}
	// Due progressEvery after the last response, within the bound.
	if left := n.last.Add(nudgeAfter(n.quiet, n.maxLag, n.lagSince, n.last)).Sub(time.Now()); left > 0 {
		n.t.Reset(left)
		n.mu.Unlock()
		return
	}
	n.armed = false
	n.mu.Unlock()
	n.send()
}

// stop disarms the nudger for good: a fire already under way neither
// re-arms the timer nor sends.
func (n *nudger) stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stopped = true
	n.t.Stop()
}

// nudgeAfter is how long after a response at now, with the parts lagging
// since lagSince, the watch asks for progress: once quiet for quiet, at
// most maxLag after the lag began.
func nudgeAfter(quiet, maxLag time.Duration, lagSince, now time.Time) time.Duration {
	return max(0, min(quiet, lagSince.Add(maxLag).Sub(now)))
}

// handle delivers one part's watch response.
func (w *partsWatcher) handle(ctx context.Context, r partResp, b *backoff) error {
	resp := r.resp
	switch {
	case resp.CompactRevision != 0:
		return fmt.Errorf("%w: revision %d compacted (up to %d)", errGap, w.reached[r.i]+1, resp.CompactRevision)
	case resp.Err() != nil:
		return w.s.etcdErr(fmt.Sprintf("watching %s", w.spec.Prefix), resp.Err())
	case resp.Created:
		b.reset()
		if resp.Header.Revision < w.reached[r.i] {
			return fmt.Errorf("%w: etcd revision %d is behind %d", errGap, resp.Header.Revision, w.reached[r.i])
		}
		return nil
	}
	prev := w.least()
	last := w.reached[r.i]
	var kept []Event
	for _, ev := range resp.Events {
		if w.keep(ev.Kv.Key) {
			kept = append(kept, w.s.watchEvent(ev))
		}
		last = max(last, ev.Kv.ModRevision)
	}
	if resp.IsProgressNotify() {
		last = max(last, resp.Header.Revision)
	}
	w.reached[r.i] = last
	now := w.least()
	for j := range kept {
		// Until the last event of the response is delivered, the others
		// of its revision may not be.
		kept[j].Reached = prev
		if j == len(kept)-1 {
			kept[j].Reached = now
		}
	}
	if len(kept) == 0 && now > prev {
		kept = append(kept, Event{Type: EventProgress, Revision: now, Reached: now})
	}
	if len(kept) > 0 && !w.emit(kept) {
		return ctx.Err()
	}
	return nil
}
