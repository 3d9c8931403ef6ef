package syncer

import (
	"github.com/tabbynet/tabby/api"
)

// Services returns every Service record (written by
// tabby-kube-controllers), by key.
func (s *Syncer) Services() []*api.Service {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return objects[*api.Service](s.st, api.KindService)
}

// Service returns one Service record.
func (s *Syncer) Service(namespace, name string) (*api.Service, bool) {
	return named[*api.Service](s, api.KindService, namespace, name)
}

// NodeBGPConfiguration returns node's own BGPConfiguration (named
// api.NodeConfigName(node)), nil when it has none. It is shared: read-only.
func (s *Syncer) NodeBGPConfiguration(node string) *api.BGPConfiguration {
	c, _ := named[*api.BGPConfiguration](s, api.KindBGPConfiguration, "", api.NodeConfigName(node))
	return c
}
