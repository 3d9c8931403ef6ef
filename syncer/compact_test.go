package syncer

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// fullEndpoint is an endpoint with every field a CNI ADD writes set.
func fullEndpoint(node string, i int) *api.WorkloadEndpoint {
	w := testEndpoint(node, i)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	w.Metadata.Labels = map[string]string{"app": "web"}
	w.Metadata.Annotations = map[string]string{api.AnnotationOrigin: api.OriginKubernetes}
	w.Metadata.UID, w.Metadata.CreationTimestamp = "0b5e2c1a-0000-4000-8000-000000000001", &at
	w.Spec.MAC, w.Spec.IPAMHandle = "0e:11:22:33:44:55", "k8s-pod-network."+w.Spec.ContainerID
	w.Spec.NamespaceLabels = map[string]string{"team": "a"}
	w.Spec.Profiles = []string{"kns.default"}
	w.Spec.Ports = []api.EndpointPort{{Name: "http", Protocol: api.ProtocolTCP, Port: 8080}}
	return w
}

// TestCompactRemote: an agent's view keeps its own node's endpoints whole
// and the other nodes' as api.RemoteEndpoint (selection, addresses, named
// ports, pod, revision), a kind of its own; a view without a node keeps
// every endpoint whole. Updates hand out what the view holds, and an
// endpoint moving between nodes leaves one kind and enters the other.
func TestCompactRemote(t *testing.T) {
	local, remote := fullEndpoint("node1", 1), fullEndpoint("node2", 2)
	withRev := func(w *api.WorkloadEndpoint, rev string) *api.WorkloadEndpoint {
		c := *w
		c.Metadata.ResourceVersion = rev
		return &c
	}
	compactRemote := &api.RemoteEndpoint{Namespace: "default", Name: remote.Metadata.Name, Node: "node2", Pod: remote.Spec.Pod,
		Labels: remote.Metadata.Labels, NamespaceLabels: remote.Spec.NamespaceLabels, IPNetworks: remote.Spec.IPNetworks,
		Ports: remote.Spec.Ports, Revision: 3}
	for _, tc := range []struct {
		name, node string
		whole      []*api.WorkloadEndpoint
		wholeOn2   []*api.WorkloadEndpoint
		remote     []*api.RemoteEndpoint
	}{
		{"agent", "node1", []*api.WorkloadEndpoint{withRev(local, "2")}, []*api.WorkloadEndpoint{}, []*api.RemoteEndpoint{compactRemote}},
		{"whole", "", []*api.WorkloadEndpoint{withRev(local, "2"), withRev(remote, "3")}, []*api.WorkloadEndpoint{withRev(remote, "3")}, []*api.RemoteEndpoint{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(nil, slog.New(slog.DiscardHandler))
			if tc.node != "" {
				s.CompactRemote(tc.node)
			}
			s.apply(datastore.Event{Type: datastore.EventResync, Revision: 1})
			fd := Watch[api.WorkloadEndpoint](s, "test", nil)
			fr := Watch[api.RemoteEndpoint](s, "test", nil)
			for i, w := range []*api.WorkloadEndpoint{local, remote} {
				rev := int64(2 + i)
				s.apply(datastore.Event{Type: datastore.EventPut, KV: resourceKV(t, w, rev), Revision: rev})
			}
			if diff := cmp.Diff(tc.whole, s.Endpoints()); diff != "" {
				t.Errorf("Endpoints (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wholeOn2, s.EndpointsOn("node2")); diff != "" {
				t.Errorf("EndpointsOn(node2) (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.remote, s.RemoteEndpoints()); diff != "" {
				t.Errorf("RemoteEndpoints (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{"node1", "node2"}, s.NodesWithState()); diff != "" {
				t.Errorf("NodesWithState (-want +got):\n%s", diff)
			}
			ups, _ := fd.Take()
			var got []*api.WorkloadEndpoint
			for _, u := range ups {
				got = append(got, u.New)
			}
			if diff := cmp.Diff(tc.whole, got); diff != "" {
				t.Errorf("updates' new values (-want +got):\n%s", diff)
			}
			rups, _ := fr.Take()
			var gotRemote []*api.RemoteEndpoint
			for _, u := range rups {
				gotRemote = append(gotRemote, u.New)
			}
			if diff := cmp.Diff(tc.remote, append([]*api.RemoteEndpoint{}, gotRemote...)); diff != "" {
				t.Errorf("remote updates' new values (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCompactRemoteMoves: an endpoint whose node changes between the
// agent's and another leaves one kind (a deletion of it) and enters the
// other (a creation), in that order; its deletion removes it from both.
func TestCompactRemoteMoves(t *testing.T) {
	s := New(nil, slog.New(slog.DiscardHandler))
	s.CompactRemote("node1")
	s.apply(datastore.Event{Type: datastore.EventResync, Revision: 1})
	fd := Watch[api.WorkloadEndpoint](s, "test", nil)
	fr := Watch[api.RemoteEndpoint](s, "test", nil)
	var order []string
	s.Notify("order", On(func(u Update[api.WorkloadEndpoint]) bool {
		order = append(order, fmt.Sprintf("whole %t→%t", u.Old != nil, u.New != nil))
		return true
	}), On(func(u Update[api.RemoteEndpoint]) bool {
		order = append(order, fmt.Sprintf("remote %t→%t", u.Old != nil, u.New != nil))
		return true
	}))
	w := fullEndpoint("node2", 1)
	s.apply(datastore.Event{Type: datastore.EventPut, KV: resourceKV(t, w, 2), Revision: 2})
	w.Spec.Node = "node1"
	s.apply(datastore.Event{Type: datastore.EventPut, KV: resourceKV(t, w, 3), Revision: 3})
	if got := len(s.Endpoints()); got != 1 || len(s.RemoteEndpoints()) != 0 {
		t.Errorf("after the move to node1: %d whole, %d compact endpoints, want 1 and 0", got, len(s.RemoteEndpoints()))
	}
	w.Spec.Node = "node3"
	s.apply(datastore.Event{Type: datastore.EventPut, KV: resourceKV(t, w, 4), Revision: 4})
	if got := s.RemoteEndpoints(); len(got) != 1 || got[0].Node != "node3" || len(s.Endpoints()) != 0 {
		t.Errorf("after the move to node3: %d whole, compact %v, want 0 and one on node3", len(s.Endpoints()), got)
	}
	if diff := cmp.Diff([]string{"node3"}, s.NodesWithState()); diff != "" {
		t.Errorf("NodesWithState (-want +got):\n%s", diff)
	}
	key, _ := datastore.ResourceKey(api.KindWorkloadEndpoint, w.Metadata.Namespace, w.Metadata.Name)
	s.apply(datastore.Event{Type: datastore.EventDelete, KV: datastore.KV{Key: key}, Revision: 5})
	if len(s.Endpoints())+len(s.RemoteEndpoints()) != 0 || len(s.NodesWithState()) != 0 {
		t.Errorf("after the deletion: %d whole, %d compact, nodes %v", len(s.Endpoints()), len(s.RemoteEndpoints()), s.NodesWithState())
	}
	want := []string{"remote false→true", "remote true→false", "whole false→true", "whole true→false", "remote false→true", "remote true→false"}
	if diff := cmp.Diff(want, order); diff != "" {
		t.Errorf("updates in order (-want +got):\n%s", diff)
	}
	ups, _ := fd.Take()
	rups, _ := fr.Take()
	if len(ups) != 2 || len(rups) != 4 {
		t.Errorf("%d whole and %d compact updates, want 2 and 4", len(ups), len(rups))
	}
}
