package syncer

import (
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// Services returns every Service record (written by
// tabby-kube-controllers), by key.
func (s *Syncer) Services() []*api.Service {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return objects[*api.Service](s.st, api.KindService)
}

// Endpoint returns one whole WorkloadEndpoint (in a view with
// CompactRemote, only one of its node).
func (s *Syncer) Endpoint(namespace, name string) (*api.WorkloadEndpoint, bool) {
	key, err := datastore.ResourceKey(api.KindWorkloadEndpoint, namespace, name)
	if err != nil {
		return nil, false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return object[*api.WorkloadEndpoint](s.st, api.KindWorkloadEndpoint, key)
}

// Service returns one Service record.
func (s *Syncer) Service(namespace, name string) (*api.Service, bool) {
	key, err := datastore.ResourceKey(api.KindService, namespace, name)
	if err != nil {
		return nil, false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return object[*api.Service](s.st, api.KindService, key)
}

// NodeBGPConfiguration returns node's own BGPConfiguration (named
// api.NodeConfigName(node)), nil when it has none. It is shared: read-only.
func (s *Syncer) NodeBGPConfiguration(node string) *api.BGPConfiguration {
	key, err := datastore.ResourceKey(api.KindBGPConfiguration, "", api.NodeConfigName(node))
	if err != nil {
		return nil
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	c, _ := object[*api.BGPConfiguration](s.st, api.KindBGPConfiguration, key)
	return c
}
