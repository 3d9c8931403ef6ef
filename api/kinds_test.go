package api

import (
	"errors"
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestLookupKind(t *testing.T) {
	tests := map[string]string{
		"IPPool": KindIPPool, "ippool": KindIPPool, "ippools": KindIPPool, "pool": KindIPPool, "POOLS": KindIPPool,
		"bgppeer": KindBGPPeer, "BGPPeers": KindBGPPeer, "bgpfilters": KindBGPFilter, "filter": KindBGPFilter, "BGPFilter": KindBGPFilter,
		"wep": KindWorkloadEndpoint, "workloadendpoints": KindWorkloadEndpoint, "WorkloadEndpoint": KindWorkloadEndpoint,
		"netpol": KindNetworkPolicy, "networkpolicy": KindNetworkPolicy, "networkpolicies": KindNetworkPolicy,
		"gnp": KindGlobalNetworkPolicy, "globalnetworkpolicies": KindGlobalNetworkPolicy,
		"node": KindNode, "nodes": KindNode, "no": KindNode,
		"ipamconfig": KindIPAMConfig, "ipamconfigs": KindIPAMConfig,
		"bgpconfig": KindBGPConfiguration, "bgpconfigurations": KindBGPConfiguration, " BGPConfiguration ": KindBGPConfiguration,
	}
	for in, want := range tests {
		info, ok := LookupKind(in)
		if !ok || info.Kind != want {
			t.Errorf("LookupKind(%q) = %q, %v; want %q", in, info.Kind, ok, want)
		}
	}
	for _, bad := range []string{"", "pod", "List", "ipool", "policys"} {
		if info, ok := LookupKind(bad); ok {
			t.Errorf("LookupKind(%q) = %+v, want not found", bad, info)
		}
	}
}

func TestKindsScope(t *testing.T) {
	got := map[string][2]bool{}
	for _, k := range Kinds() {
		got[k.Kind] = [2]bool{k.Namespaced, k.Singleton}
	}
	want := map[string][2]bool{
		KindNode: {}, KindIPPool: {}, KindIPAMConfig: {false, true}, KindBGPConfiguration: {false, true}, KindBGPPeer: {}, KindBGPFilter: {},
		KindWorkloadEndpoint: {true, false}, KindNetworkPolicy: {true, false}, KindGlobalNetworkPolicy: {}, KindService: {true, false},
		KindHostEndpoint: {}, KindClusterConfiguration: {false, true}, KindTier: {}, KindStagedGlobalNetworkPolicy: {},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Kinds() scope (-want +got):\n%s", diff)
	}
	// Callers may modify what they get.
	Kinds()[1].ShortNames[0] = "mangled"
	if info, _ := LookupKind("pool"); info.ShortNames[0] != "pool" {
		t.Errorf("registry was modified through Kinds(): %v", info.ShortNames)
	}
}

func TestNew(t *testing.T) {
	for _, k := range Kinds() {
		obj, err := New(k.Plural)
		if err != nil {
			t.Fatalf("New(%q): %v", k.Plural, err)
		}
		if got := *obj.GetTypeMeta(); got != (TypeMeta{APIVersion: APIVersion, Kind: k.Kind}) {
			t.Errorf("New(%q) type meta = %+v", k.Plural, got)
		}
		if KindOf(obj) != k.Kind {
			t.Errorf("KindOf(New(%q)) = %q", k.Plural, KindOf(obj))
		}
		if reflect.TypeOf(obj).Elem().Name() != k.Kind {
			t.Errorf("New(%q) is a %T", k.Plural, obj)
		}
	}
	if _, err := New("Pod"); !errors.Is(err, ErrUnknownKind) {
		t.Errorf("New(Pod) error = %v, want ErrUnknownKind", err)
	}
}
