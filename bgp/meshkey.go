package bgp

import (
	"fmt"

	"github.com/tabbynet/tabby/api"
)

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
		if peers[i].IsCluster() && peers[i].Password == "" && peers[i].PasswordRef == nil {
			peers[i].Password = password
		}
	}
	return peers
}

// MeshPassword is the password of cluster sessions without Secret
// references: BGPConfiguration's plain nodeMeshPassword when set, else the
// cluster's generated mesh key (datastore.BGPMeshKeyKey), else none. See
// MeshPasswordFrom for a nodeMeshPassword that names a Secret key.
func MeshPassword(cfg *api.BGPConfiguration, meshKey string) string {
	pw, _ := MeshPasswordFrom(cfg, meshKey, nil)
	return pw
}

// MeshPasswordFrom is MeshPassword resolving a nodeMeshPassword that
// names a Secret key through lookup. A reference that does not resolve
// gives the mesh key and the reason: the caller decides (the agent keeps
// the last password that resolved).
func MeshPasswordFrom(cfg *api.BGPConfiguration, meshKey string, lookup PasswordLookup) (string, error) {
	if cfg == nil {
		return meshKey, nil
	}
	np := cfg.Spec.NodeMeshPassword
	if ref := np.SecretKeyRef; ref != nil {
		v, err := lookupPassword(lookup, *ref)
		if err != nil {
			return meshKey, fmt.Errorf("spec.nodeMeshPassword: %w", err)
		}
		return v, nil
	}
	if np.Value != "" {
		return np.Value, nil
	}
	return meshKey, nil
}
