package datastore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// FloorMode is how FloorWatch receives.
type FloorMode int

const (
	// FloorClient: through etcd's client (clientv3.Watch): its shared
	// watch stream, its goroutines and their hand-offs, as any etcd
	// watcher.
	FloorClient FloorMode = iota
	// FloorStream: on a gRPC watch stream of its own, received in one
	// goroutine, as the view's watch (watchstream.go): gRPC's reader hands
	// each response to it, nothing else does. Through the watch relay
	// when Config.WatchEndpoints are set.
	FloorStream
)

// FloorWatch holds a bare watch of the keys spec names and does nothing
// with what it receives but count it: the ranges a WatchKeys of spec
// receives (spec's range without its Skip ranges), each one etcd watch
// received as mode says, from revision fromRev on (fromRev <= 0: the
// current one), and seen called with each response's event count and
// revision, in the receiving goroutines (seen must be safe for concurrent
// use). It is the reference a watcher's per-event CPU is measured against
// (docs/scale.md, "Per remote pod event against a bare watcher"): what the
// same watch responses cost a Go process with the same client
// configuration, without decoding, a view or owners. It returns ctx's
// error once ctx ends, or the first watch's error (or an error saying
// the store was closed); there is no re-list
// and no retry.
func (s *Store) FloorWatch(ctx context.Context, spec WatchSpec, fromRev int64, mode FloorMode, seen func(events int, rev int64)) error {
	if mode == FloorStream {
		return s.floorStream(ctx, spec, fromRev, seen)
	}
	parent := ctx
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, p := range s.watchParts(spec) {
		opts := []clientv3.OpOption{clientv3.WithRange(p.to), clientv3.WithProgressNotify()}
		if fromRev > 0 {
			opts = append(opts, clientv3.WithRev(fromRev))
		}
		ch := s.client.Watch(ctx, p.from, opts...)
		wg.Go(func() {
			for resp := range ch {
				if err := resp.Err(); err != nil {
					mu.Lock()
					errs = append(errs, s.etcdErr(fmt.Sprintf("watching %s", p.from), err))
					mu.Unlock()
					cancel()
					return
				}
				seen(len(resp.Events), resp.Header.Revision)
			}
			cancel() // a watch ended (ctx, or the client closed): end the others
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := parent.Err(); err != nil {
		return err
	}
	return errors.New("floor watch ended: the store was closed")
}

// floorStream is FloorWatch on a stream of its own.
func (s *Store) floorStream(ctx context.Context, spec WatchSpec, fromRev int64, seen func(events int, rev int64)) error {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	st, err := pb.NewWatchClient(s.watchClient.ActiveConnection()).Watch(ctx, grpc.WaitForReady(true), grpc.MaxCallRecvMsgSize(math.MaxInt32))
	if err != nil {
		return s.etcdErr("floor watch", err)
	}
	for _, p := range s.watchParts(spec) {
		err := st.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
			Key: []byte(p.from), RangeEnd: []byte(p.to), StartRevision: max(fromRev, 0), ProgressNotify: true}}})
		if err != nil {
			return s.etcdErr("floor watch", err)
		}
	}
	for {
		resp, err := st.Recv()
		if err != nil {
			if cerr := ctx.Err(); cerr != nil {
				return cerr
			}
			return s.etcdErr("floor watch", err)
		}
		if resp.Canceled {
			return s.etcdErr("floor watch", fmt.Errorf("watch canceled: %s", resp.CancelReason))
		}
		if resp.Header != nil {
			seen(len(resp.Events), resp.Header.Revision)
		}
	}
}
