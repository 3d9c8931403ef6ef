package syncer

import "github.com/tabbynet/tabby/api"

// An agent's view holds every endpoint of the cluster, and for an endpoint
// of another node its owners read only what selects it and where it is:
// its name, namespace and node, labels and namespace labels, addresses,
// named ports, profiles, pod name, and its revision (node GC's conditional
// delete). The rest — the container, interface, MAC, IPAM handle, UID,
// creation time and annotations — concerns the node that runs the pod:
// at 30,000 endpoints it was ≈ 40 % of an endpoint's strings in a
// Kubernetes cluster (a 64-character container ID, an 80-character IPAM
// handle, …), held by every agent for nothing (docs/scale.md, "Agent
// memory").

// CompactRemote makes the view keep only the fields above of the
// endpoints whose spec.node is not node (the agent's own node keeps its
// endpoints whole). Call it before Run; a view without it (the Kubernetes
// controllers', which read every endpoint's annotations) keeps every
// endpoint whole. Endpoints, EndpointsOn and the updates of other nodes'
// endpoints then hand out the compact form.
func (s *Syncer) CompactRemote(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.localNode = node
}

// compact clears what an owner of another node's endpoint never reads
// (see CompactRemote). w is freshly decoded: nobody else holds it yet.
func (st *state) compact(w *api.WorkloadEndpoint) {
	if st.localNode == "" || w.Spec.Node == st.localNode {
		return
	}
	m, s := &w.Metadata, &w.Spec
	m.Annotations, m.UID, m.CreationTimestamp = nil, "", nil
	s.ContainerID, s.InterfaceName, s.MAC, s.IPAMHandle = "", "", "", ""
}
