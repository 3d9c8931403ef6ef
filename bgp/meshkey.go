package bgp

import "github.com/tabbynet/tabby/api"

// WithMeshPassword gives every cluster peer (Peer.IsCluster: the mesh,
// route reflectors and their clients, nodes a BGPPeer's peerSelector
// picks) without a password of its own the cluster's mesh password, and
// returns peers. External peers keep theirs, or none. Both ends of a
// cluster session compute it from the same cluster view, so they agree.
// An empty password changes nothing.
func WithMeshPassword(peers []Peer, password string) []Peer {
	if password == "" {
		return peers
	}
	for i := range peers {
		if peers[i].IsCluster() && peers[i].Password == "" {
			peers[i].Password = password
		}
	}
	return peers
}

// MeshPassword is the password of cluster sessions: BGPConfiguration's
// nodeMeshPassword when set, else the cluster's generated mesh key
// (datastore.BGPMeshKeyKey), else none.
func MeshPassword(cfg *api.BGPConfiguration, meshKey string) string {
	if cfg != nil && cfg.Spec.NodeMeshPassword != "" {
		return cfg.Spec.NodeMeshPassword
	}
	return meshKey
}
