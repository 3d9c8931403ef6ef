package datastore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
)

// GetKVs reads several keys at once; a missing one is absent from the map.
func TestGetKVs(t *testing.T) {
	ctx := context.Background()
	s := storetest.New(t)
	revA, err := s.CreateKV(ctx, "a", []byte("1"), 0)
	if err != nil {
		t.Fatal(err)
	}
	revB, err := s.CreateKV(ctx, "b/c", []byte("2"), 0)
	if err != nil {
		t.Fatal(err)
	}
	got, rev, err := s.GetKVs(ctx, "a", "missing", "b/c", "b")
	if err != nil {
		t.Fatalf("GetKVs: %v", err)
	}
	if rev != revB {
		t.Errorf("GetKVs read at revision %d, want %d (the last write's)", rev, revB)
	}
	want := map[string]datastore.KV{
		"a":   {Key: "a", Value: []byte("1"), ModRevision: revA},
		"b/c": {Key: "b/c", Value: []byte("2"), ModRevision: revB},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("GetKVs (-want +got):\n%s", diff)
	}
	before := s.Requests()
	if _, _, err := s.GetKVs(ctx, "a", "b/c"); err != nil {
		t.Fatal(err)
	}
	if after := s.Requests(); after.Get != before.Get+1 || after.Txn != before.Txn {
		t.Errorf("requests %+v → %+v, want one get", before, after)
	}
}

func TestKVErrors(t *testing.T) {
	ctx := context.Background()
	s := storetest.New(t)

	if _, err := s.GetKV(ctx, "a"); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("GetKV missing: %v, want ErrNotFound", err)
	}
	rev1, err := s.CreateKV(ctx, "a", []byte("1"), 0)
	if err != nil {
		t.Fatalf("CreateKV: %v", err)
	}
	if _, err := s.CreateKV(ctx, "a", []byte("x"), 0); !errors.Is(err, datastore.ErrExists) {
		t.Fatalf("CreateKV twice: %v, want ErrExists", err)
	}
	got, err := s.GetKV(ctx, "a")
	if err != nil {
		t.Fatalf("GetKV: %v", err)
	}
	if diff := cmp.Diff(datastore.KV{Key: "a", Value: []byte("1"), ModRevision: rev1}, got); diff != "" {
		t.Errorf("GetKV (-want +got):\n%s", diff)
	}
	rev2, err := s.UpdateKV(ctx, "a", []byte("2"), rev1)
	if err != nil {
		t.Fatalf("UpdateKV: %v", err)
	}
	if rev2 <= rev1 {
		t.Errorf("UpdateKV revision %d not after %d", rev2, rev1)
	}
	if _, err := s.UpdateKV(ctx, "a", []byte("3"), rev1); !errors.Is(err, datastore.ErrConflict) {
		t.Errorf("UpdateKV stale: %v, want ErrConflict", err)
	}
	if _, err := s.UpdateKV(ctx, "missing", []byte("3"), rev1); !errors.Is(err, datastore.ErrNotFound) {
		t.Errorf("UpdateKV missing: %v, want ErrNotFound", err)
	}
	if err := s.DeleteKV(ctx, "a", rev1); !errors.Is(err, datastore.ErrConflict) {
		t.Errorf("DeleteKV stale: %v, want ErrConflict", err)
	}
	if err := s.DeleteKV(ctx, "a", rev2); err != nil {
		t.Errorf("DeleteKV: %v", err)
	}
	if err := s.DeleteKV(ctx, "a", rev2); !errors.Is(err, datastore.ErrNotFound) {
		t.Errorf("DeleteKV gone (CAS): %v, want ErrNotFound", err)
	}
	if err := s.DeleteKV(ctx, "a", 0); !errors.Is(err, datastore.ErrNotFound) {
		t.Errorf("DeleteKV gone: %v, want ErrNotFound", err)
	}
	prev, err := s.PutKV(ctx, "b", []byte("1"), 0)
	if err != nil {
		t.Fatalf("PutKV: %v", err)
	}
	next, err := s.PutKV(ctx, "b", []byte("2"), 0)
	if err != nil || next <= prev {
		t.Errorf("PutKV over existing = %d, %v; want a revision after %d", next, err, prev)
	}
	if err := s.DeleteKV(ctx, "b", 0); err != nil {
		t.Errorf("DeleteKV unconditional: %v", err)
	}
}

