package syncer

import (
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
// and, of the other nodes', what their owners read (selection, addresses,
// named ports, revision); a view without a node keeps every endpoint
// whole. Updates hand out what the view holds.
func TestCompactRemote(t *testing.T) {
	local, remote := fullEndpoint("node1", 1), fullEndpoint("node2", 2)
	compactRemote := *remote
	compactRemote.Metadata.Annotations, compactRemote.Metadata.UID, compactRemote.Metadata.CreationTimestamp = nil, "", nil
	compactRemote.Spec.ContainerID, compactRemote.Spec.InterfaceName, compactRemote.Spec.MAC, compactRemote.Spec.IPAMHandle = "", "", "", ""
	for _, tc := range []struct {
		name, node string
		want       []*api.WorkloadEndpoint
	}{
		{"agent", "node1", []*api.WorkloadEndpoint{local, &compactRemote}},
		{"whole", "", []*api.WorkloadEndpoint{local, remote}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(nil, slog.New(slog.DiscardHandler))
			if tc.node != "" {
				s.CompactRemote(tc.node)
			}
			s.apply(datastore.Event{Type: datastore.EventResync, Revision: 1})
			fd := Watch[api.WorkloadEndpoint](s, "test", nil)
			for i, w := range []*api.WorkloadEndpoint{local, remote} {
				rev := int64(2 + i)
				s.apply(datastore.Event{Type: datastore.EventPut, KV: resourceKV(t, w, rev), Revision: rev})
			}
			want := make([]*api.WorkloadEndpoint, len(tc.want))
			for i, w := range tc.want {
				c := *w
				c.Metadata.ResourceVersion = []string{"2", "3"}[i]
				want[i] = &c
			}
			if diff := cmp.Diff(want, s.Endpoints()); diff != "" {
				t.Errorf("Endpoints (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(want[1:], s.EndpointsOn("node2")); diff != "" {
				t.Errorf("EndpointsOn(node2) (-want +got):\n%s", diff)
			}
			ups, _ := fd.Take()
			var got []*api.WorkloadEndpoint
			for _, u := range ups {
				got = append(got, u.New)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("updates' new values (-want +got):\n%s", diff)
			}
		})
	}
}
