package ipam

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
)

// rider is an AssignRequest.With that creates key with the address, and
// counts its calls.
type rider struct {
	key   string
	err   error
	calls int
	addrs []netip.Addr
}

func (r *rider) with(addr netip.Addr) ([]datastore.Cmp, []datastore.Op, error) {
	r.calls++
	r.addrs = append(r.addrs, addr)
	if r.err != nil {
		return nil, nil, r.err
	}
	return []datastore.Cmp{{Key: r.key}}, []datastore.Op{{Key: r.key, Value: []byte(addr.String())}}, nil
}

// TestAssignWithCommitsInOneTransaction: a request's own write commits in
// the assignment's transaction (the same revision as the block and the
// handle), on the slow path (no cache) and on the fast path alike.
func TestAssignWithCommitsInOneTransaction(t *testing.T) {
	ctx := testCtx(t)
	s := storetest.New(t)
	a := New(s)
	mustCreatePool(t, a, "p", "10.244.0.0/16", 26)
	for _, h := range []string{"slow", "fast"} {
		r := &rider{key: "resources/test/" + h}
		res, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: h, With: r.with})
		if err != nil {
			t.Fatalf("assign %s: %v", h, err)
		}
		kv, err := s.GetKV(ctx, r.key)
		if err != nil {
			t.Fatalf("%s: the request's write is missing: %v", h, err)
		}
		blk, err := s.GetKV(ctx, blockKey(res.Block))
		if err != nil {
			t.Fatal(err)
		}
		hk, err := s.GetKV(ctx, handleKey(h))
		if err != nil {
			t.Fatal(err)
		}
		if res.WithRev == 0 || kv.ModRevision != res.WithRev || blk.ModRevision != res.WithRev || hk.ModRevision != res.WithRev {
			t.Errorf("%s: WithRev %d, rider at %d, block at %d, handle at %d: want one revision", h, res.WithRev, kv.ModRevision, blk.ModRevision, hk.ModRevision)
		}
		if string(kv.Value) != res.Addr.String() || r.calls != 1 {
			t.Errorf("%s: rider wrote %q after %d calls, want %s after 1", h, kv.Value, r.calls, res.Addr)
		}
	}
	// A repeat commits nothing, and so never writes the rider (the fast
	// path may try: its handle comparison fails).
	r := &rider{key: "resources/test/repeat"}
	res, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "slow", With: r.with})
	if err != nil || !res.Existing || res.WithRev != 0 {
		t.Errorf("repeat: %+v, %v; want Existing, WithRev 0", res, err)
	}
	if _, err := s.GetKV(ctx, r.key); !errors.Is(err, datastore.ErrNotFound) {
		t.Errorf("a repeat wrote its rider: %v", err)
	}
	mustCheckClean(t, a)
}

// TestAssignWithConflict: a request whose own write cannot commit (its key
// exists) still gets its address, alone, and is told so (WithRev 0); the
// key it found is untouched. A stale cache (another writer changed the
// block) likewise commits the address alone on the slow path.
func TestAssignWithConflict(t *testing.T) {
	ctx := testCtx(t)
	s := storetest.New(t)
	a := New(s)
	mustCreatePool(t, a, "p", "10.244.0.0/16", 26)
	if _, err := s.PutKV(ctx, "resources/test/taken", []byte("theirs"), 0); err != nil {
		t.Fatal(err)
	}
	r := &rider{key: "resources/test/taken"}
	res, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "h1", With: r.with})
	if err != nil {
		t.Fatalf("assign: %v", err)
	}
	if res.WithRev != 0 || r.calls != 1 {
		t.Errorf("WithRev %d after %d calls, want 0 after 1 (dropped after the conflict)", res.WithRev, r.calls)
	}
	if kv, err := s.GetKV(ctx, r.key); err != nil || string(kv.Value) != "theirs" {
		t.Errorf("existing key = %q, %v; want it untouched", kv.Value, err)
	}
	if got, err := a.AddressesByHandle(ctx, "h1"); err != nil || len(got) != 1 || got[0] != res.Addr {
		t.Errorf("handle h1 holds %v, %v; want [%s]", got, err, res.Addr)
	}

	// Another allocator (another agent process) writes the block behind
	// this one's cache.
	other := New(s)
	if _, err := other.Assign(ctx, AssignRequest{Node: "n1", Handle: "h2"}); err != nil {
		t.Fatal(err)
	}
	// The conflict is IPAM's own: the rider still rides, on the retry.
	r = &rider{key: "resources/test/stale"}
	res, err = a.Assign(ctx, AssignRequest{Node: "n1", Handle: "h3", With: r.with})
	if err != nil {
		t.Fatalf("assign on a stale cache: %v", err)
	}
	if res.WithRev == 0 || r.calls != 2 {
		t.Errorf("WithRev %d after %d calls, want the retry's revision after 2 (a conflict of the block, not of the rider)", res.WithRev, r.calls)
	}
	if kv, err := s.GetKV(ctx, r.key); err != nil || kv.ModRevision != res.WithRev {
		t.Errorf("rider = %+v, %v; want it written with the address at %d", kv, err, res.WithRev)
	}
	mustCheckClean(t, a)
}

// TestAssignWithFailsHalfway: a With that fails fails the assignment, and
// nothing is written (no handle, no allocation); one whose transaction
// committed before the process failed (the fault hook) left the address
// and the rider together, and releasing the handle frees the address.
func TestAssignWithFailsHalfway(t *testing.T) {
	ctx := testCtx(t)
	s := storetest.New(t)
	a := New(s)
	mustCreatePool(t, a, "p", "10.244.0.0/16", 26)
	boom := errors.New("boom")
	r := &rider{key: "resources/test/x", err: boom}
	if _, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "h1", With: r.with}); !errors.Is(err, boom) {
		t.Fatalf("assign with a failing rider = %v, want %v", err, boom)
	}
	if got, err := a.AddressesByHandle(ctx, "h1"); err != nil || len(got) != 0 {
		t.Errorf("handle h1 holds %v, %v after a failed assign; want nothing", got, err)
	}

	crash := New(s, WithFaultHook(func(step string) error {
		if step == "assign" {
			return boom
		}
		return nil
	}))
	r = &rider{key: "resources/test/y"}
	if _, err := crash.Assign(ctx, AssignRequest{Node: "n2", Handle: "h2", With: r.with}); !errors.Is(err, boom) {
		t.Fatalf("assign = %v, want the fault", err)
	}
	kv, err := s.GetKV(ctx, r.key)
	if err != nil {
		t.Fatalf("rider of a committed transaction missing: %v", err)
	}
	got, err := a.AddressesByHandle(ctx, "h2")
	if err != nil || len(got) != 1 || got[0].String() != string(kv.Value) {
		t.Errorf("handle h2 holds %v, %v; want the rider's %s", got, err, kv.Value)
	}
	if err := a.ReleaseHandle(ctx, "h2"); err != nil {
		t.Fatal(err)
	}
	if err := a.ReleaseHandle(ctx, "h2"); err != nil {
		t.Errorf("second release: %v, want success (idempotent)", err)
	}
	mustCheckClean(t, a)
}
