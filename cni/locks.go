package cni

import (
	"context"
	"sync"
)

// KeyedLocks is a set of mutexes, one per key, that exist only while someone
// holds or waits for them. Waiting honours a context. Safe for concurrent use;
// the zero value is ready. The server serialises per container with it, the
// agent per workload.
type KeyedLocks struct {
	mu    sync.Mutex
	locks map[string]*keyedLock
}

type keyedLock struct {
	ch   chan struct{} // holds one token while the lock is taken
	refs int           // holders plus waiters
}

// Lock takes the lock of key and returns the function that releases it, or
// ctx's error if ctx ends first.
func (k *KeyedLocks) Lock(ctx context.Context, key string) (func(), error) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyedLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &keyedLock{ch: make(chan struct{}, 1)}
		k.locks[key] = l
	}
	l.refs++
	k.mu.Unlock()

	select {
	case l.ch <- struct{}{}:
		return func() {
			<-l.ch
			k.release(key, l)
		}, nil
	case <-ctx.Done():
		k.release(key, l)
		return nil, ctx.Err()
	}
}

func (k *KeyedLocks) release(key string, l *keyedLock) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l.refs--
	if l.refs == 0 {
		delete(k.locks, key)
	}
}

// waiters is how many callers hold or wait for key's lock (for tests).
func (k *KeyedLocks) waiters(key string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if l := k.locks[key]; l != nil {
		return l.refs
	}
	return 0
}