func TestListKVSortedConsistentAndPrefixed(t *testing.T) {
	ctx := context.Background()
	e := storetest.Etcd(t)
	s := storetest.Connect(t, e)
	other := storetest.Connect(t, e, func(c *datastore.Config) { c.Prefix = "/other" })
	if _, err := other.PutKV(ctx, "ipam/blocks/x", []byte("other"), 0); err != nil {
		t.Fatalf("PutKV: %v", err)
	}
	// More than one page (1000 keys), written in shuffled order.
	const n = 2100
	var want []datastore.KV
	var ops []datastore.Op
	for i := range n {
		k := fmt.Sprintf("ipam/blocks/%05d", (i*7919)%n)
		ops = append(ops, datastore.Op{Key: k, Value: []byte(k)})
		if len(ops) == 100 || i == n-1 {
			if _, err := s.Txn(ctx, nil, ops); err != nil {
				t.Fatalf("Txn: %v", err)
			}
			ops = nil
		}
	}
	if _, err := s.PutKV(ctx, "ipam/blocksX", []byte("outside"), 0); err != nil {
		t.Fatalf("PutKV: %v", err)
	}
	for i := range n {
		k := fmt.Sprintf("ipam/blocks/%05d", i)
		want = append(want, datastore.KV{Key: k, Value: []byte(k)})
	}
	got, rev, err := s.ListKV(ctx, "ipam/blocks/")
	if err != nil {
		t.Fatalf("ListKV: %v", err)
	}
	for _, kv := range got {
		if kv.ModRevision == 0 || kv.ModRevision > rev {
			t.Fatalf("key %s ModRevision %d outside (0, %d]", kv.Key, kv.ModRevision, rev)
		}
	}
	ignoreRev := cmp.Transformer("noRev", func(kv datastore.KV) datastore.KV { kv.ModRevision = 0; return kv })
	if diff := cmp.Diff(want, got, ignoreRev); diff != "" {
		t.Errorf("ListKV (-want +got):\n%s", diff)
	}
}

func TestTxn(t *testing.T) {
	ctx := context.Background()
	s := storetest.New(t)
	revA, err := s.CreateKV(ctx, "a", []byte("1"), 0)
	if err != nil {
		t.Fatal(err)
	}
	// Conditions fail: "b" must not exist but does not matter, "a" is stale.
	if _, err := s.Txn(ctx, []datastore.Cmp{{Key: "a", ModRevision: revA - 1}, {Key: "b"}},
		[]datastore.Op{{Key: "b", Value: []byte("x")}}); !errors.Is(err, datastore.ErrConflict) {
		t.Fatalf("Txn stale: %v, want ErrConflict", err)
	}
	if _, err := s.GetKV(ctx, "b"); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("failed Txn wrote b: %v", err)
	}
	rev, err := s.Txn(ctx, []datastore.Cmp{{Key: "a", ModRevision: revA}, {Key: "b"}},
		[]datastore.Op{{Key: "a", Delete: true}, {Key: "b", Value: []byte("2")}})
	if err != nil {
		t.Fatalf("Txn: %v", err)
	}
	b, err := s.GetKV(ctx, "b")
	if err != nil || b.ModRevision != rev {
		t.Errorf("b after Txn = %+v, %v; want ModRevision %d", b, err, rev)
	}
	if _, err := s.GetKV(ctx, "a"); !errors.Is(err, datastore.ErrNotFound) {
		t.Errorf("a after Txn delete: %v, want ErrNotFound", err)
	}
}

