package api

import (
	"errors"
	"fmt"
	"strings"
)

// KindInfo describes one resource kind: how it is spelled on the command line
// and in datastore keys, and how it is scoped.
type KindInfo struct {
	// Kind is the canonical kind ("IPPool").
	Kind string
	// Plural is the lowercase plural used in datastore keys and by tabbyctl
	// ("ippools").
	Plural string
	// ShortNames are further lowercase aliases ("pool").
	ShortNames []string
	// Namespaced kinds require metadata.namespace; the others forbid it.
	Namespaced bool
	// Singleton kinds have exactly one cluster-wide object, named
	// SingletonName (BGPConfiguration also has per-node objects named
	// NodeConfigPrefix + node; see NodeConfigName).
	Singleton bool
}

// ErrUnknownKind is returned (wrapped) for a kind or alias that is not a
// Tabby resource kind.
var ErrUnknownKind = errors.New("unknown kind")

var kinds = []KindInfo{
	{Kind: KindNode, Plural: "nodes", ShortNames: []string{"no"}},
	{Kind: KindIPPool, Plural: "ippools", ShortNames: []string{"pool", "pools", "ipp"}},
	{Kind: KindIPAMConfig, Plural: "ipamconfigs", ShortNames: []string{"ipamconfiguration", "ipamconfigurations", "ipamcfg"}, Singleton: true},
	{Kind: KindBGPConfiguration, Plural: "bgpconfigurations", ShortNames: []string{"bgpconfig", "bgpconfigs", "bgpcfg"}, Singleton: true},
	{Kind: KindBGPPeer, Plural: "bgppeers", ShortNames: []string{"peer", "peers"}},
	{Kind: KindBGPFilter, Plural: "bgpfilters", ShortNames: []string{"filter", "filters"}},
	{Kind: KindWorkloadEndpoint, Plural: "workloadendpoints", ShortNames: []string{"wep", "weps"}, Namespaced: true},
	{Kind: KindNetworkPolicy, Plural: "networkpolicies", ShortNames: []string{"netpol", "netpols", "np", "policy", "policies"}, Namespaced: true},
	{Kind: KindGlobalNetworkPolicy, Plural: "globalnetworkpolicies", ShortNames: []string{"gnp", "gnps"}},
	{Kind: KindService, Plural: "services", ShortNames: []string{"svc", "svcs"}, Namespaced: true},
	{Kind: KindHostEndpoint, Plural: "hostendpoints", ShortNames: []string{"hep", "heps"}},
	{Kind: KindClusterConfiguration, Plural: "clusterconfigurations", ShortNames: []string{"clusterconfig", "clusterconfigs", "clustercfg"}, Singleton: true},
	{Kind: KindTier, Plural: "tiers"},
	{Kind: KindStagedGlobalNetworkPolicy, Plural: "stagedglobalnetworkpolicies", ShortNames: []string{"sgnp", "sgnps"}},
}

// kindIndex maps every lowercase spelling (kind, plural, short names) to its
// entry in kinds.
var kindIndex = func() map[string]int {
	m := make(map[string]int)
	add := func(name string, i int) {
		if _, dup := m[name]; dup {
			panic("api: duplicate kind alias " + name)
		}
		m[name] = i
	}
	for i, k := range kinds {
		add(strings.ToLower(k.Kind), i)
		add(k.Plural, i)
		for _, s := range k.ShortNames {
			add(s, i)
		}
	}
	return m
}()

// Kinds returns every resource kind in a fixed order. The caller may modify
// the result.
func Kinds() []KindInfo {
	out := make([]KindInfo, len(kinds))
	for i, k := range kinds {
		k.ShortNames = append([]string(nil), k.ShortNames...)
		out[i] = k
	}
	return out
}

// LookupKind finds a kind by its canonical name, plural or a short name,
// case-insensitively ("IPPool", "ippools", "pool").
func LookupKind(nameOrAlias string) (KindInfo, bool) {
	k, ok := lookupKind(nameOrAlias)
	k.ShortNames = append([]string(nil), k.ShortNames...)
	return k, ok
}

// kindByName maps each canonical kind name to its index in kinds.
var kindByName = func() map[string]int {
	m := make(map[string]int, len(kinds))
	for i, k := range kinds {
		m[k.Kind] = i
	}
	return m
}()

// lookupKind is LookupKind for the package's own use: a canonical name
// (every decode and validation asks with one) costs one map lookup and
// no allocation, and ShortNames is shared: read-only.
func lookupKind(nameOrAlias string) (KindInfo, bool) {
	i, ok := kindByName[nameOrAlias]
	if !ok {
		i, ok = kindIndex[strings.ToLower(strings.TrimSpace(nameOrAlias))]
	}
	if !ok {
		return KindInfo{}, false
	}
	return kinds[i], true
}

// New returns an empty object of the kind named by kind (anything LookupKind
// accepts) with apiVersion and kind set and nothing else.
func New(kind string) (Object, error) {
	info, ok := lookupKind(kind)
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownKind, kind)
	}
	var obj Object
	switch info.Kind {
	case KindNode:
		obj = &Node{}
	case KindIPPool:
		obj = &IPPool{}
	case KindIPAMConfig:
		obj = &IPAMConfig{}
	case KindBGPConfiguration:
		obj = &BGPConfiguration{}
	case KindBGPPeer:
		obj = &BGPPeer{}
	case KindBGPFilter:
		obj = &BGPFilter{}
	case KindWorkloadEndpoint:
		obj = &WorkloadEndpoint{}
	case KindNetworkPolicy:
		obj = &NetworkPolicy{}
	case KindGlobalNetworkPolicy:
		obj = &GlobalNetworkPolicy{}
	case KindService:
		obj = &Service{}
	case KindHostEndpoint:
		obj = &HostEndpoint{}
	case KindClusterConfiguration:
		obj = &ClusterConfiguration{}
	case KindTier:
		obj = &Tier{}
	case KindStagedGlobalNetworkPolicy:
		obj = &StagedGlobalNetworkPolicy{}
	default:
		panic("api: kind registered without a type: " + info.Kind)
	}
	*obj.GetTypeMeta() = TypeMeta{APIVersion: APIVersion, Kind: info.Kind}
	return obj, nil
}

// KindOf returns the canonical kind of obj's Go type, whatever its TypeMeta
// says, or "" for a type that is not a Tabby resource.
func KindOf(obj Object) string {
	switch obj.(type) {
	case *Node:
		return KindNode
	case *IPPool:
		return KindIPPool
	case *IPAMConfig:
		return KindIPAMConfig
	case *BGPConfiguration:
		return KindBGPConfiguration
	case *BGPPeer:
		return KindBGPPeer
	case *BGPFilter:
		return KindBGPFilter
	case *WorkloadEndpoint:
		return KindWorkloadEndpoint
	case *NetworkPolicy:
		return KindNetworkPolicy
	case *GlobalNetworkPolicy:
		return KindGlobalNetworkPolicy
	case *Service:
		return KindService
	case *HostEndpoint:
		return KindHostEndpoint
	case *ClusterConfiguration:
		return KindClusterConfiguration
	case *Tier:
		return KindTier
	case *StagedGlobalNetworkPolicy:
		return KindStagedGlobalNetworkPolicy
	}
	return ""
}

// kindInfoOf is LookupKind(KindOf(obj)) for a known type.
func kindInfoOf(obj Object) KindInfo {
	info, _ := lookupKind(KindOf(obj))
	return info
}
