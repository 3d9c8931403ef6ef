package syncer

import (
	"maps"
	"net/netip"
	"slices"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// Typed reads of the view. Each takes the read lock once; slices are new,
// the objects in them are shared and must not be modified.

// Nodes returns every decodable Node, by name.
func (s *Syncer) Nodes() []*api.Node {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return objects[*api.Node](s.st, api.KindNode)
}

// Node returns one Node.
func (s *Syncer) Node(name string) (*api.Node, bool) {
	return named[*api.Node](s, api.KindNode, "", name)
}

// NodeRecordExists reports whether a Node's key exists, even if its record
// does not decode.
func (s *Syncer) NodeRecordExists(name string) bool {
	key, err := datastore.ResourceKey(api.KindNode, "", name)
	if err != nil {
		return false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	_, ok := s.st.items[key]
	_, bad := s.st.bad[key]
	return ok || bad
}

// UnreadableBlocks returns the keys of the IPAM blocks whose record does
// not decode, sorted. The view keeps each as it was last seen (or as its
// key and claim say), so that its node still routes and advertises it.
func (s *Syncer) UnreadableBlocks() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.st.unreadableBlocks()
}

// Pools returns every IPPool, by name.
func (s *Syncer) Pools() []*api.IPPool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return objects[*api.IPPool](s.st, api.KindIPPool)
}

// BGPConfiguration returns the cluster's BGP configuration with defaults
// applied (the defaults alone when none is stored). The result is a copy.
func (s *Syncer) BGPConfiguration() *api.BGPConfiguration {
	s.mu.RLock()
	cfgs := objects[*api.BGPConfiguration](s.st, api.KindBGPConfiguration)
	s.mu.RUnlock()
	bc := &api.BGPConfiguration{Metadata: api.ObjectMeta{Name: api.SingletonName}}
	for _, c := range cfgs {
		if c.Metadata.Name == api.SingletonName {
			cp := *c // SetDefaults sets top-level spec fields only
			bc = &cp
		}
	}
	bc.SetDefaults()
	return bc
}

// BGPPeers returns every BGPPeer, by name.
func (s *Syncer) BGPPeers() []*api.BGPPeer {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return objects[*api.BGPPeer](s.st, api.KindBGPPeer)
}

// BGPFilters returns every BGPFilter, by name.
func (s *Syncer) BGPFilters() []*api.BGPFilter {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return objects[*api.BGPFilter](s.st, api.KindBGPFilter)
}

// Endpoints returns every whole WorkloadEndpoint of the cluster, by key:
// in a view with CompactRemote, those of its node (the others are
// RemoteEndpoints').
func (s *Syncer) Endpoints() []*api.WorkloadEndpoint {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return objects[*api.WorkloadEndpoint](s.st, api.KindWorkloadEndpoint)
}

// RemoteEndpoints returns the endpoints of other nodes a view with
// CompactRemote holds, by key (none without it).
func (s *Syncer) RemoteEndpoints() []*api.RemoteEndpoint {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return objects[*api.RemoteEndpoint](s.st, kindRemote)
}

// Endpoint returns one whole WorkloadEndpoint (in a view with
// CompactRemote, only one of its node).
func (s *Syncer) Endpoint(namespace, name string) (*api.WorkloadEndpoint, bool) {
	return named[*api.WorkloadEndpoint](s, api.KindWorkloadEndpoint, namespace, name)
}