// TestConcurrentCAS has 20 writers race to update one key from the same
// revision, round after round: exactly one wins each round.
func TestConcurrentCAS(t *testing.T) {
	ctx := context.Background()
	s := storetest.New(t)
	rev, err := s.CreateKV(ctx, "counter", []byte("0"), 0)
	if err != nil {
		t.Fatal(err)
	}
	const writers, rounds = 20, 5
	for round := range rounds {
		var wg sync.WaitGroup
		revs := make([]int64, writers)
		errs := make([]error, writers)
		for w := range writers {
			wg.Go(func() {
				revs[w], errs[w] = s.UpdateKV(ctx, "counter", fmt.Appendf(nil, "%d-%d", round, w), rev)
			})
		}
		wg.Wait()
		winner := -1
		for w := range writers {
			switch {
			case errs[w] == nil:
				if winner >= 0 {
					t.Fatalf("round %d: writers %d and %d both succeeded", round, winner, w)
				}
				winner = w
			case !errors.Is(errs[w], datastore.ErrConflict):
				t.Fatalf("round %d: writer %d: %v, want ErrConflict", round, w, errs[w])
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: no writer succeeded", round)
		}
		got, err := s.GetKV(ctx, "counter")
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("%d-%d", round, winner); string(got.Value) != want || got.ModRevision != revs[winner] {
			t.Fatalf("round %d: value %q at %d, want %q at %d", round, got.Value, got.ModRevision, want, revs[winner])
		}
		rev = got.ModRevision
	}
}

func TestLeases(t *testing.T) {
	ctx := context.Background()
	s := storetest.New(t)
	id, err := s.GrantLease(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateKV(ctx, "status/nodes/n1", []byte("up"), id); err != nil {
		t.Fatal(err)
	}
	kv, err := s.GetKV(ctx, "status/nodes/n1")
	if err != nil || kv.Lease != id {
		t.Fatalf("GetKV = %+v, %v; want lease %d", kv, err, id)
	}
	// Updates keep the lease.
	if _, err := s.UpdateKV(ctx, "status/nodes/n1", []byte("still up"), kv.ModRevision); err != nil {
		t.Fatal(err)
	}
	if kv, err := s.GetKV(ctx, "status/nodes/n1"); err != nil || kv.Lease != id {
		t.Fatalf("after UpdateKV: %+v, %v; want lease %d", kv, err, id)
	}

	kctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.KeepAlive(kctx, id) }()
	if err := s.RevokeLease(ctx, id); err != nil {
		t.Fatalf("RevokeLease: %v", err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, datastore.ErrLeaseLost) {
			t.Errorf("KeepAlive after revoke: %v, want ErrLeaseLost", err)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("KeepAlive did not return after the lease was revoked")
	}
	cancel()
	if _, err := s.GetKV(ctx, "status/nodes/n1"); !errors.Is(err, datastore.ErrNotFound) {
		t.Errorf("key of revoked lease: %v, want ErrNotFound", err)
	}
	if err := s.RevokeLease(ctx, id); !errors.Is(err, datastore.ErrNotFound) {
		t.Errorf("RevokeLease twice: %v, want ErrNotFound", err)
	}

	// KeepAlive holds a 1s lease well past its TTL, and returns ctx.Err()
	// when cancelled.
	id2, err := s.GrantLease(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutKV(ctx, "status/nodes/n2", []byte("up"), id2); err != nil {
		t.Fatal(err)
	}
	kctx2, cancel2 := context.WithCancel(ctx)
	go func() { done <- s.KeepAlive(kctx2, id2) }()
	// Without keepalives the key would be gone after about a second.
	for start := time.Now(); time.Since(start) < 2500*time.Millisecond; time.Sleep(100 * time.Millisecond) {
		if _, err := s.GetKV(ctx, "status/nodes/n2"); err != nil {
			t.Fatalf("key of kept-alive lease after %v: %v", time.Since(start), err)
		}
	}
	cancel2()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("KeepAlive after cancel: %v, want context.Canceled", err)
	}
}
