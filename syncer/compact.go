package syncer

import "github.com/tabbynet/tabby/api"

// An agent's view holds every endpoint of the cluster, and of an endpoint
// of another node its owners read only what selects it and where it is.
// The view keeps those in a type of their own, api.RemoteEndpoint (144
// bytes against the whole type's 352, and no per-node index entry): at
// 30,000 endpoints the whole type was the largest item of an agent's heap
// (docs/scale.md, "Compact remote endpoints").

// CompactRemote makes the view keep the endpoints whose spec.node is not
// node as *api.RemoteEndpoint, a kind of their own (RemoteEndpoints,
// Update[api.RemoteEndpoint]); the agent's own node keeps its endpoints
// whole (Endpoints, EndpointsOn, Update[api.WorkloadEndpoint]). An
// endpoint whose node changes between this node and another is removed as
// one kind and added as the other. Call it before Run; a view without it
// (the Kubernetes controllers', which read every endpoint's annotations)
// keeps every endpoint whole.
func (s *Syncer) CompactRemote(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.localNode = node
}

// compact returns what the view keeps of a freshly decoded endpoint.
func (st *state) compact(w *api.WorkloadEndpoint, rev int64) (kind string, val any) {
	if st.localNode == "" || w.Spec.Node == st.localNode {
		return api.KindWorkloadEndpoint, w
	}
	return kindRemote, w.Remote(rev)
}
