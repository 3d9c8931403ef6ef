package datastore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// FloorWatch holds a bare watch of the keys spec names and does nothing
// with what it receives but count it: the ranges a WatchKeys of spec
// receives (spec's range without its Skip ranges), each one watch through
// etcd's own client (its shared stream and goroutines) from revision
// fromRev on (fromRev <= 0: the current one), and seen called with each response's event count and
// revision, in the client's goroutines (seen must be safe for concurrent
// use). It is the reference a watcher's per-event CPU is measured against
// (docs/scale.md, "Per remote pod event against a bare watcher"): what the
// same watch responses cost a Go process with the same client
// configuration, without decoding, a view or owners. It returns ctx's
// error once ctx ends, or the first watch's error (or an error saying
// the store was closed); there is no re-list
// and no retry.
func (s *Store) FloorWatch(ctx context.Context, spec WatchSpec, fromRev int64, seen func(events int, rev int64)) error {
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
