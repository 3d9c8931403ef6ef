package datastore

import (
	"bytes"
	"context"
	"errors"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// attemptTimeout bounds one attempt of a write. etcd drops a proposal that
// a follower forwarded to a leader that then died, and the request waits
// out its whole deadline; after this long (an election takes about one
// election timeout, 1 s by default) the write is checked and retried
// instead. A healthy write takes milliseconds.
const attemptTimeout = 2 * time.Second

// casWrite is a compare-and-swap transaction in a form whose outcome can be
// read back: the revisions it compares and the keys it writes.
type casWrite struct {
	cmps  []Cmp
	ops   []casOp
	elses []clientv3.Op // the Else branch (reads), for the caller's failure diagnosis
}

// casOp is an Op of a casWrite; keepLease puts without touching the key's
// lease (an update).
type casOp struct {
	Op
	keepLease bool
}

// commit applies w, also across the loss of an etcd member, a leader
// change or a lost connection: when an attempt fails in a way that leaves
// open whether etcd applied it, commit reads the written keys to tell. An
// applied write is reported as applied (with the revision it got), one that
// was not is tried again (its comparisons decide again, so a retry never
// overwrites a newer write), until ctx ends. Keys are absolute.
func (s *Store) commit(ctx context.Context, w casWrite) (*clientv3.TxnResponse, error) {
	conds := make([]clientv3.Cmp, 0, len(w.cmps))
	for _, c := range w.cmps {
		conds = append(conds, clientv3.Compare(clientv3.ModRevision(c.Key), "=", c.ModRevision))
	}
	writes := make([]clientv3.Op, 0, len(w.ops))
	for _, o := range w.ops {
		switch {
		case o.Delete:
			writes = append(writes, clientv3.OpDelete(o.Key))
		case o.keepLease:
			writes = append(writes, clientv3.OpPut(o.Key, string(o.Value), clientv3.WithIgnoreLease()))
		default:
			writes = append(writes, clientv3.OpPut(o.Key, string(o.Value), clientv3.WithLease(clientv3.LeaseID(o.Lease))))
		}
	}
	unknown := false // an earlier attempt's outcome was lost
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		resp, err := s.txnCommit(actx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
			return s.client.Txn(ctx).If(conds...).Then(writes...).Else(w.elses...).Commit()
		})
		cancel()
		if err == nil && !resp.Succeeded && unknown {
			// The read-back can run before etcd applies an attempt whose
			// client gave up (the proposal is not withdrawn): the retry's
			// comparisons then fail on that very write. Seen as "already
			// exists" on a loaded host at 1,000 nodes (docs/scale.md).
			if rev, applied, rerr := s.applied(ctx, w); rerr == nil && applied {
				return &clientv3.TxnResponse{Succeeded: true, Header: &pb.ResponseHeader{Revision: rev}}, nil
			}
		}
		if err == nil || ctx.Err() != nil || !outcomeUnknown(err) {
			return resp, err
		}
		unknown = true
		s.log.Debug("etcd write outcome unknown: reading it back", "err", err)
		for {
			rev, applied, rerr := s.applied(ctx, w)
			if rerr == nil && applied {
				return &clientv3.TxnResponse{Succeeded: true, Header: &pb.ResponseHeader{Revision: rev}}, nil
			}
			if rerr != nil && !outcomeUnknown(rerr) {
				return nil, err
			}
			if !pause(ctx) {
				return nil, err
			}
			if rerr == nil {
				break // not applied: try again
			}
		}
	}
}

// pause waits a little between attempts; false when ctx ended.
func pause(ctx context.Context) bool {
	t := time.NewTimer(100 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// applied reads back the keys w writes: it was applied when every key it
// puts holds its value at one revision newer than every revision it
// compared, and every key it deletes is gone.
func (s *Store) applied(ctx context.Context, w casWrite) (rev int64, ok bool, err error) {
	actx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	gets := make([]clientv3.Op, 0, len(w.ops))
	for _, o := range w.ops {
		gets = append(gets, clientv3.OpGet(o.Key))
	}
	resp, err := s.client.Txn(actx).Then(gets...).Commit()
	if err != nil {
		return 0, false, err
	}
	rev = 0
	for i, o := range w.ops {
		kvs := resp.Responses[i].GetResponseRange().GetKvs()
		if o.Delete {
			if len(kvs) != 0 {
				return 0, false, nil
			}
			continue
		}
		if len(kvs) != 1 || !bytes.Equal(kvs[0].Value, o.Value) || (rev != 0 && kvs[0].ModRevision != rev) {
			return 0, false, nil
		}
		rev = kvs[0].ModRevision
	}
	if rev == 0 { // deletes only: they are done
		return resp.Header.Revision, true, nil
	}
	for _, c := range w.cmps {
		if rev <= c.ModRevision {
			return 0, false, nil
		}
	}
	return rev, true, nil
}

// txnCommit runs a commit (or GetKVs's read-only transaction); tests
// replace it to lose a write's outcome or fail a read.
func (s *Store) txnCommit(ctx context.Context, commit func(context.Context) (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
	if s.commitFault != nil {
		return s.commitFault(ctx, commit)
	}
	return commit(ctx)
}

// outcomeUnknown reports whether a write that failed with err may or may
// not have been applied, or was refused for want of a leader, so that it
// is worth reading back and retrying: etcd or the connection to it was
// unavailable, or the attempt's own deadline passed.
func outcomeUnknown(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded {
		return true // the attempt's deadline; commit checks the caller's
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable
	}
	return status.Code(err) == codes.Unavailable
}
