// Package storetest gives tests a real etcd: an embedded single-member etcd
// in t.TempDir() on free loopback ports, and datastore.Stores connected to
// it, all cleaned up with t.Cleanup.
package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/embedded"
)

// startTimeout bounds starting etcd and connecting to it.
const startTimeout = 30 * time.Second

// Etcd starts an embedded etcd for the test and stops it at cleanup. Its data
// directory is in t.TempDir(), so Stop followed by Restart keeps the data.
func Etcd(t testing.TB) *embedded.Etcd {
	t.Helper()
	return start(t, true)
}

// EtcdFsync is Etcd with fsync on, as etcd runs in production and in the
// lab: for benchmarks of what a durable write costs (its data directory
// is t.TempDir(): a write costs that file system's fsync).
func EtcdFsync(t testing.TB) *embedded.Etcd {
	t.Helper()
	return start(t, false)
}

func start(t testing.TB, noFsync bool) *embedded.Etcd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	e, err := embedded.Start(ctx, embedded.Config{
		Dir:           t.TempDir(),
		UnsafeNoFsync: noFsync,
	})
	if err != nil {
		t.Fatalf("starting embedded etcd: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Errorf("stopping embedded etcd: %v", err)
		}
	})
	return e
}

// Connect returns a new Store on e, closed at cleanup. mutate, if given,
// adjusts the config (for example the prefix) before connecting.
func Connect(t testing.TB, e *embedded.Etcd, mutate ...func(*datastore.Config)) *datastore.Store {
	t.Helper()
	cfg := datastore.Config{Endpoints: e.Endpoints()}
	for _, m := range mutate {
		m(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	s, err := datastore.New(ctx, cfg)
	if err != nil {
		t.Fatalf("connecting to embedded etcd: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("closing store: %v", err)
		}
	})
	return s
}

// New returns a Store connected to a fresh embedded etcd.
func New(t testing.TB) *datastore.Store {
	t.Helper()
	s, _ := NewWithEtcd(t)
	return s
}

// NewWithEtcd returns a Store connected to a fresh embedded etcd, and the
// etcd, so that the test can Stop and Restart it.
func NewWithEtcd(t testing.TB) (*datastore.Store, *embedded.Etcd) {
	t.Helper()
	e := Etcd(t)
	return Connect(t, e), e
}
