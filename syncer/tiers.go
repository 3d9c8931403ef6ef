package syncer

import "github.com/tabbynet/tabby/api"

// Tiers returns the effective tiers in evaluation order: the stored ones
// plus the built-in tiers etcd does not hold (api.EffectiveTiers). The
// objects are fresh copies.
func (s *Syncer) Tiers() []*api.Tier {
	s.mu.RLock()
	stored := objects[*api.Tier](s.st, api.KindTier)
	s.mu.RUnlock()
	return api.EffectiveTiers(stored)
}

// StagedGlobalNetworkPolicies returns every StagedGlobalNetworkPolicy, by
// name. The objects are shared: read-only.
func (s *Syncer) StagedGlobalNetworkPolicies() []*api.StagedGlobalNetworkPolicy {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return objects[*api.StagedGlobalNetworkPolicy](s.st, api.KindStagedGlobalNetworkPolicy)
}
