package syncer

import (
	"hash/maphash"
	"maps"
	"math/bits"

	"github.com/tabbynet/tabby/api"
)

// labelSets shares identical string maps (labels, annotations, namespace
// labels) between the endpoints the view holds: the pods of a deployment
// carry the same labels, the pods of a namespace the same namespace
// labels, and a small map costs ≈ 300 bytes however short its strings. At
// 30,000 endpoints that was about half of the view's heap
// (BenchmarkViewMemory, docs/scale.md). Each set is counted by the
// endpoints holding it and forgotten with the last; the shared maps are
// read-only, as everything the view hands out.
type labelSets struct {
	seed maphash.Seed
	sets map[uint64][]*labelSet
}

type labelSet struct {
	m    map[string]string
	refs int
}

func newLabelSets() labelSets {
	return labelSets{seed: maphash.MakeSeed(), sets: map[uint64][]*labelSet{}}
}

// hash does not depend on the order of the pairs.
func (t *labelSets) hash(m map[string]string) uint64 {
	var h uint64
	for k, v := range m {
		h += maphash.String(t.seed, k) ^ bits.RotateLeft64(maphash.String(t.seed, v), 17)
	}
	return h
}

// share returns the held map equal to m (m itself the first time), and
// counts one more holder. A nil or empty map is returned as it is.
func (t *labelSets) share(m map[string]string) map[string]string {
	if len(m) == 0 {
		return m
	}
	h := t.hash(m)
	for _, s := range t.sets[h] {
		if maps.Equal(s.m, m) {
			s.refs++
			return s.m
		}
	}
	t.sets[h] = append(t.sets[h], &labelSet{m: m, refs: 1})
	return m
}

// release counts one holder of m (a map share returned) less.
func (t *labelSets) release(m map[string]string) {
	if len(m) == 0 {
		return
	}
	h := t.hash(m)
	list := t.sets[h]
	for i, s := range list {
		if !maps.Equal(s.m, m) {
			continue
		}
		if s.refs--; s.refs == 0 {
			list = append(list[:i], list[i+1:]...)
			if len(list) == 0 {
				delete(t.sets, h)
			} else {
				t.sets[h] = list
			}
		}
		return
	}
}

// shareEndpoint replaces an endpoint's maps by the shared ones.
func (t *labelSets) shareEndpoint(w *api.WorkloadEndpoint) {
	w.Metadata.Labels = t.share(w.Metadata.Labels)
	w.Metadata.Annotations = t.share(w.Metadata.Annotations)
	w.Spec.NamespaceLabels = t.share(w.Spec.NamespaceLabels)
}

// shareRemote replaces a compact endpoint's maps by the shared ones.
func (t *labelSets) shareRemote(r *api.RemoteEndpoint) {
	r.Labels = t.share(r.Labels)
	r.NamespaceLabels = t.share(r.NamespaceLabels)
}

// releaseRemote undoes shareRemote.
func (t *labelSets) releaseRemote(r *api.RemoteEndpoint) {
	t.release(r.Labels)
	t.release(r.NamespaceLabels)
}

// releaseEndpoint undoes shareEndpoint.
func (t *labelSets) releaseEndpoint(w *api.WorkloadEndpoint) {
	t.release(w.Metadata.Labels)
	t.release(w.Metadata.Annotations)
	t.release(w.Spec.NamespaceLabels)
}
