package datastore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// LeaseID identifies an etcd lease; 0 = no lease.
type LeaseID int64

// KV is one key with its value. Key is relative to the store's prefix.
type KV struct {
	Key         string
	Value       []byte
	ModRevision int64
	Lease       LeaseID
}

// Cmp is a condition of Txn: the key's ModRevision must equal ModRevision;
// 0 means the key must not exist.
type Cmp struct {
	Key         string
	ModRevision int64
}

// Op is a write of Txn: a put (with an optional lease) or, with Delete, a
// delete.
type Op struct {
	Key    string
	Value  []byte
	Delete bool
	Lease  LeaseID
}

// listPageSize bounds the keys fetched per request by ListKV.
const listPageSize = 1000

func (s *Store) toKV(kv *mvccpb.KeyValue) KV {
	return KV{Key: s.rel(kv.Key), Value: kv.Value, ModRevision: kv.ModRevision, Lease: LeaseID(kv.Lease)}
}

// GetKV returns the key, or ErrNotFound.
func (s *Store) GetKV(ctx context.Context, key string) (KV, error) {
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	s.count.get.Add(1)
	resp, err := s.client.Get(ctx, s.abs(key))
	if err != nil {
		return KV{}, s.etcdErr(fmt.Sprintf("getting %s", key), err)
	}
	if len(resp.Kvs) == 0 {
		return KV{}, fmt.Errorf("%s: %w", key, ErrNotFound)
	}
	return s.toKV(resp.Kvs[0]), nil
}

// GetKVs reads keys in one round trip, at one revision (a read-only
// transaction: linearizable, nothing written): the keys that exist, by
// key (a key that does not is absent from the map), and the store's
// revision the read saw: every write before the call is at or below it,
// which is what a caller waits for a view to reach. etcd's client retries
// a failed Get but no Txn, so GetKVs retries itself (it writes nothing)
// while etcd is unavailable or has no leader, as across a leader's loss,
// until ctx ends.
func (s *Store) GetKVs(ctx context.Context, keys ...string) (map[string]KV, int64, error) {
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = clientv3.OpGet(s.abs(k))
	}
	s.count.get.Add(1)
	var resp *clientv3.TxnResponse
	var err error
	for {
		actx, acancel := context.WithTimeout(ctx, attemptTimeout)
		resp, err = s.txnCommit(actx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
			return s.client.Txn(ctx).Then(ops...).Commit()
		})
		acancel()
		if err == nil || ctx.Err() != nil || !outcomeUnknown(err) || !pause(ctx) {
			break
		}
		s.log.Debug("etcd read failed: trying again", "err", err)
	}
	if err != nil {
		return nil, 0, s.etcdErr(fmt.Sprintf("getting %s", strings.Join(keys, ", ")), err)
	}
	out := make(map[string]KV, len(keys))
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().GetKvs() {
			k := s.toKV(kv)
			out[k.Key] = k
		}
	}
	return out, resp.Header.GetRevision(), nil
}

// ListKV returns every key that starts with prefix (a plain string prefix:
// pass "ipam/blocks/" with the slash), sorted by key, and the store revision
// the list was taken at. Large lists are fetched in pages at one revision, so
// the result is a consistent snapshot.
func (s *Store) ListKV(ctx context.Context, prefix string) ([]KV, int64, error) {
	return s.listRange(ctx, prefix, "", nil)
}

// ListRevisions is ListKV without the values: each KV has its key,
// ModRevision and lease, and a nil Value; etcd sends none (keys-only), so
// knowing which records changed since a revision costs their keys only
// (IPAM's summary check at an agent's start: ≈ 60 B a block against
// ≈ 8 KB a block record).
func (s *Store) ListRevisions(ctx context.Context, prefix string) ([]KV, int64, error) {
	return s.listRange(ctx, prefix, "", nil, clientv3.WithKeysOnly())
}

// ClusterID is the ID of the etcd cluster that answered the Store's latest
// list (ListKV, ListRevisions, …), 0 before the first. A datastore copied
// key by key into a new etcd cluster keeps its values but not this (nor its
// revisions): a record that names a revision says which cluster's with it.
func (s *Store) ClusterID() uint64 { return s.clusterID.Load() }

