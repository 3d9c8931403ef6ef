package agent

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
)

// After the liveness lease is lost and re-granted, the BGP status record
// (deleted with the old lease) is published again under the new one even
// though the status itself did not change.
func TestStatusRepublishedUnderNewLease(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := storetest.New(t)
	cfg := Default()
	cfg.NodeName = "node1"
	a := New(cfg, testLogger(), Deps{})
	a.store = store
	lease, err := store.GrantLease(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	a.statusLease = lease
	done := make(chan struct{})
	go func() { defer close(done); a.statusLoop(ctx) }()
	defer func() { cancel(); <-done }()

	key := "status/bgp/node1"
	waitKV := func(what string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err := store.GetKV(ctx, key); err == nil {
				return
			} else if !errors.Is(err, datastore.ErrNotFound) {
				t.Fatal(err)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s not published", what, key)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitKV("first publication")
	if err := store.RevokeLease(ctx, lease); err != nil { // as if it had expired
		t.Fatal(err)
	}
	l2, err := store.GrantLease(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	a.statusLease = l2
	a.mu.Unlock()
	waitKV("after the lease was re-granted")
}
