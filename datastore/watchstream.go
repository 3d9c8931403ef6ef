package datastore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// A watch with WatchSpec.Skip runs its parts on a gRPC watch stream of its
// own, received in the watch's goroutine: etcd's client hands each response
// through three goroutines of its own (the stream's reader, its dispatcher
// and each watch's) before the receiver gets it, and on an agent whose view
// takes one event at a time each hand-off wakes a thread (and Go's system
// monitor with it): that was most of a remote pod event's CPU
// (docs/scale.md, "Per remote pod event"). Here gRPC's reader hands the
// response to this goroutine, which delivers it.

// partsStream is one watch stream of a partsWatcher: its parts' watches,
// in the order they were created, and the progress requests it sends.
type partsStream struct {
	st   pb.Watch_WatchClient
	mu   sync.Mutex // serialises Send: the nudge timer and RequestWatchProgress send too
	ids  map[int64]int
	made int // parts whose creation etcd has confirmed
}

func (p *partsStream) send(r *pb.WatchRequest) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st.Send(r)
}

// requestProgress asks etcd for a progress report of every watch of the
// stream (answered with watch ID -1 when they are all in step).
func (p *partsStream) requestProgress() error {
	return p.send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}})
}

// openParts opens the stream (on the watch relay's connection when
// Config.WatchEndpoints are set) and asks for every part's watch from where
// it got; etcd confirms them in order (watchOnce maps the confirmations).
func (w *partsWatcher) openParts(ctx context.Context) (*partsStream, error) {
	st, err := pb.NewWatchClient(w.s.watchClient.ActiveConnection()).Watch(ctx,
		grpc.WaitForReady(true), grpc.MaxCallRecvMsgSize(math.MaxInt32))
	if err != nil {
		return nil, err
	}
	p := &partsStream{st: st, ids: map[int64]int{}}
	for i, part := range w.parts {
		err := p.send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
			Key: []byte(part.from), RangeEnd: []byte(part.to), StartRevision: w.reached[i] + 1, ProgressNotify: true}}})
		if err != nil {
			return nil, err
		}
	}
	return p, nil
}

// watchOnce runs the parts' watches on one stream until one fails.
func (w *partsWatcher) watchOnce(ctx context.Context, b *backoff) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	what := fmt.Sprintf("watching %s", w.spec.Prefix)
	if len(w.s.cfg.WatchEndpoints) > 0 {
		what += fmt.Sprintf(" through the watch relay at %s", w.s.cfg.WatchEndpoints)
	}
	p, err := w.openParts(wctx)
	if err != nil {
		return w.s.etcdErr(what, err)
	}
	defer w.s.addParts(p)()
	quiet, maxLag := progressEvery, progressMaxLag
	if len(w.s.cfg.WatchEndpoints) > 0 {
		quiet, maxLag = progressEveryRelayed, progressMaxLagRelayed
	}
	nudge := newNudger(quiet, maxLag, func() { _ = p.requestProgress() }) // best effort: the next lag asks again
	defer nudge.stop()
	for {
		resp, err := p.st.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return w.s.etcdErr(what, err)
		}
		if err := w.take(ctx, p, resp, b); err != nil {
			return err
		}
		nudge.seen(time.Now(), w.least() < slices.Max(w.reached))
	}
}

// take delivers one response of the stream.
func (w *partsWatcher) take(ctx context.Context, p *partsStream, resp *pb.WatchResponse, b *backoff) error {
	if resp.Header == nil {
		resp.Header = &pb.ResponseHeader{}
	}
	if resp.Created && resp.WatchId != clientv3.InvalidWatchID && p.made < len(w.parts) {
		p.ids[resp.WatchId] = p.made
		p.made++
	}
	i, ok := p.ids[resp.WatchId]
	switch {
	case resp.WatchId == clientv3.InvalidWatchID && !resp.Created && !resp.Canceled:
		return w.progressAll(ctx, resp.Header.Revision) // a report of every watch of the stream
	case !ok && resp.Canceled:
		return w.s.etcdErr(fmt.Sprintf("watching %s", w.spec.Prefix), fmt.Errorf("watch refused: %s", resp.CancelReason))
	case !ok:
		return nil // not one of the parts (none other is made on the stream)
	case resp.Canceled && resp.CompactRevision == 0:
		reason := resp.CancelReason
		if reason == "" {
			reason = "canceled by the server"
		}
		return w.s.etcdErr(fmt.Sprintf("watching %s", w.spec.Prefix), errors.New(reason))
	}
	return w.handle(ctx, partResp{i: i, resp: clientv3.WatchResponse{Header: resp.Header, Events: resp.Events,
		CompactRevision: resp.CompactRevision, Canceled: resp.Canceled, Created: resp.Created}}, b)
}

// progressAll moves every part to rev (a progress report of the stream)
// and tells the receiver when that moved the least of them.
func (w *partsWatcher) progressAll(ctx context.Context, rev int64) error {
	prev := w.least()
	for i := range w.reached {
		w.reached[i] = max(w.reached[i], rev)
	}
	if now := w.least(); now > prev && !w.emit([]Event{{Type: EventProgress, Revision: now, Reached: now}}) {
		return ctx.Err()
	}
	return nil
}