// listRange lists [prefix, end) (prefix's own range when end is ""),
// leaving out the absolute keys keep refuses (nil keeps all), with extra
// options for every page's request.
func (s *Store) listRange(ctx context.Context, prefix, end string, keep func(abs []byte) bool, extra ...clientv3.OpOption) ([]KV, int64, error) {
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	start := s.abs(prefix)
	rangeEnd := clientv3.GetPrefixRangeEnd(start)
	if end != "" {
		rangeEnd = s.abs(end)
	}
	var (
		out []KV
		rev int64
	)
	for {
		opts := []clientv3.OpOption{
			clientv3.WithRange(rangeEnd),
			clientv3.WithLimit(listPageSize),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend),
		}
		opts = append(opts, extra...)
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		s.count.list.Add(1)
		resp, err := s.client.Get(ctx, start, opts...)
		if err != nil {
			return nil, 0, s.etcdErr(fmt.Sprintf("listing %s", prefix), err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
			s.clusterID.Store(resp.Header.ClusterId)
		}
		for _, kv := range resp.Kvs {
			if keep == nil || keep(kv.Key) {
				out = append(out, s.toKV(kv))
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return out, rev, nil
		}
		start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// CreateKV writes the key if it does not exist (else ErrExists) and returns
// its ModRevision.
func (s *Store) CreateKV(ctx context.Context, key string, val []byte, lease LeaseID) (int64, error) {
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	k := s.abs(key)
	s.count.txn.Add(1)
	resp, err := s.commit(ctx, casWrite{
		cmps: []Cmp{{Key: k, ModRevision: 0}},
		ops:  []casOp{{Op: Op{Key: k, Value: val, Lease: lease}}},
	})
	if err != nil {
		return 0, s.etcdErr(fmt.Sprintf("creating %s", key), err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("%s: %w", key, ErrExists)
	}
	return resp.Header.Revision, nil
}

// UpdateKV writes the key if its ModRevision is still modRev and returns the
// new ModRevision: ErrConflict if it changed, ErrNotFound if it is gone. The
// key keeps its lease.
func (s *Store) UpdateKV(ctx context.Context, key string, val []byte, modRev int64) (int64, error) {
	if modRev <= 0 {
		return 0, fmt.Errorf("updating %s: a revision is required (got %d)", key, modRev)
	}
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	k := s.abs(key)
	s.count.txn.Add(1)
	resp, err := s.commit(ctx, casWrite{
		cmps:  []Cmp{{Key: k, ModRevision: modRev}},
		ops:   []casOp{{Op: Op{Key: k, Value: val}, keepLease: true}},
		elses: []clientv3.Op{clientv3.OpGet(k, clientv3.WithCountOnly())},
	})
	if err != nil {
		return 0, s.etcdErr(fmt.Sprintf("updating %s", key), err)
	}
	if !resp.Succeeded {
		return 0, s.casFailure(key, resp)
	}
	return resp.Header.Revision, nil
}

// casFailure tells ErrNotFound from ErrConflict from the Else branch's get.
func (s *Store) casFailure(key string, resp *clientv3.TxnResponse) error {
	if len(resp.Responses) == 1 {
		if r := resp.Responses[0].GetResponseRange(); r != nil && r.Count == 0 {
			return fmt.Errorf("%s: %w", key, ErrNotFound)
		}
	}
	return fmt.Errorf("%s: %w", key, ErrConflict)
}

// PutKV writes the key unconditionally and returns its new ModRevision.
func (s *Store) PutKV(ctx context.Context, key string, val []byte, lease LeaseID) (int64, error) {
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	s.count.put.Add(1)
	resp, err := s.client.Put(ctx, s.abs(key), string(val), clientv3.WithLease(clientv3.LeaseID(lease)))
	if err != nil {
		return 0, s.etcdErr(fmt.Sprintf("putting %s", key), err)
	}
	return resp.Header.Revision, nil
}

// DeleteKV deletes the key: unconditionally when modRev is 0, else only if
// its ModRevision is still modRev (ErrConflict). A missing key is
// ErrNotFound.
func (s *Store) DeleteKV(ctx context.Context, key string, modRev int64) error {
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	k := s.abs(key)
	if modRev == 0 {
		s.count.txn.Add(1)
		resp, err := s.client.Delete(ctx, k)
		if err != nil {
			return s.etcdErr(fmt.Sprintf("deleting %s", key), err)
		}
		if resp.Deleted == 0 {
			return fmt.Errorf("%s: %w", key, ErrNotFound)
		}
		return nil
	}
	s.count.txn.Add(1)
	resp, err := s.commit(ctx, casWrite{
		cmps:  []Cmp{{Key: k, ModRevision: modRev}},
		ops:   []casOp{{Op: Op{Key: k, Delete: true}}},
		elses: []clientv3.Op{clientv3.OpGet(k, clientv3.WithCountOnly())},
	})
	if err != nil {
		return s.etcdErr(fmt.Sprintf("deleting %s", key), err)
	}
	if !resp.Succeeded {
		return s.casFailure(key, resp)
	}
	return nil
}

// Txn applies every op atomically if every condition holds, else returns
// ErrConflict. It returns the store revision after the transaction.
func (s *Store) Txn(ctx context.Context, cmps []Cmp, ops []Op) (int64, error) {
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	w := casWrite{cmps: make([]Cmp, 0, len(cmps)), ops: make([]casOp, 0, len(ops))}
	for _, c := range cmps {
		w.cmps = append(w.cmps, Cmp{Key: s.abs(c.Key), ModRevision: c.ModRevision})
	}
	for _, o := range ops {
		o.Key = s.abs(o.Key)
		w.ops = append(w.ops, casOp{Op: o})
	}
	s.count.txn.Add(1)
	resp, err := s.commit(ctx, w)
	if err != nil {
		return 0, s.etcdErr(fmt.Sprintf("transaction on %d keys", len(cmps)+len(ops)), err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("transaction: %w", ErrConflict)
	}
	return resp.Header.Revision, nil
}

// GrantLease creates a lease of ttl, rounded up to whole seconds (at least
// one).
func (s *Store) GrantLease(ctx context.Context, ttl time.Duration) (LeaseID, error) {
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	secs := int64((ttl + time.Second - 1) / time.Second)
	if secs < 1 {
		secs = 1
	}
	resp, err := s.client.Grant(ctx, secs)
	if err != nil {
		return 0, s.etcdErr("granting lease", err)
	}
	return LeaseID(resp.ID), nil
}

// KeepAlive keeps the lease alive until ctx is done (it then returns
// ctx.Err()) or the lease is lost: expired, revoked, or not renewed in time
// because etcd was unreachable (ErrLeaseLost).
func (s *Store) KeepAlive(ctx context.Context, id LeaseID) error {
	return s.KeepAliveNotify(ctx, id, nil)
}

// KeepAliveNotify is KeepAlive calling renewed, when not nil, at every
// renewal etcd answers (every third of the lease's TTL): a caller learns
// from it, at no extra request, that etcd is reachable.
//
// It renews with one request at a time (etcd's KeepAliveOnce) on a timer
// of its own rather than through the etcd client's keepalive stream,
// whose two loops wake every 500 ms whatever the TTL: an idle agent's most
// frequent wake-ups (docs/scale.md, "Idle at rest"). As the client does,
// it renews every third of the TTL etcd reports, retries every
// keepAliveRetry while etcd does not answer, and gives up once the lease
// would have expired since the last renewal.
func (s *Store) KeepAliveNotify(ctx context.Context, id LeaseID, renewed func()) error {
	// Until etcd first answers, the lease's TTL is unknown: give up after
	// keepAliveFirst, as the etcd client does.
	deadline := time.Now().Add(keepAliveFirst)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		rctx, cancel := s.withTimeout(ctx)
		resp, err := s.client.KeepAliveOnce(rctx, clientv3.LeaseID(id))
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err == nil && resp.TTL > 0:
			ttl := time.Duration(resp.TTL) * time.Second
			deadline = time.Now().Add(ttl)
			if renewed != nil {
				renewed()
			}
			t.Reset(ttl / 3)
		case err == nil || isLeaseNotFound(err):
			return fmt.Errorf("lease %x: %w", int64(id), ErrLeaseLost)
		case time.Now().After(deadline):
			return fmt.Errorf("lease %x: not renewed before it expired: %w: %w", int64(id), ErrLeaseLost, s.etcdErr("renewing lease", err))
		default:
			t.Reset(keepAliveRetry)
		}
	}
}

// keepAliveRetry is the interval of KeepAliveNotify's attempts while etcd
// does not answer, keepAliveFirst how long it tries before the first
// answer (the etcd client's own values).
const (
	keepAliveRetry = 500 * time.Millisecond
	keepAliveFirst = 5 * time.Second
)

// RevokeLease revokes the lease, deleting its keys. A lease that is already
// gone is ErrNotFound.
func (s *Store) RevokeLease(ctx context.Context, id LeaseID) error {
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	if _, err := s.client.Revoke(ctx, clientv3.LeaseID(id)); err != nil {
		if isLeaseNotFound(err) {
			return fmt.Errorf("lease %x: %w", int64(id), ErrNotFound)
		}
		return s.etcdErr(fmt.Sprintf("revoking lease %x", int64(id)), err)
	}
	return nil
}

func isLeaseNotFound(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound)
}
