package datastore

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tabbynet/tabby/datastore/embedded"
)

func newCommitTestStore(t *testing.T) *Store {
	t.Helper()
	e, err := embedded.Start(context.Background(), embedded.Config{Dir: t.TempDir(), UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Error(err)
		}
	})
	s, err := New(context.Background(), Config{Endpoints: e.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

type commitFn = func(context.Context) (*clientv3.TxnResponse, error)

// loseOutcome makes the first n write attempts fail as when etcd's leader
// died with the request in flight; apply says whether they reached etcd.
func loseOutcome(s *Store, n int, apply bool) *int {
	attempts := 0
	s.commitFault = func(ctx context.Context, commit commitFn) (*clientv3.TxnResponse, error) {
		attempts++
		if attempts > n {
			return commit(ctx)
		}
		if apply {
			if _, err := commit(ctx); err != nil {
				return nil, err
			}
		}
		return nil, rpctypes.ErrTimeoutDueToLeaderFail
	}
	return &attempts
}

// A write whose outcome etcd lost (leader or connection gone) is read back:
// applied, it succeeds with its revision and is not applied twice; not
// applied, it is retried; a comparison that fails on the retry is still a
// conflict.
func TestCommitResolvesLostOutcome(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := newCommitTestStore(t)

	t.Run("applied, outcome lost", func(t *testing.T) {
		attempts := loseOutcome(s, 1, true)
		rev, err := s.CreateKV(ctx, "c/applied", []byte("v"), 0)
		if err != nil {
			t.Fatalf("CreateKV: %v", err)
		}
		kv, err := s.GetKV(ctx, "c/applied")
		if err != nil || kv.ModRevision != rev || string(kv.Value) != "v" {
			t.Errorf("GetKV = %+v, %v; want value v at the revision CreateKV returned (%d)", kv, err, rev)
		}
		if *attempts != 1 {
			t.Errorf("%d attempts, want 1 (the write was applied)", *attempts)
		}
	})
	t.Run("not applied, outcome lost", func(t *testing.T) {
		attempts := loseOutcome(s, 2, false)
		kv, _ := s.GetKV(ctx, "c/applied")
		rev, err := s.UpdateKV(ctx, "c/applied", []byte("w"), kv.ModRevision)
		if err != nil {
			t.Fatalf("UpdateKV: %v", err)
		}
		if got, _ := s.GetKV(ctx, "c/applied"); got.ModRevision != rev || string(got.Value) != "w" {
			t.Errorf("after UpdateKV: %+v, want w at %d", got, rev)
		}
		if *attempts != 3 {
			t.Errorf("%d attempts, want 3", *attempts)
		}
	})
	t.Run("multi-key transaction", func(t *testing.T) {
		loseOutcome(s, 1, true)
		kv, _ := s.GetKV(ctx, "c/applied")
		rev, err := s.Txn(ctx, []Cmp{{Key: "c/applied", ModRevision: kv.ModRevision}},
			[]Op{{Key: "c/applied", Value: []byte("x")}, {Key: "c/other", Value: []byte("y")}})
		if err != nil {
			t.Fatalf("Txn: %v", err)
		}
		for k, v := range map[string]string{"c/applied": "x", "c/other": "y"} {
			if got, err := s.GetKV(ctx, k); err != nil || string(got.Value) != v || got.ModRevision != rev {
				t.Errorf("%s = %+v, %v; want %s at %d", k, got, err, v, rev)
			}
		}
	})
	t.Run("conflict after a lost attempt", func(t *testing.T) {
		loseOutcome(s, 1, false)
		if _, err := s.CreateKV(ctx, "c/applied", []byte("z"), 0); !errors.Is(err, ErrExists) {
			t.Errorf("CreateKV of an existing key: %v, want ErrExists", err)
		}
		loseOutcome(s, 1, false)
		if _, err := s.UpdateKV(ctx, "c/applied", []byte("z"), 1); !errors.Is(err, ErrConflict) {
			t.Errorf("UpdateKV at an old revision: %v, want ErrConflict", err)
		}
	})
	t.Run("applied after the read-back", func(t *testing.T) {
		// The first attempt reaches etcd only after its outcome was lost
		// and read back (still in etcd's pipeline): the retry's comparison
		// fails on that very write, which is the caller's, applied.
		var late commitFn
		attempts := 0
		s.commitFault = func(ctx context.Context, commit commitFn) (*clientv3.TxnResponse, error) {
			attempts++
			if attempts == 1 {
				late = commit
				return nil, rpctypes.ErrTimeoutDueToLeaderFail
			}
			if _, err := late(ctx); err != nil {
				return nil, err
			}
			return commit(ctx)
		}
		rev, err := s.CreateKV(ctx, "c/late", []byte("v"), 0)
		if err != nil {
			t.Fatalf("CreateKV: %v, want the late write reported as applied", err)
		}
		if kv, err := s.GetKV(ctx, "c/late"); err != nil || kv.ModRevision != rev || string(kv.Value) != "v" {
			t.Errorf("GetKV = %+v, %v; want v at %d", kv, err, rev)
		}
		if attempts != 2 {
			t.Errorf("%d attempts, want 2", attempts)
		}
	})
	t.Run("delete", func(t *testing.T) {
		loseOutcome(s, 1, true)
		kv, _ := s.GetKV(ctx, "c/other")
		if err := s.DeleteKV(ctx, "c/other", kv.ModRevision); err != nil {
			t.Errorf("DeleteKV: %v", err)
		}
	})
	t.Run("caller's deadline", func(t *testing.T) {
		s.commitFault = func(context.Context, commitFn) (*clientv3.TxnResponse, error) {
			return nil, rpctypes.ErrTimeoutDueToLeaderFail
		}
		dctx, dcancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer dcancel()
		if _, err := s.CreateKV(dctx, "c/never", []byte("v"), 0); err == nil {
			t.Error("CreateKV succeeded although no attempt did")
		}
	})
	s.commitFault = nil
}

// GetKVs is a transaction, which etcd's client does not retry: it retries
// itself while etcd has no leader (as across a leader's loss), and not on
// an error that says the read itself is wrong.
func TestGetKVsRetriesWithoutLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := newCommitTestStore(t)
	if _, err := s.PutKV(ctx, "k", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	attempts := 0
	s.commitFault = func(ctx context.Context, commit commitFn) (*clientv3.TxnResponse, error) {
		if attempts++; attempts <= 2 {
			return nil, rpctypes.ErrLeaderChanged
		}
		return commit(ctx)
	}
	kvs, _, err := s.GetKVs(ctx, "k")
	if err != nil || string(kvs["k"].Value) != "v" || attempts != 3 {
		t.Errorf("GetKVs = %v, %v after %d attempts, want k=v after 3", kvs, err, attempts)
	}
	attempts = 0
	s.commitFault = func(context.Context, commitFn) (*clientv3.TxnResponse, error) {
		attempts++
		return nil, rpctypes.ErrKeyNotFound
	}
	if _, _, err := s.GetKVs(ctx, "k"); err == nil || attempts != 1 {
		t.Errorf("GetKVs with a lasting error: %v after %d attempts, want the error after 1", err, attempts)
	}
}
