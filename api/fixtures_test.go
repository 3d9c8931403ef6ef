package api

// Valid objects of every kind, which tests mutate into invalid ones.

func ptr[T any](v T) *T { return &v }

func validNode() *Node {
	return &Node{
		Metadata: ObjectMeta{Name: "node-1", Labels: map[string]string{"rack": "r1", "tabby.dev/rr": "true"}},
		Spec: NodeSpec{
			Addresses: []NodeAddress{{Address: "198.18.0.2", Type: "InternalIP"}},
			BGP:       &NodeBGPSpec{IPv4Address: "198.18.0.2/24", ASNumber: ptr(uint32(65001)), RouteReflectorClusterID: "224.0.0.1"},
		},
	}
}

func validPool() *IPPool {
	return &IPPool{
		Metadata: ObjectMeta{Name: "default-pool"},
		Spec: IPPoolSpec{CIDR: "10.244.0.0/16", BlockSize: 26, NATOutgoing: true, BGPCommunities: []string{"65001:100", "0:0"},
			BGPLargeCommunities: []string{"4200000001:1:100"}, BGPAggregate: AggregateWithBlocks,
			NodeSelector: &LabelSelector{MatchExpressions: []LabelSelectorRequirement{{Key: "rack", Operator: OpIn, Values: []string{"r1", "r2"}}}}},
	}
}

func validIPAMConfig() *IPAMConfig {
	return &IPAMConfig{Metadata: ObjectMeta{Name: "default"}, Spec: IPAMConfigSpec{StrictAffinity: true, MaxBlocksPerHost: 4}}
}

func validBGPConfig() *BGPConfiguration {
	return &BGPConfiguration{
		Metadata: ObjectMeta{Name: "default"},
		Spec: BGPConfigurationSpec{
			ASNumber: ptr(uint32(64512)), NodeToNodeMeshEnabled: ptr(false), ListenPort: ptr(uint16(1179)),
			NodeMeshPassword: BGPPassword{SecretKeyRef: &SecretKeyRef{Name: "bgp-mesh", Key: "password"}}, KeepaliveTime: &Duration{3e9}, HoldTime: &Duration{9e9},
			NodeMeshMaxRestartTime: &Duration{120e9},
		},
	}
}

func validPeer() *BGPPeer {
	return &BGPPeer{
		Metadata: ObjectMeta{Name: "tor-1"},
		Spec: BGPPeerSpec{
			PeerIP: "198.18.0.1", ASNumber: 65000,
			NodeSelector: &LabelSelector{MatchLabels: map[string]string{"rack": "r1"}},
			Password:     BGPPassword{SecretKeyRef: &SecretKeyRef{Name: "bgp-tor", Key: "md5"}}, HoldTime: &Duration{30e9}, SourceAddress: SourceAddressUseNodeIP,
			AcceptDefault: true, MaxPrefixes: 100, Filters: []string{"tor-in", "tor-out"},
			BFD:           &BGPPeerBFD{Enabled: true, Interval: &Duration{100e6}, Multiplier: ptr(uint32(5))},
			LocalASNumber: 65010, NextHopMode: NextHopModeKeep,
		},
	}
}

func validFilter() *BGPFilter {
	return &BGPFilter{
		Metadata: ObjectMeta{Name: "tor-in"},
		Spec: BGPFilterSpec{
			ImportV4: []BGPFilterRule{
				{CIDR: "203.0.113.0/24", MatchOperator: MatchOperatorIn, PrefixLength: &BGPFilterPrefixLength{Min: ptr(int32(25)), Max: ptr(int32(28))}, Action: FilterActionAccept},
				{CIDR: "0.0.0.0/0", MatchOperator: MatchOperatorEqual, Action: FilterActionAccept},
				{CIDR: "198.51.100.0/24", MatchOperator: MatchOperatorNotIn, Action: FilterActionReject},
				{Communities: &BGPFilterCommunityMatch{Values: []string{"65001:1:7"}}, ASPathPrefix: []uint32{65001}, PeerType: FilterPeerEBGP, Action: FilterActionAccept,
					Operations: []BGPFilterOperation{{AddCommunity: &BGPFilterAddCommunity{Value: "65010:20"}}, {SetLocalPreference: &BGPFilterSetLocalPreference{Value: 200}}}},
			},
			ExportV4: []BGPFilterRule{{CIDR: "10.244.128.0/17", MatchOperator: MatchOperatorIn, Action: FilterActionReject}, {Action: FilterActionAccept}},
			ImportV6: []BGPFilterRule{
				{CIDR: "2001:db8:77::/48", MatchOperator: MatchOperatorIn, PrefixLength: &BGPFilterPrefixLength{Max: ptr(int32(64))}, Action: FilterActionAccept},
				{CIDR: "::/0", MatchOperator: MatchOperatorEqual, Action: FilterActionAccept},
			},
			ExportV6: []BGPFilterRule{{CIDR: "fd00:10:244:8000::/49", MatchOperator: MatchOperatorIn, PrefixLength: &BGPFilterPrefixLength{Min: ptr(int32(122)), Max: ptr(int32(128))}, Action: FilterActionReject}},
		},
	}
}

