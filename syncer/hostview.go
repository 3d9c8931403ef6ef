package syncer

import "github.com/tabbynet/tabby/api"

// HostEndpoints returns every HostEndpoint, by name.
func (s *Syncer) HostEndpoints() []*api.HostEndpoint {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return objects[*api.HostEndpoint](s.st, api.KindHostEndpoint)
}

// ClusterConfiguration returns the stored ClusterConfiguration named
// "default", or nil (every setting at its default) when there is none.
// The object is shared: read-only.
func (s *Syncer) ClusterConfiguration() *api.ClusterConfiguration {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, c := range objects[*api.ClusterConfiguration](s.st, api.KindClusterConfiguration) {
		if c.Metadata.Name == api.SingletonName {
			return c
		}
	}
	return nil
}
