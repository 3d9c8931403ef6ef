package syncer

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
)

// TestOrderedObjects: objects stays ordered by key, and holds exactly the
// kind's objects, through random adds, updates and removals (the order
// objects kept by sorting every key on every call).
func TestOrderedObjects(t *testing.T) {
	st := newState()
	rng := rand.New(rand.NewPCG(1, 2))
	kind := api.KindNetworkPolicy
	key := func(i int) string { return fmt.Sprintf("resources/networkpolicies/default/p%d", i) }
	model := map[string]*api.NetworkPolicy{}
	for step := range 3000 {
		i := rng.IntN(200)
		if rng.IntN(3) == 0 {
			st.removeObject(kind, key(i))
			delete(model, key(i))
		} else {
			p := &api.NetworkPolicy{Metadata: api.ObjectMeta{Name: fmt.Sprint(i), Namespace: "default", ResourceVersion: fmt.Sprint(step)}}
			st.addObject(kind, key(i), p)
			model[key(i)] = p
		}
		if step%97 != 0 {
			continue
		}
		var want []*api.NetworkPolicy
		for _, k := range slices.Sorted(maps.Keys(model)) {
			want = append(want, model[k])
		}
		if got := st.count(kind); got != len(model) {
			t.Fatalf("step %d: count %d, want %d", step, got, len(model))
		}
		got := objects[*api.NetworkPolicy](st, kind)
		if want == nil {
			want = []*api.NetworkPolicy{}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("step %d: objects (-want +got):\n%s", step, diff)
		}
	}
	for i := range 200 {
		st.removeObject(kind, key(i))
	}
	if got := objects[*api.NetworkPolicy](st, kind); len(got) != 0 || st.ordered[kind] != nil {
		t.Fatalf("after removing every key: %d objects, index %v", len(got), st.ordered[kind])
	}
}

// BenchmarkEndpointsAfterEvent: one remote endpoint replaced, then the
// ordered list an owner pass reads, at 30,000 endpoints (the scale
// harness's largest size). "sorted" is how objects worked before: sorting
// every key on every call.
func BenchmarkEndpointsAfterEvent(b *testing.B) {
	const n = 30000
	st := newState()
	kind := api.KindWorkloadEndpoint
	key := func(i int) string { return fmt.Sprintf("resources/workloadendpoints/default/sim%d-p%d", i/30, i%30) }
	ep := func(i int) *api.WorkloadEndpoint {
		return &api.WorkloadEndpoint{Metadata: api.ObjectMeta{Name: fmt.Sprintf("sim%d-p%d", i/30, i%30), Namespace: "default"}}
	}
	all := map[string]api.Object{} // what the view held by kind and key before the ordered list
	for i := range n {
		st.addObject(kind, key(i), ep(i))
		all[key(i)] = ep(i)
	}
	for _, c := range []struct {
		name string
		read func() int
	}{
		{"ordered", func() int { return len(objects[*api.WorkloadEndpoint](st, kind)) }},
		{"sorted", func() int { return len(sortedValues(all)) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				st.removeObject(kind, key(i%n))
				delete(all, key(i%n))
				e := ep(i % n)
				st.addObject(kind, key(i%n), e)
				all[key(i%n)] = e
				if c.read() != n {
					b.Fatal("lost an endpoint")
				}
			}
		})
	}
	// Remote pods come and go (a new key, an old one gone) and an owner
	// reads the list after every 64th: most events wake no owner.
	b.Run("churn-read-1/64", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			st.addObject(kind, key(n+i), ep(n+i))
			st.removeObject(kind, key(i))
			if i%64 == 63 && len(objects[*api.WorkloadEndpoint](st, kind)) != n {
				b.Fatal("lost an endpoint")
			}
		}
	})
}
