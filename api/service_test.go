package api

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/internal/testkit"
)

func validService() *Service {
	return &Service{
		Metadata: ObjectMeta{Name: "web", Namespace: "default"},
		Spec: ServiceSpec{Type: "LoadBalancer", ClusterIPs: []string{"10.96.0.10"}, LoadBalancerIPs: []string{"198.19.0.1"},
			ExternalTrafficPolicy: TrafficPolicyLocal, EndpointNodes: []string{"node-1"}, EndpointAddresses: []string{"10.244.0.5"}},
	}
}

func TestServiceAdvertisementValidation(t *testing.T) {
	nodeCfg := func(spec BGPConfigurationSpec) *BGPConfiguration {
		return &BGPConfiguration{Metadata: ObjectMeta{Name: NodeConfigName("node-1")}, Spec: spec}
	}
	global := func(spec BGPConfigurationSpec) *BGPConfiguration {
		return &BGPConfiguration{Metadata: ObjectMeta{Name: SingletonName}, Spec: spec}
	}
	cidrs := func(s ...string) []ServiceCIDR {
		var out []ServiceCIDR
		for _, c := range s {
			out = append(out, ServiceCIDR{CIDR: c})
		}
		return out
	}
	asn := uint32(65000)
	tests := []struct {
		name string
		obj  Object
		want []string // substrings of the error; none: valid
	}{
		{"global ranges of both families", global(BGPConfigurationSpec{ServiceClusterIPs: cidrs("10.96.0.0/16", "fd00:96::/112"),
			ServiceExternalIPs: cidrs("198.19.8.0/24"), ServiceLoadBalancerIPs: cidrs("198.19.0.0/24", "fd00:19::/120")}), nil},
		{"node overrides", nodeCfg(BGPConfigurationSpec{ServiceLoadBalancerIPs: cidrs("198.19.0.0/25")}), nil},
		{"host bits", global(BGPConfigurationSpec{ServiceClusterIPs: cidrs("10.96.0.1/16")}),
			[]string{`spec.serviceClusterIPs[0].cidr: "10.96.0.1/16" has host bits set (did you mean "10.96.0.0/16"?)`}},
		{"not a CIDR", global(BGPConfigurationSpec{ServiceExternalIPs: cidrs("198.19.8.0/24", "198.19.300.0/24")}),
			[]string{`spec.serviceExternalIPs[1].cidr: "198.19.300.0/24" is not a valid CIDR`}},
		{"missing cidr", global(BGPConfigurationSpec{ServiceLoadBalancerIPs: []ServiceCIDR{{}}}),
			[]string{"spec.serviceLoadBalancerIPs[0].cidr: is required"}},
		{"everything", global(BGPConfigurationSpec{ServiceLoadBalancerIPs: cidrs("::/0")}),
			[]string{`spec.serviceLoadBalancerIPs[0].cidr: "::/0" would advertise every IPv6 address`}},
		{"mapped", global(BGPConfigurationSpec{ServiceClusterIPs: cidrs("::ffff:10.96.0.0/112")}),
			[]string{"spec.serviceClusterIPs[0].cidr", "IPv4-mapped"}},
		{"duplicate", global(BGPConfigurationSpec{ServiceClusterIPs: cidrs("10.96.0.0/16", "10.96.0.0/16")}),
			[]string{`spec.serviceClusterIPs[1].cidr: "10.96.0.0/16" is listed twice (also at [0])`}},
		{"communities", global(BGPConfigurationSpec{PrefixAdvertisements: []PrefixAdvertisement{
			{CIDR: "198.19.0.0/24", Communities: []string{"65001:100", "65001:1:2", "65001:x", "65535:65282"}}, {CIDR: "198.19.0.0/24"}}}),
			[]string{"spec.prefixAdvertisements[0].communities[2]", "spec.prefixAdvertisements[0].communities[3]", "NO_ADVERTISE",
				"spec.prefixAdvertisements[1].communities: is required"}},
		{"cluster-wide field on a node", nodeCfg(BGPConfigurationSpec{ASNumber: &asn}),
			[]string{`spec.asNumber: is cluster-wide: set it in the BGPConfiguration "default", not in a node's "node.node-1"`}},
		{"other name", &BGPConfiguration{Metadata: ObjectMeta{Name: "node."}},
			[]string{`metadata.name: "node.": BGPConfiguration is a singleton`}},
		{"service", validService(), nil},
		{"service bad", func() Object {
			s := validService()
			s.Spec.LoadBalancerIPs = []string{"198.19.0.1/32"}
			s.Spec.ExternalTrafficPolicy = "Nearest"
			s.Spec.EndpointNodes = []string{"Node_1"}
			return s
		}(), []string{`spec.loadBalancerIPs[0]: "198.19.0.1/32" is not an IP address`, `spec.externalTrafficPolicy: "Nearest"`, "spec.endpointNodes[0]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.obj.SetDefaults()
			err := tt.obj.Validate()
			testkit.ErrMentions(t, "Validate()", err, tt.want)
		})
	}
}

func TestNodeConfigGetsNoDefaults(t *testing.T) {
	c := &BGPConfiguration{Metadata: ObjectMeta{Name: NodeConfigName("n1")}}
	c.SetDefaults()
	if c.Spec.ASNumber != nil || c.Spec.ListenPort != nil || c.Spec.NodeToNodeMeshEnabled != nil {
		t.Fatalf("a node's configuration got cluster defaults: %+v", c.Spec)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestEffectiveServices(t *testing.T) {
	g := &BGPConfiguration{Spec: BGPConfigurationSpec{
		ServiceClusterIPs:      []ServiceCIDR{{"10.96.0.0/16"}},
		ServiceLoadBalancerIPs: []ServiceCIDR{{"198.19.0.0/24"}},
		PrefixAdvertisements:   []PrefixAdvertisement{{CIDR: "10.96.0.0/16", Communities: []string{"65001:1"}}},
	}}
	n := &BGPConfiguration{Spec: BGPConfigurationSpec{
		ServiceLoadBalancerIPs: []ServiceCIDR{{"198.19.0.0/25"}},
		ServiceExternalIPs:     []ServiceCIDR{{"198.19.8.0/24"}},
		PrefixAdvertisements:   []PrefixAdvertisement{{CIDR: "198.19.0.0/25", Communities: []string{"65001:2"}}},
	}}
	got := EffectiveServices(g, n)
	want := BGPConfigurationSpec{
		ServiceClusterIPs:      []ServiceCIDR{{"10.96.0.0/16"}},
		ServiceLoadBalancerIPs: []ServiceCIDR{{"198.19.0.0/25"}},
		ServiceExternalIPs:     []ServiceCIDR{{"198.19.8.0/24"}},
		PrefixAdvertisements: []PrefixAdvertisement{{CIDR: "198.19.0.0/25", Communities: []string{"65001:2"}},
			{CIDR: "10.96.0.0/16", Communities: []string{"65001:1"}}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("EffectiveServices (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(g.Spec.ServiceClusterIPs, EffectiveServices(g, nil).ServiceClusterIPs); diff != "" {
		t.Errorf("without a node configuration (-want +got):\n%s", diff)
	}
}
