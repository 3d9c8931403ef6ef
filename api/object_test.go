package api

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSetDefaults(t *testing.T) {
	tests := []struct {
		name string
		in   Object
		want Object
	}{
		{"pool", &IPPool{Spec: IPPoolSpec{CIDR: "10.244.0.0/16"}},
			&IPPool{TypeMeta: TypeMeta{APIVersion, KindIPPool}, Spec: IPPoolSpec{CIDR: "10.244.0.0/16", BlockSize: 26}}},
		{"pool keeps block size", &IPPool{Spec: IPPoolSpec{BlockSize: 29}},
			&IPPool{TypeMeta: TypeMeta{APIVersion, KindIPPool}, Spec: IPPoolSpec{BlockSize: 29}}},
		{"ipamconfig", &IPAMConfig{},
			&IPAMConfig{TypeMeta: TypeMeta{APIVersion, KindIPAMConfig}, Spec: IPAMConfigSpec{AutoAllocateBlocks: ptr(true)}}},
		{"ipamconfig keeps false", &IPAMConfig{Spec: IPAMConfigSpec{AutoAllocateBlocks: ptr(false)}},
			&IPAMConfig{TypeMeta: TypeMeta{APIVersion, KindIPAMConfig}, Spec: IPAMConfigSpec{AutoAllocateBlocks: ptr(false)}}},
		{"bgpconfig", &BGPConfiguration{},
			&BGPConfiguration{TypeMeta: TypeMeta{APIVersion, KindBGPConfiguration}, Spec: BGPConfigurationSpec{
				ASNumber: ptr(uint32(64512)), NodeToNodeMeshEnabled: ptr(true), ListenPort: ptr(uint16(179))}}},
		{"bgpconfig keeps mesh off", &BGPConfiguration{Spec: BGPConfigurationSpec{NodeToNodeMeshEnabled: ptr(false), ASNumber: ptr(uint32(65000))}},
			&BGPConfiguration{TypeMeta: TypeMeta{APIVersion, KindBGPConfiguration}, Spec: BGPConfigurationSpec{
				ASNumber: ptr(uint32(65000)), NodeToNodeMeshEnabled: ptr(false), ListenPort: ptr(uint16(179))}}},
		{"peer", &BGPPeer{}, &BGPPeer{TypeMeta: TypeMeta{APIVersion, KindBGPPeer}, Spec: BGPPeerSpec{SourceAddress: SourceAddressUseNodeIP}}},
		{"peer bfd", &BGPPeer{Spec: BGPPeerSpec{BFD: &BGPPeerBFD{Enabled: true}}}, &BGPPeer{TypeMeta: TypeMeta{APIVersion, KindBGPPeer}, Spec: BGPPeerSpec{
			SourceAddress: SourceAddressUseNodeIP, BFD: &BGPPeerBFD{Enabled: true, Interval: &Duration{300e6}, Multiplier: ptr(uint32(3))}}}},
		{"filter operator", &BGPFilter{Spec: BGPFilterSpec{ImportV4: []BGPFilterRule{{CIDR: "10.0.0.0/8", Action: "Accept"}, {Action: "Reject"}}}},
			&BGPFilter{TypeMeta: TypeMeta{APIVersion, KindBGPFilter}, Spec: BGPFilterSpec{ImportV4: []BGPFilterRule{
				{CIDR: "10.0.0.0/8", MatchOperator: MatchOperatorIn, Action: "Accept"}, {Action: "Reject"}}}}},
		{"node", &Node{TypeMeta: TypeMeta{"v1", "Pod"}}, &Node{TypeMeta: TypeMeta{APIVersion, KindNode}}},
		{"wep", &WorkloadEndpoint{Spec: WorkloadEndpointSpec{Ports: []EndpointPort{{Name: "dns", Port: 53}, {Name: "dns", Protocol: "UDP", Port: 53}}}},
			&WorkloadEndpoint{TypeMeta: TypeMeta{APIVersion, KindWorkloadEndpoint}, Spec: WorkloadEndpointSpec{
				Ports: []EndpointPort{{Name: "dns", Protocol: "TCP", Port: 53}, {Name: "dns", Protocol: "UDP", Port: 53}}}}},
		{"netpol ingress only", &NetworkPolicy{Spec: NetworkPolicySpec{Ingress: []NetworkPolicyIngressRule{{Ports: []NetworkPolicyPort{{Port: ptr(FromInt(80))}, {Protocol: ptr("UDP")}}}}}},
			&NetworkPolicy{TypeMeta: TypeMeta{APIVersion, KindNetworkPolicy}, Spec: NetworkPolicySpec{
				Ingress:     []NetworkPolicyIngressRule{{Ports: []NetworkPolicyPort{{Protocol: ptr("TCP"), Port: ptr(FromInt(80))}, {Protocol: ptr("UDP")}}}},
				PolicyTypes: []PolicyType{PolicyTypeIngress}}}},
		{"netpol with egress", &NetworkPolicy{Spec: NetworkPolicySpec{Egress: []NetworkPolicyEgressRule{{Ports: []NetworkPolicyPort{{}}}}}},
			&NetworkPolicy{TypeMeta: TypeMeta{APIVersion, KindNetworkPolicy}, Spec: NetworkPolicySpec{
				Egress:      []NetworkPolicyEgressRule{{Ports: []NetworkPolicyPort{{Protocol: ptr("TCP")}}}},
				PolicyTypes: []PolicyType{PolicyTypeIngress, PolicyTypeEgress}}}},
		{"netpol keeps types", &NetworkPolicy{Spec: NetworkPolicySpec{PolicyTypes: []PolicyType{PolicyTypeEgress}}},
			&NetworkPolicy{TypeMeta: TypeMeta{APIVersion, KindNetworkPolicy}, Spec: NetworkPolicySpec{PolicyTypes: []PolicyType{PolicyTypeEgress}}}},
		{"gnp no rules", &GlobalNetworkPolicy{},
			&GlobalNetworkPolicy{TypeMeta: TypeMeta{APIVersion, KindGlobalNetworkPolicy}, Spec: GlobalNetworkPolicySpec{Types: []PolicyType{PolicyTypeIngress}}}},
		{"gnp egress only", &GlobalNetworkPolicy{Spec: GlobalNetworkPolicySpec{Egress: []Rule{{Action: "Deny"}}}},
			&GlobalNetworkPolicy{TypeMeta: TypeMeta{APIVersion, KindGlobalNetworkPolicy}, Spec: GlobalNetworkPolicySpec{
				Egress: []Rule{{Action: "Deny"}}, Types: []PolicyType{PolicyTypeEgress}}}},
		{"gnp both", &GlobalNetworkPolicy{Spec: GlobalNetworkPolicySpec{Ingress: []Rule{{Action: "Allow"}}, Egress: []Rule{{Action: "Deny"}}}},
			&GlobalNetworkPolicy{TypeMeta: TypeMeta{APIVersion, KindGlobalNetworkPolicy}, Spec: GlobalNetworkPolicySpec{
				Ingress: []Rule{{Action: "Allow"}}, Egress: []Rule{{Action: "Deny"}}, Types: []PolicyType{PolicyTypeIngress, PolicyTypeEgress}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.in.SetDefaults()
			if diff := cmp.Diff(tt.want, tt.in); diff != "" {
				t.Errorf("SetDefaults (-want +got):\n%s", diff)
			}
			tt.in.SetDefaults()
			if diff := cmp.Diff(tt.want, tt.in); diff != "" {
				t.Errorf("second SetDefaults changed the object (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBGPConfigurationGetters(t *testing.T) {
	var nilCfg *BGPConfiguration
	if nilCfg.EffectiveASN() != 64512 || !nilCfg.MeshEnabled() || nilCfg.Port() != 179 {
		t.Errorf("nil config: asn %d mesh %v port %d", nilCfg.EffectiveASN(), nilCfg.MeshEnabled(), nilCfg.Port())
	}
	cfg := &BGPConfiguration{Spec: BGPConfigurationSpec{ASNumber: ptr(uint32(65100)), NodeToNodeMeshEnabled: ptr(false), ListenPort: ptr(uint16(1790))}}
	if cfg.EffectiveASN() != 65100 || cfg.MeshEnabled() || cfg.Port() != 1790 {
		t.Errorf("config: asn %d mesh %v port %d", cfg.EffectiveASN(), cfg.MeshEnabled(), cfg.Port())
	}
	n := validNode()
	if got := n.EffectiveASN(cfg); got != 65001 {
		t.Errorf("node override: EffectiveASN = %d, want 65001", got)
	}
	n.Spec.BGP.ASNumber = nil
	if got := n.EffectiveASN(cfg); got != 65100 {
		t.Errorf("node without override: EffectiveASN = %d, want 65100", got)
	}
	if got := (&Node{}).EffectiveASN(nil); got != 64512 {
		t.Errorf("bare node, nil config: EffectiveASN = %d, want 64512", got)
	}
	if got := n.RouteReflectorClusterID(); got != "224.0.0.1" {
		t.Errorf("RouteReflectorClusterID = %q", got)
	}
	if !(&IPAMConfig{}).AutoAllocate() || (&IPAMConfig{Spec: IPAMConfigSpec{AutoAllocateBlocks: ptr(false)}}).AutoAllocate() {
		t.Error("IPAMConfig.AutoAllocate wrong")
	}
}

func TestPolicyAppliesTo(t *testing.T) {
	np := &NetworkPolicy{Spec: NetworkPolicySpec{Egress: []NetworkPolicyEgressRule{{}}}}
	if in, eg := np.AppliesTo(); !in || !eg {
		t.Errorf("netpol with egress rules: AppliesTo = %v, %v", in, eg)
	}
	gnp := &GlobalNetworkPolicy{Spec: GlobalNetworkPolicySpec{Egress: []Rule{{Action: ActionDeny}}}}
	if in, eg := gnp.AppliesTo(); in || !eg {
		t.Errorf("gnp with only egress rules: AppliesTo = %v, %v", in, eg)
	}
	gnp.Spec.Types = []PolicyType{PolicyTypeIngress, PolicyTypeEgress}
	if in, eg := gnp.AppliesTo(); !in || !eg {
		t.Errorf("gnp with both types: AppliesTo = %v, %v", in, eg)
	}
}

func TestBGPPeerScope(t *testing.T) {
	p := validPeer()
	if p.IsGlobal() || !p.AppliesToNode("x", map[string]string{"rack": "r1"}) || p.AppliesToNode("x", nil) {
		t.Error("selector peer scope wrong")
	}
	p.Spec.NodeSelector = nil
	if !p.IsGlobal() || !p.AppliesToNode("any", nil) {
		t.Error("global peer scope wrong")
	}
	p.Spec.Node = "node-1"
	if p.IsGlobal() || !p.AppliesToNode("node-1", nil) || p.AppliesToNode("node-2", nil) {
		t.Error("node peer scope wrong")
	}
}

func TestIPPoolHelpers(t *testing.T) {
	p := validPool()
	if !p.SelectsNode(map[string]string{"rack": "r2"}) || p.SelectsNode(map[string]string{"rack": "r3"}) {
		t.Error("SelectsNode with selector wrong")
	}
	p.Spec.NodeSelector = nil
	if !p.SelectsNode(nil) {
		t.Error("a pool without nodeSelector must serve every node")
	}
}
