package api

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateValid(t *testing.T) {
	for _, obj := range validObjects() {
		t.Run(KindOf(obj)+"/"+obj.GetMeta().Name, func(t *testing.T) {
			if err := obj.Validate(); err != nil {
				t.Fatalf("Validate() before defaults: %v", err)
			}
			obj.SetDefaults()
			if err := obj.Validate(); err != nil {
				t.Fatalf("Validate() after defaults: %v", err)
			}
		})
	}
}

func TestValidateInvalid(t *testing.T) {
	tests := []struct {
		name string
		obj  func() Object
		// want lists substrings of the error, each naming a field path and,
		// where useful, the complaint.
		want []string
	}{
		{"pool bad cidr", func() Object { p := validPool(); p.Spec.CIDR = "10.0.0.0/33"; return p },
			[]string{`spec.cidr: "10.0.0.0/33" is not a valid CIDR`}},
		{"pool missing cidr", func() Object { p := validPool(); p.Spec.CIDR = ""; return p },
			[]string{"spec.cidr: is required"}},
		{"pool ipv6 with an IPv4 block size", func() Object { p := validPool(); p.Spec.CIDR = "fd00::/48"; return p },
			[]string{"spec.blockSize: 26 must be between 116 and 127 for an IPv6 pool"}},
		{"node ipv6 link-local", func() Object { n := validNode(); n.Spec.BGP.IPv6Address = "fe80::1/64"; return n },
			[]string{"spec.bgp.ipv6Address", "cannot be a node address"}},
		{"node ipv6 address is IPv4", func() Object { n := validNode(); n.Spec.BGP.IPv6Address = "198.18.0.2/24"; return n },
			[]string{"spec.bgp.ipv6Address", "is not an IPv6 address"}},
		{"endpoint ipv6 /64", func() Object { w := validWEP(); w.Spec.IPNetworks = []string{"fd00::/64"}; return w },
			[]string{`"fd00::/64" must be a single address, like "fd00::/128"`}},
		{"endpoint link-local", func() Object { w := validWEP(); w.Spec.IPNetworks = []string{"fe80::1/128"}; return w },
			[]string{"is not a pod address"}},
		{"pool ipv6 /128 blocks", func() Object { p := validPool(); p.Spec.CIDR = "fd00::/48"; p.Spec.BlockSize = 128; return p },
			[]string{"spec.blockSize: 128 is not supported"}},
		{"pool ipv6 link-local", func() Object { p := validPool(); p.Spec.CIDR = "fe80::/64"; p.Spec.BlockSize = 122; return p },
			[]string{"spec.cidr:", "reserved range fe80::/10"}},
		{"pool ipv6 default blocks larger than the pool", func() Object { p := validPool(); p.Spec.CIDR = "fd00::/124"; p.Spec.BlockSize = 0; return p },
			[]string{"the default /122 blocks are larger than the pool fd00::/124"}},
		{"pool host bits", func() Object { p := validPool(); p.Spec.CIDR = "10.244.1.0/16"; return p },
			[]string{"spec.cidr:", `did you mean "10.244.0.0/16"`}},
		{"pool overlaps link-local", func() Object { p := validPool(); p.Spec.CIDR = "169.254.0.0/20"; return p },
			[]string{"spec.cidr:", "reserved range 169.254.0.0/16"}},
		{"pool block size too small", func() Object { p := validPool(); p.Spec.BlockSize = 19; return p },
			[]string{"spec.blockSize: 19 must be between 20 and 31"}},
		{"pool block size 32", func() Object { p := validPool(); p.Spec.BlockSize = 32; return p },
			[]string{"spec.blockSize: 32 is not supported", "use 20 to 31"}},
		{"pool block size too big", func() Object { p := validPool(); p.Spec.BlockSize = 33; return p },
			[]string{"spec.blockSize: 33"}},
		{"pool block larger than pool", func() Object { p := validPool(); p.Spec.CIDR = "10.244.0.0/28"; p.Spec.BlockSize = 26; return p },
			[]string{"spec.blockSize:", "larger than the pool"}},
		{"pool default block larger than pool", func() Object { p := validPool(); p.Spec.CIDR = "10.244.0.0/28"; p.Spec.BlockSize = 0; return p },
			[]string{"spec.blockSize:", "at least 28"}},
		{"pool bad name", func() Object { p := validPool(); p.Metadata.Name = "My_Pool"; return p },
			[]string{"metadata.name:", "must be a DNS-1123 subdomain"}},
		{"pool missing name", func() Object { p := validPool(); p.Metadata.Name = ""; return p },
			[]string{"metadata.name: is required"}},
		{"pool with namespace", func() Object { p := validPool(); p.Metadata.Namespace = "default"; return p },
			[]string{"metadata.namespace: must not be set"}},
		{"pool selector In without values", func() Object {
			p := validPool()
			p.Spec.NodeSelector.MatchExpressions[0].Values = nil
			return p
		}, []string{"spec.nodeSelector.matchExpressions[0].values: must not be empty for operator In"}},
		{"pool selector bad operator", func() Object {
			p := validPool()
			p.Spec.NodeSelector.MatchExpressions[0].Operator = "Equals"
			return p
		}, []string{`spec.nodeSelector.matchExpressions[0].operator: "Equals"`}},
		{"wrong kind and apiVersion", func() Object {
			p := validPool()
			p.TypeMeta = TypeMeta{APIVersion: "crd.projectcalico.org/v1", Kind: "Node"}
			return p
		}, []string{"apiVersion:", "kind:"}},
		{"bad label key and value", func() Object {
			p := validPool()
			p.Metadata.Labels = map[string]string{"bad key": "ok", "good": "bad value!", "/x": "", "a.b/" + strings.Repeat("x", 64): ""}
			return p
		}, []string{`metadata.labels["bad key"]`, `metadata.labels["good"]: value "bad value!"`, `metadata.labels["/x"]: key "/x" has an empty prefix`,
			`metadata.labels["a.b/xxx`}},
		{"bad annotation key", func() Object {
			p := validPool()
			p.Metadata.Annotations = map[string]string{"-x": "anything goes"}
			return p
		}, []string{`metadata.annotations["-x"]`}},
		{"ipamconfig name", func() Object { c := validIPAMConfig(); c.Metadata.Name = "other"; return c },
			[]string{`metadata.name: "other": IPAMConfig is a singleton and must be named "default"`}},
		{"ipamconfig negative max", func() Object { c := validIPAMConfig(); c.Spec.MaxBlocksPerHost = -1; return c },
			[]string{"spec.maxBlocksPerHost:"}},
		{"bgpconfig name and asn", func() Object {
			c := validBGPConfig()
			c.Metadata.Name = "mine"
			c.Spec.ASNumber = ptr(uint32(0))
			return c
		}, []string{"metadata.name:", "singleton", "spec.asNumber: 0 is a reserved AS number"}},
		{"bgpconfig port and timers", func() Object {
			c := validBGPConfig()
			c.Spec.ListenPort = ptr(uint16(0))
			c.Spec.KeepaliveTime = &Duration{0}
			c.Spec.HoldTime = &Duration{1500e6}
			c.Spec.NodeMeshMaxRestartTime = &Duration{-1e9}
			return c
		}, []string{"spec.listenPort:", "spec.keepaliveTime: 0s must be greater than zero", "spec.holdTime: 1.5s must be a whole number of seconds",
			"spec.nodeMeshMaxRestartTime: -1s must be greater than zero"}},
		{"bgpconfig keepalive not below hold", func() Object {
			c := validBGPConfig()
			c.Spec.KeepaliveTime = &Duration{9e9}
			return c
		}, []string{"spec.keepaliveTime: 9s must be less than holdTime 9s"}},
		{"bgpconfig long password", func() Object {
			c := validBGPConfig()
			c.Spec.NodeMeshPassword = PlainPassword(strings.Repeat("p", 81))
			return c
		}, []string{"spec.nodeMeshPassword: is 81 bytes long"}},
		{"peer filters and bfd", func() Object {
			p := validPeer()
			p.Spec.Filters = []string{"ok", "", "Bad_Name", "ok"}
			p.Spec.BFD = &BGPPeerBFD{Enabled: true, Interval: &Duration{5e6}, Multiplier: ptr(uint32(0))}
			return p
		}, []string{"spec.filters[1]: must not be empty", `spec.filters[2]: "Bad_Name" must be a DNS-1123`, `spec.filters[3]: "ok" is listed twice`,
			"spec.bfd.interval: 5ms must be between 10ms and 1m0s", "spec.bfd.multiplier: 0 must be between 1 and 255"}},
		{"peer bfd interval not whole ms", func() Object {
			p := validPeer()
			p.Spec.BFD = &BGPPeerBFD{Enabled: true, Interval: &Duration{10500e3}}
			return p
		}, []string{"spec.bfd.interval: 10.5ms must be a whole number of milliseconds"}},
		{"pool communities", func() Object {
			p := validPool()
			p.Spec.BGPCommunities = []string{"65001", "65536:1", "65535:65282", "1:2", "1:2"}
			return p
		}, []string{`spec.bgpCommunities[0]: "65001" is not a community`, `spec.bgpCommunities[1]: "65536:1"`, "spec.bgpCommunities[2]:", "NO_ADVERTISE",
			`spec.bgpCommunities[4]: "1:2" is listed twice`}},
		{"pool large communities", func() Object {
			p := validPool()
			p.Spec.BGPLargeCommunities = []string{"65001:100", "4294967296:1:1", "1:2:x", "1:2:3", "1:2:3", "4294967295:0:4294967295"}
			return p
		}, []string{`spec.bgpLargeCommunities[0]: "65001:100" is not a large community`, `spec.bgpLargeCommunities[1]: "4294967296:1:1" is not a large community`,
			`spec.bgpLargeCommunities[2]: "1:2:x"`, `spec.bgpLargeCommunities[4]: "1:2:3" is listed twice`}},
		{"pool aggregate mode", func() Object {
			p := validPool()
			p.Spec.BGPAggregate = "Always"
			return p
		}, []string{`spec.bgpAggregate: "Always" must be Only or WithBlocks`}},
		{"pool aggregate without export", func() Object {
			p := validPool()
			p.Spec.BGPAggregate, p.Spec.DisableBGPExport = AggregateOnly, true
			return p
		}, []string{"spec.bgpAggregate: Only has no effect with disableBGPExport"}},
		{"filter rules", func() Object {
			f := validFilter()
			f.Spec.ImportV4 = []BGPFilterRule{
				{CIDR: "203.0.113.1/24", MatchOperator: MatchOperatorIn, Action: FilterActionAccept},
				{CIDR: "203.0.113.0/24", MatchOperator: "Contains", Action: "Allow"},
				{MatchOperator: MatchOperatorEqual},
				{CIDR: "203.0.113.0/24", MatchOperator: MatchOperatorEqual, PrefixLength: &BGPFilterPrefixLength{Max: ptr(int32(28))}, Action: FilterActionAccept},
				{CIDR: "203.0.113.0/24", MatchOperator: MatchOperatorIn, PrefixLength: &BGPFilterPrefixLength{Min: ptr(int32(28)), Max: ptr(int32(26))}, Action: FilterActionAccept},
				{CIDR: "203.0.113.0/24", MatchOperator: MatchOperatorIn, PrefixLength: &BGPFilterPrefixLength{Min: ptr(int32(16)), Max: ptr(int32(33))}, Action: FilterActionAccept},
				{PrefixLength: &BGPFilterPrefixLength{Max: ptr(int32(24))}, Action: FilterActionReject},
			}
			f.Spec.ExportV4 = []BGPFilterRule{{CIDR: "fd00::/8", MatchOperator: MatchOperatorIn, Action: FilterActionReject}}
			f.Spec.ImportV6 = []BGPFilterRule{
				{CIDR: "fd00::/8", MatchOperator: MatchOperatorIn, Action: FilterActionReject},
				{CIDR: "10.0.0.0/8", MatchOperator: MatchOperatorIn, Action: FilterActionReject},
				{CIDR: "fd00::1/8", Action: FilterActionReject},
				{CIDR: "2001:db8::/32", MatchOperator: MatchOperatorIn, PrefixLength: &BGPFilterPrefixLength{Min: ptr(int32(48)), Max: ptr(int32(129))}, Action: FilterActionAccept},
				{CIDR: "2001:db8::/32", MatchOperator: MatchOperatorIn, PrefixLength: &BGPFilterPrefixLength{Min: ptr(int32(16))}, Action: FilterActionAccept},
			}
			return f
		}, []string{`spec.importV4[0].cidr: "203.0.113.1/24" has host bits set`,
			`spec.importV4[1].action: "Allow" is not one of Accept, Reject`, `spec.importV4[1].matchOperator: "Contains" is not one of Equal, In, NotIn`,
			"spec.importV4[2].action: is required", "spec.importV4[2].cidr: is required with matchOperator Equal",
			"spec.importV4[3].prefixLength: cannot be used with matchOperator Equal",
			"spec.importV4[4].prefixLength.min: 28 must not be greater than max 26",
			"spec.importV4[5].prefixLength.min: 16 is shorter than the cidr", "spec.importV4[5].prefixLength.max: 33 must be between 0 and 32",
			"spec.importV4[6].prefixLength: requires cidr",
			"spec.exportV4[0].cidr:", "IPv6 is not supported",
			`spec.importV6[1].cidr: "10.0.0.0/8" is not an IPv6 CIDR`, `spec.importV6[2].cidr: "fd00::1/8" has host bits set`,
			"spec.importV6[3].prefixLength.max: 129 must be between 0 and 128",
			"spec.importV6[4].prefixLength.min: 16 is shorter than the cidr"}},
		{"filter name", func() Object { f := validFilter(); f.Metadata.Name = "Tor"; f.Metadata.Namespace = "x"; return f },
			[]string{"metadata.name:", "metadata.namespace: must not be set"}},
		{"peer neither peerIP nor peerSelector", func() Object { p := validPeer(); p.Spec.PeerIP = ""; return p },
			[]string{"spec.peerIP: exactly one of peerIP and peerSelector"}},
		{"peer both peerIP and peerSelector", func() Object {
			p := validPeer()
			p.Spec.PeerSelector = &LabelSelector{}
			return p
		}, []string{"spec.peerSelector: must not be set together with spec.peerIP"}},
		{"peer both node and nodeSelector", func() Object { p := validPeer(); p.Spec.Node = "node-1"; return p },
			[]string{"spec.nodeSelector: must not be set together with spec.node"}},
		{"peer bad ip, asn, source", func() Object {
			p := validPeer()
			p.Spec.PeerIP = "198.18.0.300"
			p.Spec.ASNumber = 23456
			p.Spec.SourceAddress = "Auto"
			return p
		}, []string{`spec.peerIP: "198.18.0.300" is not a valid IP address`, "spec.asNumber: 23456 is a reserved", `spec.sourceAddress: "Auto"`}},
		{"peer ipv6 link-local", func() Object { p := validPeer(); p.Spec.PeerIP = "fe80::1"; return p },
			[]string{"spec.peerIP:", "link-local"}},
		{"peer ipv4-mapped", func() Object { p := validPeer(); p.Spec.PeerIP = "::ffff:198.18.0.1"; return p },
			[]string{"spec.peerIP:", "as IPv4"}},
		{"node router ID", func() Object { n := validNode(); n.Spec.BGP.RouterID = "fd00::1"; return n },
			[]string{"spec.bgp.routerID:", "32 bits"}},
		{"auto reflectors", func() Object {
			c := &BGPConfiguration{TypeMeta: TypeMeta{APIVersion: APIVersion, Kind: KindBGPConfiguration}, Metadata: ObjectMeta{Name: "default"}}
			zero := uint32(0)
			c.Spec.RouteReflectorMode, c.Spec.RouteReflectorsPerZone, c.Spec.ZoneLabel = "auto", &zero, "bad key/"
			return c
		}, []string{"spec.routeReflectorMode:", "Manual or Auto", "spec.routeReflectorsPerZone:", "between 1 and 16", "spec.zoneLabel:"}},
		{"reflector peering value", func() Object {
			c := &BGPConfiguration{TypeMeta: TypeMeta{APIVersion: APIVersion, Kind: KindBGPConfiguration}, Metadata: ObjectMeta{Name: "default"}}
			c.Spec.RouteReflectorMode, c.Spec.RouteReflectorPeering = RouteReflectorModeAuto, "nonclient"
			return c
		}, []string{`spec.routeReflectorPeering: "nonclient" must be NonClient or Client`}},
		{"reflector peering NonClient in manual mode", func() Object {
			c := &BGPConfiguration{TypeMeta: TypeMeta{APIVersion: APIVersion, Kind: KindBGPConfiguration}, Metadata: ObjectMeta{Name: "default"}}
			c.Spec.RouteReflectorPeering = ReflectorPeeringNonClient
			return c
		}, []string{"spec.routeReflectorPeering: NonClient needs routeReflectorMode Auto"}},
		{"peer missing asn", func() Object { p := validPeer(); p.Spec.ASNumber = 0; return p },
			[]string{"spec.asNumber: is required with peerIP"}},
		{"peer selector with asn", func() Object { p := validRRPeer(); p.Spec.ASNumber = 65000; return p },
			[]string{"spec.asNumber: must not be set with peerSelector"}},
		{"peer bad node and durations", func() Object {
			p := validRRPeer()
			p.Spec.NodeSelector = nil
			p.Spec.Node = "Node_1"
			p.Spec.HoldTime = &Duration{2e9}
			p.Spec.MaxRestartTime = &Duration{0}
			return p
		}, []string{"spec.node:", "spec.holdTime: 2s must be between 3s", "spec.maxRestartTime: 0s must be greater than zero"}},
		{"peer Exists with values", func() Object {
			p := validRRPeer()
			p.Spec.PeerSelector.MatchExpressions[0].Values = []string{"x"}
			return p
		}, []string{"spec.peerSelector.matchExpressions[0].values: must be empty for operator Exists"}},
		{"peer selector bad key and value", func() Object {
			p := validRRPeer()
			p.Spec.NodeSelector.MatchExpressions = []LabelSelectorRequirement{{Key: "", Operator: OpNotIn, Values: []string{"ok", "not ok"}}}
			p.Spec.NodeSelector.MatchLabels = map[string]string{"x": "-y"}
			return p
		}, []string{"spec.nodeSelector.matchExpressions[0].key: is required", "spec.nodeSelector.matchExpressions[0].values[1]",
			`spec.nodeSelector.matchLabels["x"]`}},
		{"node bad address, asn, cluster id", func() Object {
			n := validNode()
			n.Spec.BGP.IPv4Address = "198.18.0.2"
			n.Spec.BGP.ASNumber = ptr(uint32(65535))
			n.Spec.BGP.RouteReflectorClusterID = "1.2.3"
			return n
		}, []string{"spec.bgp.ipv4Address:", "not a valid IPv4 CIDR", "spec.bgp.asNumber: 65535", "spec.bgp.routeReflectorClusterID:"}},
		{"node ipv6 address", func() Object { n := validNode(); n.Spec.BGP.IPv4Address = "fd00::2/64"; return n },
			[]string{"spec.bgp.ipv4Address:", "not an IPv4"}},
		{"node addresses", func() Object {
			n := validNode()
			n.Spec.Addresses = []NodeAddress{{Address: ""}, {Address: "host", Type: "InternalIP"}}
			return n
		}, []string{"spec.addresses[0].address: is required", "spec.addresses[1].address"}},
		{"wep required fields", func() Object {
			w := validWEP()
			w.Spec.Node, w.Spec.ContainerID, w.Spec.InterfaceName, w.Spec.IPNetworks = "", "", "", nil
			return w
		}, []string{"spec.node: is required", "spec.containerID: is required", "spec.interfaceName: is required", "spec.ipNetworks: at least one"}},
		{"wep missing namespace", func() Object { w := validWEP(); w.Metadata.Namespace = ""; return w },
			[]string{"metadata.namespace: is required for WorkloadEndpoint"}},
		{"wep bad namespace", func() Object { w := validWEP(); w.Metadata.Namespace = "a.b"; return w },
			[]string{"metadata.namespace:", "DNS-1123 label"}},
		{"wep bad values", func() Object {
			w := validWEP()
			w.Spec.MAC = "ee:ee:ee:ee:ee"
			w.Spec.IPNetworks = []string{"10.244.1.5/24", "10.244.1.300/32", "10.244.1.6"}
			w.Spec.InterfaceName = "cali0123456789abc"
			w.Spec.ContainerID = "has space"
			return w
		}, []string{"spec.mac:", "spec.ipNetworks[0]:", "spec.ipNetworks[1]:", "spec.ipNetworks[2]:", "spec.interfaceName:", "15 characters", "spec.containerID:"}},
		{"wep IPv6 not a single address", func() Object {
			w := validWEP()
			w.Spec.IPNetworks = []string{"10.244.1.5/32", "fd00:10:244::/64", "fe80::1%eth0/128"}
			return w
		}, []string{`spec.ipNetworks[1]: "fd00:10:244::/64" must be a single address, like "fd00:10:244::/128"`, "spec.ipNetworks[2]:"}},
		{"netpol IPv6 ipBlock", func() Object {
			p := validNetPol()
			p.Spec.Egress[0].To = []NetworkPolicyPeer{{IPBlock: &IPBlock{CIDR: "fd00::/8", Except: []string{"10.0.0.0/8", "fd00::/8", "fd00:1::/32"}}}}
			return p
		}, []string{"spec.egress[0].to[0].ipBlock.except[0]: 10.0.0.0/8 must be strictly inside", "spec.egress[0].to[0].ipBlock.except[1]: fd00::/8 must be strictly inside"}},
		{"wep ports", func() Object {
			w := validWEP()
			w.Spec.Ports = []EndpointPort{{Name: "HTTP", Port: 80}, {Name: "dns", Protocol: "ICMP", Port: 0}, {Name: "http", Protocol: "TCP", Port: 1}, {Name: "http", Port: 2}}
			return w
		}, []string{"spec.ports[0].name:", "spec.ports[1].protocol:", "spec.ports[1].port:", `spec.ports[3].name: "http" is listed twice`}},
		{"netpol cluster-scoped", func() Object { p := validNetPol(); p.Metadata.Namespace = ""; return p },
			[]string{"metadata.namespace: is required"}},
		{"netpol ports", func() Object {
			p := validNetPol()
			p.Spec.Ingress[0].Ports = []NetworkPolicyPort{
				{Protocol: ptr("ICMP")},
				{Port: ptr(FromInt(0))},
				{Port: ptr(FromInt(9000)), EndPort: ptr(int32(8000))},
				{Port: ptr(FromString("http")), EndPort: ptr(int32(8000))},
				{EndPort: ptr(int32(8000))},
				{Port: ptr(FromString("80"))},
				{Port: ptr(FromInt(70000))},
			}
			return p
		}, []string{`spec.ingress[0].ports[0].protocol: "ICMP" is not one of TCP, UDP, SCTP`, "spec.ingress[0].ports[1].port: 0",
			"spec.ingress[0].ports[2].endPort: 8000 must not be less than port 9000", "spec.ingress[0].ports[3].endPort: cannot be used with the named port",
			"spec.ingress[0].ports[4].endPort: requires port", "spec.ingress[0].ports[5].port:", "spec.ingress[0].ports[6].port: 70000"}},
		{"netpol peers", func() Object {
			p := validNetPol()
			p.Spec.Egress[0].To = []NetworkPolicyPeer{
				{},
				{IPBlock: &IPBlock{CIDR: "10.0.0.0/8", Except: []string{"11.0.0.0/16", "10.0.0.0/8", "bogus"}}},
				{IPBlock: &IPBlock{CIDR: "10.0.0.0/8"}, PodSelector: &LabelSelector{}},
				{IPBlock: &IPBlock{CIDR: "10.0.0.0"}},
			}
			return p
		}, []string{"spec.egress[0].to[0]: must set", "spec.egress[0].to[1].ipBlock.except[0]: 11.0.0.0/16 must be strictly inside",
			"spec.egress[0].to[1].ipBlock.except[1]", "spec.egress[0].to[1].ipBlock.except[2]", "spec.egress[0].to[2].ipBlock: cannot be combined",
			"spec.egress[0].to[3].ipBlock.cidr:"}},
		{"netpol policy types", func() Object {
			p := validNetPol()
			p.Spec.PolicyTypes = []PolicyType{"Ingress", "Ingress", "ingress"}
			return p
		}, []string{`spec.policyTypes[1]: "Ingress" is listed twice`, `spec.policyTypes[2]: "ingress"`}},
		{"netpol pod selector", func() Object {
			p := validNetPol()
			p.Spec.PodSelector.MatchExpressions = []LabelSelectorRequirement{{Key: "a", Operator: OpDoesNotExist, Values: []string{"b"}}}
			return p
		}, []string{"spec.podSelector.matchExpressions[0].values: must be empty for operator DoesNotExist"}},
		{"gnp namespaced", func() Object { p := validGNP(); p.Metadata.Namespace = "default"; return p },
			[]string{"metadata.namespace: must not be set"}},
		{"gnp rule action and protocol", func() Object {
			p := validGNP()
			p.Spec.Ingress[0].Action = "Log"
			p.Spec.Ingress[1].Action = ""
			p.Spec.Egress[0].Protocol = ptr("GRE")
			return p
		}, []string{`spec.ingress[0].action: "Log" is not one of Allow, Deny`, "spec.ingress[1].action: is required", `spec.egress[0].protocol: "GRE"`}},
		{"gnp ports", func() Object {
			p := validGNP()
			p.Spec.Ingress[0].Destination.Ports = []IntOrString{FromInt(0), FromString("10:5"), FromString("0:70000"), FromString("80"), FromString("Bad_Name")}
			return p
		}, []string{"spec.ingress[0].destination.ports[0]: 0", "spec.ingress[0].destination.ports[1]: range", "spec.ingress[0].destination.ports[2]: range",
			`spec.ingress[0].destination.ports[3]: "80" must be written as a number`, "spec.ingress[0].destination.ports[4]: port name"}},
		{"gnp ports without protocol", func() Object {
			p := validGNP()
			p.Spec.Ingress[1].Source.Ports = []IntOrString{FromInt(80)}
			p.Spec.Egress[0].Destination.Ports = []IntOrString{FromInt(80)}
			return p
		}, []string{"spec.ingress[1].source.ports: require the rule's protocol", "spec.egress[0].destination.ports: require"}},
		{"gnp nets", func() Object {
			p := validGNP()
			p.Spec.Ingress[0].Source.Nets = []string{"10.0.0.0/8", "10.0.0.0/40"}
			p.Spec.Egress[0].Destination.NotNets = []string{"junk"}
			return p
		}, []string{"spec.ingress[0].source.nets[1]:", `spec.egress[0].destination.notNets[0]: "junk" is not a valid CIDR`}},
		{"gnp types and selectors", func() Object {
			p := validGNP()
			p.Spec.Types = []PolicyType{PolicyTypeIngress}
			p.Spec.Selector.MatchLabels = map[string]string{"role": "db!"}
			p.Spec.NamespaceSelector = &LabelSelector{MatchExpressions: []LabelSelectorRequirement{{Key: "x", Operator: OpIn}}}
			p.Spec.Ingress[0].Destination.Selector = &LabelSelector{MatchExpressions: []LabelSelectorRequirement{{Key: "y"}}}
			return p
		}, []string{"spec.egress: has rules but spec.types does not include Egress", `spec.selector.matchLabels["role"]`,
			"spec.namespaceSelector.matchExpressions[0].values", "spec.ingress[0].destination.selector.matchExpressions[0].operator: is required"}},
	}
	// SetDefaults sets apiVersion and kind, so it repairs this one.
	const repairedByDefaults = "wrong kind and apiVersion"
	if len(tests) < 30 {
		t.Fatalf("only %d cases", len(tests))
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj := tt.obj()
			err := obj.Validate()
			if err == nil {
				t.Fatal("Validate() = nil, want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
			var fes FieldErrors
			if !errors.As(err, &fes) {
				t.Fatalf("error %T is not FieldErrors", err)
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field == "" {
				t.Errorf("errors.As(*FieldError) failed or empty field: %v", fe)
			}
			// Defaults never make an invalid object valid.
			obj.SetDefaults()
			if tt.name != repairedByDefaults && obj.Validate() == nil {
				t.Error("Validate() = nil after SetDefaults")
			}
		})
	}
}

// TestValidateReportsEveryProblem checks that problems in different parts of
// one object are all reported, one per line.
func TestValidateReportsEveryProblem(t *testing.T) {
	w := &WorkloadEndpoint{Metadata: ObjectMeta{Name: "UPPER"}}
	err := w.Validate()
	var fes FieldErrors
	if !errors.As(err, &fes) {
		t.Fatalf("got %v, want FieldErrors", err)
	}
	var fields []string
	for _, fe := range fes {
		fields = append(fields, fe.Field)
	}
	want := "metadata.name metadata.namespace spec.node spec.containerID spec.interfaceName spec.ipNetworks"
	if got := strings.Join(fields, " "); got != want {
		t.Errorf("fields = %q, want %q", got, want)
	}
	if n := strings.Count(err.Error(), "\n"); n != len(fes)-1 {
		t.Errorf("error has %d lines, want %d:\n%v", n+1, len(fes), err)
	}
}

// TestReflectorPeering: Auto mode peers elected reflectors of different
// zones as non-clients unless routeReflectorPeering says Client; Manual
// mode always keeps Calico's rule; Client validates in both modes.
func TestReflectorPeering(t *testing.T) {
	for _, tc := range []struct{ mode, peering, want string }{
		{RouteReflectorModeAuto, "", ReflectorPeeringNonClient},
		{RouteReflectorModeAuto, ReflectorPeeringNonClient, ReflectorPeeringNonClient},
		{RouteReflectorModeAuto, ReflectorPeeringClient, ReflectorPeeringClient},
		{"", "", ReflectorPeeringClient},
		{RouteReflectorModeManual, ReflectorPeeringClient, ReflectorPeeringClient},
	} {
		c := &BGPConfiguration{TypeMeta: TypeMeta{APIVersion: APIVersion, Kind: KindBGPConfiguration}, Metadata: ObjectMeta{Name: "default"}}
		c.Spec.RouteReflectorMode, c.Spec.RouteReflectorPeering = tc.mode, tc.peering
		if err := c.Validate(); err != nil {
			t.Errorf("mode %q, peering %q: %v", tc.mode, tc.peering, err)
		}
		if got := c.Spec.EffectiveReflectorPeering(); got != tc.want {
			t.Errorf("mode %q, peering %q: effective %s, want %s", tc.mode, tc.peering, got, tc.want)
		}
	}
}
