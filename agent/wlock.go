package agent

import "sync"

// workloadLocks serialises CNI requests per workload (host interface),
// beyond the CNI server's per-container serialisation: two sandboxes of the
// same pod share a host interface name and an endpoint, and must not wire
// and unwire them at the same time.
type workloadLocks struct {
	mu    sync.Mutex
	locks map[string]*workloadLock
}

type workloadLock struct {
	sync.Mutex
	refs int
}

// lock locks key and returns its unlock function.
func (w *workloadLocks) lock(key string) func() {
	w.mu.Lock()
	if w.locks == nil {
		w.locks = map[string]*workloadLock{}
	}
	l := w.locks[key]
	if l == nil {
		l = &workloadLock{}
		w.locks[key] = l
	}
	l.refs++
	w.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		w.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(w.locks, key)
		}
		w.mu.Unlock()
	}
}
