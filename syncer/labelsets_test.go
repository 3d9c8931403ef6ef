package syncer

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

func labelsEndpoint(t *testing.T, name string, labels map[string]string, rev int64) datastore.KV {
	t.Helper()
	w := &api.WorkloadEndpoint{Metadata: api.ObjectMeta{Namespace: "default", Name: name, Labels: labels},
		Spec: api.WorkloadEndpointSpec{Node: "n1", ContainerID: "c" + name, InterfaceName: "cali" + name,
			IPNetworks: []string{"10.244.0.1/32"}, NamespaceLabels: map[string]string{"kubernetes.io/metadata.name": "default"}}}
	w.SetDefaults()
	return resourceKV(t, w, rev)
}

// Endpoints with equal labels hold one map; each keeps its own labels
// through changes, and the shared sets go with their last holder.
func TestEndpointsShareLabelSets(t *testing.T) {
	s := New(nil, slog.New(slog.DiscardHandler))
	web := map[string]string{"app": "web", "tier": "frontend"}
	put := func(kv datastore.KV) {
		s.apply(datastore.Event{Type: datastore.EventPut, KV: kv, Revision: kv.ModRevision})
	}
	s.apply(datastore.Event{Type: datastore.EventResync, Revision: 1})
	put(labelsEndpoint(t, "a", web, 2))
	put(labelsEndpoint(t, "b", web, 3))
	put(labelsEndpoint(t, "c", map[string]string{"app": "db"}, 4))
	labelsOf := func() map[string]map[string]string {
		out := map[string]map[string]string{}
		for _, w := range s.Endpoints() {
			out[w.Metadata.Name] = w.Metadata.Labels
		}
		return out
	}
	want := map[string]map[string]string{"a": web, "b": web, "c": {"app": "db"}}
	if d := cmp.Diff(want, labelsOf()); d != "" {
		t.Fatalf("labels (-want +got):\n%s", d)
	}
	eps := s.Endpoints()
	eps[0].Metadata.Labels["probe"] = "x" // a and b must hold one map
	if eps[1].Metadata.Labels["probe"] != "x" {
		t.Errorf("a and b hold different maps of equal labels")
	}
	delete(eps[0].Metadata.Labels, "probe")
	// Labels: web, db; namespace labels: one set for all.
	if got := len(s.st.labels.sets); got != 3 {
		t.Errorf("%d label sets, want 3 (web, db, the namespace's)", got)
	}

	// b changes its labels: a keeps web.
	put(labelsEndpoint(t, "b", map[string]string{"app": "db"}, 5))
	want["b"] = map[string]string{"app": "db"}
	if d := cmp.Diff(want, labelsOf()); d != "" {
		t.Fatalf("after b's change (-want +got):\n%s", d)
	}
	for _, k := range []string{"a", "b", "c"} {
		key, _ := datastore.ResourceKey(api.KindWorkloadEndpoint, "default", k)
		s.apply(datastore.Event{Type: datastore.EventDelete, KV: datastore.KV{Key: key}, Revision: 6})
	}
	if got := len(s.st.labels.sets); got != 0 {
		t.Errorf("%d label sets left after every endpoint went, want 0", got)
	}
}

// A re-list hands back the records the view holds: nothing is decoded
// again, no update is made, the objects stay the same.
func TestResyncKeepsHeldRecords(t *testing.T) {
	s := New(nil, slog.New(slog.DiscardHandler))
	a := labelsEndpoint(t, "a", map[string]string{"app": "web"}, 2)
	s.apply(datastore.Event{Type: datastore.EventResync, Snapshot: []datastore.KV{a}, Revision: 2})
	before := s.Endpoints()[0]
	updates := s.Stats().Updates
	s.apply(datastore.Event{Type: datastore.EventResync, Snapshot: []datastore.KV{a}, Revision: 3})
	if s.Endpoints()[0] != before {
		t.Errorf("the re-list replaced the held endpoint")
	}
	if got := s.Stats().Updates - updates; got != 0 {
		t.Errorf("the re-list made %d updates, want 0", got)
	}
	// A new revision of the key is decoded.
	b := labelsEndpoint(t, "a", map[string]string{"app": "db"}, 4)
	s.apply(datastore.Event{Type: datastore.EventResync, Snapshot: []datastore.KV{b}, Revision: 4})
	if got := s.Endpoints()[0].Metadata.Labels["app"]; got != "db" {
		t.Errorf("after a new revision: app = %q, want db", got)
	}
}

// An endpoint record that does not decode (malformed JSON, a label that is
// not a string) is reported once and left out of the view; the version
// the view held goes with it.
func TestMalformedEndpointSkipped(t *testing.T) {
	var logged bytes.Buffer
	s := New(nil, slog.New(slog.NewTextHandler(&logged, nil)))
	s.apply(datastore.Event{Type: datastore.EventResync, Revision: 1})
	good := labelsEndpoint(t, "a", map[string]string{"app": "web"}, 2)
	s.apply(datastore.Event{Type: datastore.EventPut, KV: good, Revision: 2})
	for i, bad := range []string{`{"metadata":{"name":"a"`, `{"metadata":{"name":"a","namespace":"default","labels":{"app":7}}}`} {
		kv := datastore.KV{Key: good.Key, Value: []byte(bad), ModRevision: int64(3 + i)}
		s.apply(datastore.Event{Type: datastore.EventPut, KV: kv, Revision: kv.ModRevision})
		if got := len(s.Endpoints()); got != 0 {
			t.Errorf("%s: the view holds %d endpoints, want 0", bad, got)
		}
	}
	if n := strings.Count(logged.String(), "skipping a record that does not decode"); n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, logged.String())
	}
	s.apply(datastore.Event{Type: datastore.EventPut, KV: labelsEndpoint(t, "a", map[string]string{"app": "web"}, 5), Revision: 5})
	if got := len(s.Endpoints()); got != 1 {
		t.Errorf("after a good record again: %d endpoints, want 1", got)
	}
}
