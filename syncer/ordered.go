package syncer

import (
	"maps"
	"slices"
	"sync"
)

// orderedObjects are one kind's objects ordered by key, kept so that a
// reader (every owner pass's Endpoints, Nodes, NetworkPolicies) copies a
// slice instead of sorting every key. Keys that come and go are folded
// into the order when someone next reads, not on every event: at 30,000
// endpoints inserting each new key in place moved ≈ 0.5 MB of the slices
// per remote pod event (with GC write barriers), whether or not any owner
// would read them before the next one (docs/scale.md). Writers hold the
// view's write lock; readers hold its read lock, and mu orders the merge
// between readers.
type orderedObjects struct {
	mu      sync.Mutex
	keys    []string
	objs    []any          // api objects or *api.RemoteEndpoint; nil: removed, dropped at the next merge
	removed int            // nil entries of objs
	pending map[string]any // keys not in keys yet
}

func (oo *orderedObjects) len() int { return len(oo.keys) - oo.removed + len(oo.pending) }

func (oo *orderedObjects) put(key string, o any) {
	if i, found := slices.BinarySearch(oo.keys, key); found {
		if oo.objs[i] == nil {
			oo.removed--
		}
		oo.objs[i] = o
		return
	}
	if oo.pending == nil {
		oo.pending = map[string]any{}
	}
	oo.pending[key] = o
}

func (oo *orderedObjects) remove(key string) {
	if _, ok := oo.pending[key]; ok {
		delete(oo.pending, key)
		return
	}
	if i, found := slices.BinarySearch(oo.keys, key); found && oo.objs[i] != nil {
		oo.objs[i] = nil
		oo.removed++
	}
}

// merge folds the pending and removed keys into the order, in place:
// O(n + k log k) for k pending keys. The caller holds mu or the view's
// write lock.
func (oo *orderedObjects) merge() {
	if len(oo.pending) == 0 && oo.removed == 0 {
		return
	}
	w := 0
	for i, o := range oo.objs {
		if o != nil {
			oo.keys[w], oo.objs[w] = oo.keys[i], o
			w++
		}
	}
	clear(oo.keys[w:])
	clear(oo.objs[w:])
	add := slices.Sorted(maps.Keys(oo.pending))
	n := w + len(add)
	oo.keys = slices.Grow(oo.keys[:w], len(add))[:n]
	oo.objs = slices.Grow(oo.objs[:w], len(add))[:n]
	// From the back: each entry moves once.
	for i, j, k := w-1, len(add)-1, n-1; j >= 0; k-- {
		if i >= 0 && oo.keys[i] > add[j] {
			oo.keys[k], oo.objs[k] = oo.keys[i], oo.objs[i]
			i--
		} else {
			oo.keys[k], oo.objs[k] = add[j], oo.pending[add[j]]
			j--
		}
	}
	if len(oo.pending) > 64 {
		oo.pending = nil // a cleared map keeps its size (a whole re-list's)
	} else {
		clear(oo.pending)
	}
	oo.removed = 0
}

func (st *state) addObject(kind, key string, o any) {
	oo := st.ordered[kind]
	if oo == nil {
		oo = &orderedObjects{}
		st.ordered[kind] = oo
	}
	oo.put(key, o)
}

func (st *state) removeObject(kind, key string) {
	oo := st.ordered[kind]
	if oo == nil {
		return
	}
	oo.remove(key)
	if oo.len() == 0 {
		delete(st.ordered, kind)
	}
}

// count is how many objects of a kind the view holds.
func (st *state) count(kind string) int {
	oo := st.ordered[kind]
	if oo == nil {
		return 0
	}
	oo.mu.Lock()
	defer oo.mu.Unlock()
	return oo.len()
}

// objects returns the objects of one kind, ordered by key.
func objects[T any](st *state, kind string) []T {
	oo := st.ordered[kind]
	if oo == nil {
		return []T{}
	}
	oo.mu.Lock()
	defer oo.mu.Unlock()
	oo.merge()
	out := make([]T, 0, len(oo.objs))
	for _, o := range oo.objs {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out
}
