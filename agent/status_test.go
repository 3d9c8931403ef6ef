package agent

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tabbynet/tabby/agent/routetable"
	"github.com/tabbynet/tabby/dataplane/fake"
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
	a := New(cfg, testLogger(), Deps{Routes: fake.NewRoutes()})
	a.store = store
	a.view = startView(t, store)
	a.routes = newRouteOwner("node1", a.view, routetable.New(a.deps.Routes, 0), testLogger())
	a.lease = &leaseHolder{store: store, ttl: 10 * time.Second, log: testLogger(), publish: func(context.Context, datastore.LeaseID) error { return nil }}
	if err := a.lease.grant(ctx); err != nil {
		t.Fatal(err)
	}
	lease := a.lease.current()
	done := make(chan struct{})
	go func() { defer close(done); a.statusLoop(ctx) }()
	defer func() { cancel(); <-done }()

	key := datastore.NodeStatusKey("node1")
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
	if err := a.lease.grant(ctx); err != nil {
		t.Fatal(err)
	}
	waitKV("after the lease was re-granted")

	// Revoking the lease (what a stopping agent does) deletes the record.
	a.lease.revoke(t.Context())
	if _, err := store.GetKV(ctx, key); !errors.Is(err, datastore.ErrNotFound) {
		t.Errorf("status record after the lease was revoked: %v", err)
	}
}