// named returns the object of a kind stored under namespace and name.
func named[T api.Object](s *Syncer, kind, namespace, name string) (T, bool) {
	key, err := datastore.ResourceKey(kind, namespace, name)
	if err != nil {
		var zero T
		return zero, false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return object[T](s.st, kind, key)
}

// EndpointsOn returns the whole WorkloadEndpoints of one node, by key (in
// a view with CompactRemote, none of another node: RemoteEndpoints).
func (s *Syncer) EndpointsOn(node string) []*api.WorkloadEndpoint {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return sortedValues(s.st.epByNode[node])
}

// NetworkPolicies returns every NetworkPolicy, by key.
func (s *Syncer) NetworkPolicies() []*api.NetworkPolicy {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return objects[*api.NetworkPolicy](s.st, api.KindNetworkPolicy)
}

// GlobalNetworkPolicies returns every GlobalNetworkPolicy, by name.
func (s *Syncer) GlobalNetworkPolicies() []*api.GlobalNetworkPolicy {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return objects[*api.GlobalNetworkPolicy](s.st, api.KindGlobalNetworkPolicy)
}

// Blocks returns every block as BGP and routing see it, by CIDR.
func (s *Syncer) Blocks() []ipam.BlockInfo {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]ipam.BlockInfo, 0, len(s.st.blocks))
	for _, b := range sortedPrefixValues(s.st.blocks) {
		out = append(out, s.st.blockInfo(b))
	}
	return out
}

// BlocksOf returns the blocks affine to node, by CIDR.
func (s *Syncer) BlocksOf(node string) []ipam.BlockInfo {
	s.mu.RLock()
	defer s.mu.RUnlock()
	bs := sortedPrefixValues(s.st.blocksByNode[node])
	out := make([]ipam.BlockInfo, 0, len(bs))
	for _, b := range bs {
		out = append(out, s.st.blockInfo(b))
	}
	return out
}

// InBlocksOf reports whether a lies in a block affine to node (BlocksOf
// without the copy: asked on CNI ADD's path).
func (s *Syncer) InBlocksOf(node string, a netip.Addr) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for cidr := range s.st.blocksByNode[node] {
		if cidr.Contains(a) {
			return true
		}
	}
	return false
}

// BorrowedBy returns the addresses node uses from blocks not affine to it,
// by address, with their pool's DisableBGPExport.
func (s *Syncer) BorrowedBy(node string) []ipam.BorrowedAddr {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]ipam.BorrowedAddr, 0, len(s.st.borrowedBy[node]))
	for _, b := range s.st.borrowedBy[node] {
		if p, ok := s.st.poolOf(b.Block); ok {
			b.DisableBGPExport = p.Spec.DisableBGPExport
		}
		out = append(out, b)
	}
	slices.SortFunc(out, func(x, y ipam.BorrowedAddr) int { return x.Addr.Compare(y.Addr) })
	return out
}

// NodesWithState returns the names of the nodes that hold blocks, block
// claims, borrowed addresses or workload endpoints, sorted: the
// candidates of node garbage collection.
func (s *Syncer) NodesWithState() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	set := map[string]bool{}
	for n := range s.st.blocksByNode {
		set[n] = true
	}
	for n := range s.st.affinities {
		set[n] = true
	}
	for n := range s.st.borrowedBy {
		set[n] = true
	}
	for n := range s.st.epByNode {
		set[n] = true
	}
	for n := range s.st.remoteByNode {
		set[n] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// PolicyCount returns how many NetworkPolicies, GlobalNetworkPolicies and staged ones
// the view holds; cheap enough for a subscription filter.
func (s *Syncer) PolicyCount() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.st.count(api.KindNetworkPolicy) + s.st.count(api.KindGlobalNetworkPolicy) + s.st.count(api.KindStagedGlobalNetworkPolicy)
}

// NodeGCRecords returns node GC's records (gc/nodes/<node>) as stored,
// with their revisions, by key.
func (s *Syncer) NodeGCRecords() []datastore.KV {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return sortedValues(s.st.nodeGC)
}

// BGPMeshKey returns the cluster's BGP mesh key (datastore.BGPMeshKeyKey),
// "" when there is none or it does not decode.
func (s *Syncer) BGPMeshKey() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.st.meshKey
}

// BGPSecrets returns the Secret keys tabby-kube-controllers copied for BGP
// passwords (datastore.BGPSecretsKey); empty when there is no record or it
// does not decode. Shared with the view: read-only.
func (s *Syncer) BGPSecrets() datastore.BGPSecrets {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.st.bgpSecrets
}