func validRRPeer() *BGPPeer {
	return &BGPPeer{
		Metadata: ObjectMeta{Name: "to-rr"},
		Spec: BGPPeerSpec{
			NodeSelector: &LabelSelector{MatchExpressions: []LabelSelectorRequirement{{Key: "tabby.dev/rr", Operator: OpDoesNotExist}}},
			PeerSelector: &LabelSelector{MatchExpressions: []LabelSelectorRequirement{{Key: "tabby.dev/rr", Operator: OpExists}}},
		},
	}
}

func validWEP() *WorkloadEndpoint {
	return &WorkloadEndpoint{
		Metadata: ObjectMeta{Name: "node--1-k8s-web-0-eth0", Namespace: "default", Labels: map[string]string{"app": "web"}},
		Spec: WorkloadEndpointSpec{
			Node: "node-1", Orchestrator: "k8s", Pod: "web-0", ContainerID: "0123456789abcdef",
			Endpoint: "eth0", InterfaceName: "cali0123456789a", MAC: "ee:ee:ee:ee:ee:ee",
			IPNetworks: []string{"10.244.1.5/32"}, IPAMHandle: "tabby.0123456789abcdef",
			NamespaceLabels: map[string]string{"kubernetes.io/metadata.name": "default"},
			Ports:           []EndpointPort{{Name: "http", Protocol: ProtocolTCP, Port: 8080}},
		},
	}
}

func validNetPol() *NetworkPolicy {
	return &NetworkPolicy{
		Metadata: ObjectMeta{Name: "allow-web", Namespace: "default"},
		Spec: NetworkPolicySpec{
			PodSelector: LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []NetworkPolicyIngressRule{{
				Ports: []NetworkPolicyPort{
					{Protocol: ptr(ProtocolTCP), Port: ptr(FromInt(8000)), EndPort: ptr(int32(8080))},
					{Port: ptr(FromString("http"))},
				},
				From: []NetworkPolicyPeer{
					{PodSelector: &LabelSelector{MatchLabels: map[string]string{"app": "client"}}},
					{IPBlock: &IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}},
				},
			}},
			Egress:      []NetworkPolicyEgressRule{{To: []NetworkPolicyPeer{{NamespaceSelector: &LabelSelector{}}}}},
			PolicyTypes: []PolicyType{PolicyTypeIngress, PolicyTypeEgress},
		},
	}
}

func validGNP() *GlobalNetworkPolicy {
	return &GlobalNetworkPolicy{
		Metadata: ObjectMeta{Name: "deny-db"},
		Spec: GlobalNetworkPolicySpec{
			Order:    ptr(100.0),
			Selector: &LabelSelector{MatchLabels: map[string]string{"role": "db"}},
			Types:    []PolicyType{PolicyTypeIngress, PolicyTypeEgress},
			Ingress: []Rule{
				{Action: ActionAllow, Protocol: ptr(ProtocolTCP), Source: EntityRule{Nets: []string{"10.244.0.0/16"}},
					Destination: EntityRule{Ports: []IntOrString{FromInt(5432), FromString("6000:6010"), FromString("metrics")}}},
				{Action: ActionDeny},
			},
			Egress: []Rule{{Action: ActionAllow, Protocol: ptr(ProtocolICMP), Destination: EntityRule{NotNets: []string{"192.168.0.0/16"}}},
				{Action: ActionAllow, Protocol: ptr(ProtocolICMPv6), Destination: EntityRule{Nets: []string{"fd00::/8"}}}},
		},
	}
}

// validObjects returns one or more valid objects of every kind.
func validObjects() []Object {
	return []Object{validNode(), validPool(), validIPAMConfig(), validBGPConfig(), validPeer(), validRRPeer(), validFilter(),
		validWEP(), validNetPol(), validGNP(),
		func() Object {
			w := validWEP()
			w.Metadata.Name, w.Spec.IPNetworks = "dual-stack", []string{"10.244.1.5/32", "fd00:10:244::5/128"}
			return w
		}(),
		func() Object {
			p := validNetPol()
			p.Metadata.Name = "ipv6-block"
			p.Spec.Egress[0].To = []NetworkPolicyPeer{{IPBlock: &IPBlock{CIDR: "fd00::/8", Except: []string{"fd00:1::/32"}}}}
			return p
		}(),
		&Node{Metadata: ObjectMeta{Name: "bare"}},
		&IPPool{Metadata: ObjectMeta{Name: "p"}, Spec: IPPoolSpec{CIDR: "10.245.0.0/26"}},
		&IPPool{Metadata: ObjectMeta{Name: "v6"}, Spec: IPPoolSpec{CIDR: "fd00:10:244::/48"}},
		func() Object {
			n := validNode()
			n.Metadata.Name = "dual"
			n.Spec.BGP.IPv6Address = "2001:db8::11/64"
			return n
		}(),
		func() Object {
			w := validWEP()
			w.Spec.IPNetworks = []string{"10.244.1.5/32", "fd00:10:244::5/128"}
			return w
		}(),
		&IPPool{Metadata: ObjectMeta{Name: "v6-small"}, Spec: IPPoolSpec{CIDR: "fd00:10:245::/120", BlockSize: 124}},
		&IPAMConfig{Metadata: ObjectMeta{Name: "default"}},
		&BGPConfiguration{Metadata: ObjectMeta{Name: "default"}},
		&NetworkPolicy{Metadata: ObjectMeta{Name: "deny-all", Namespace: "prod"}},
		&GlobalNetworkPolicy{Metadata: ObjectMeta{Name: "empty"}},
		&BGPFilter{Metadata: ObjectMeta{Name: "empty"}},
	}
}
