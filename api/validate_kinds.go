package api

import (
	"cmp"
	"fmt"
	"math"
	"net/netip"
)

// Validate implements Object.
func (n *Node) Validate() error {
	var v validator
	v.typeMeta(&n.TypeMeta, KindNode)
	v.meta(&n.Metadata, kindInfoOf(n))
	for i, a := range n.Spec.Addresses {
		p := idx("spec.addresses", i)
		switch {
		case a.Address == "":
			v.add(p+".address", "is required")
		case a.Type == "InternalIP" || a.Type == "ExternalIP":
			if _, err := netip.ParseAddr(a.Address); err != nil {
				v.add(p+".address", "%q is not a valid IP address", a.Address)
			}
		}
	}
	if b := n.Spec.BGP; b != nil {
		if b.IPv4Address != "" {
			pr, err := netip.ParsePrefix(b.IPv4Address)
			switch {
			case err != nil:
				v.add("spec.bgp.ipv4Address", "%q is not a valid IPv4 CIDR (want the node address with its prefix length, like \"198.18.0.2/24\")", b.IPv4Address)
			case !pr.Addr().Is4():
				v.add("spec.bgp.ipv4Address", "%q is not an IPv4 address", b.IPv4Address)
			case pr.Addr().IsUnspecified() || pr.Addr().IsLoopback() || pr.Addr().IsMulticast():
				v.add("spec.bgp.ipv4Address", "%q cannot be a node address", b.IPv4Address)
			}
		}
		if b.IPv6Address != "" {
			pr, err := netip.ParsePrefix(b.IPv6Address)
			switch {
			case err != nil:
				v.add("spec.bgp.ipv6Address", "%q is not a valid IPv6 CIDR (want the node address with its prefix length, like \"2001:db8::11/64\")", b.IPv6Address)
			case !pr.Addr().Is6() || pr.Addr().Is4In6():
				v.add("spec.bgp.ipv6Address", "%q is not an IPv6 address", b.IPv6Address)
			case pr.Addr().IsUnspecified() || pr.Addr().IsLoopback() || pr.Addr().IsMulticast() || pr.Addr().IsLinkLocalUnicast():
				v.add("spec.bgp.ipv6Address", "%q cannot be a node address (link-local, loopback or multicast)", b.IPv6Address)
			}
		}
		if b.ASNumber != nil {
			if p := checkASN(*b.ASNumber); p != "" {
				v.add("spec.bgp.asNumber", "%s", p)
			}
		}
		if id := b.RouteReflectorClusterID; id != "" {
			if a, err := netip.ParseAddr(id); err != nil || !a.Is4() {
				v.add("spec.bgp.routeReflectorClusterID", "%q must be an IPv4 address in dotted form, like \"224.0.0.1\"", id)
			}
		}
		if b.RouterID != "" {
			v.routerID("spec.bgp.routerID", b.RouterID)
		}
	}
	v.nodeVXLAN(&n.Spec)
	return v.err()
}

// Validate implements Object.
func (p *IPPool) Validate() error {
	var v validator
	v.typeMeta(&p.TypeMeta, KindIPPool)
	v.meta(&p.Metadata, kindInfoOf(p))
	pr, ok := v.cidr("spec.cidr", p.Spec.CIDR)
	reserved := reservedV4
	if ok && pr.Addr().Is6() {
		reserved = reservedV6
	}
	if ok {
		for _, r := range reserved {
			if pr.Overlaps(r) {
				v.add("spec.cidr", "%s overlaps the reserved range %s", pr, r)
				break
			}
		}
	}
	def, lo, hi := BlockSizes(ok && pr.Addr().Is6())
	bs := p.Spec.BlockSize
	switch {
	case bs == 0:
		// Defaulted by SetDefaults.
	case ok && bs == pr.Addr().BitLen():
		v.add("spec.blockSize", "%d is not supported: a block of one address has its blackhole route on the pod's own route; use %d to %d", bs, lo, hi)
	case bs < lo || bs > hi:
		if ok {
			v.add("spec.blockSize", "%d must be between %d and %d for an %s pool", bs, lo, hi, familyName(pr.Addr().Is6()))
		} else {
			v.add("spec.blockSize", "%d must be between %d and %d", bs, lo, hi)
		}
	case ok && bs < pr.Bits() && !p.IsLoadBalancer():
		v.add("spec.blockSize", "/%d blocks are larger than the pool %s (blockSize must be at least %d)", bs, pr, pr.Bits())
	}
	if bs == 0 && ok && def < pr.Bits() && !p.IsLoadBalancer() {
		v.add("spec.blockSize", "the default /%d blocks are larger than the pool %s; set blockSize to at least %d", def, pr, pr.Bits())
	}
	v.selector("spec.nodeSelector", p.Spec.NodeSelector)
	v.communities("spec.bgpCommunities", p.Spec.BGPCommunities)
	v.largeCommunities("spec.bgpLargeCommunities", p.Spec.BGPLargeCommunities)
	switch p.Spec.BGPAggregate {
	case AggregateNone:
	case AggregateOnly, AggregateWithBlocks:
		if p.Spec.DisableBGPExport {
			v.add("spec.bgpAggregate", "%s has no effect with disableBGPExport: the pool is not advertised at all", p.Spec.BGPAggregate)
		}
		if eff := cmp.Or(bs, DefaultBlockSize); ok && eff == pr.Bits() {
			v.add("spec.bgpAggregate", "the pool %s is a single /%d block: its block is already the aggregate", pr, eff)
		}
	default:
		v.add("spec.bgpAggregate", "%q must be %s or %s (or unset: blocks only)", p.Spec.BGPAggregate, AggregateOnly, AggregateWithBlocks)
	}
	v.poolUses(p)
	v.poolVXLAN(&p.Spec)
	return v.err()
}

// poolUses checks spec.allowedUses: known values, each once, and
// LoadBalancer alone, without the fields that only pod pools have.
func (v *validator) poolUses(p *IPPool) {
	seen := map[IPPoolUse]bool{}
	for i, u := range p.Spec.AllowedUses {
		switch {
		case u != UseWorkload && u != UseTunnel && u != UseLoadBalancer:
			v.add(fmt.Sprintf("spec.allowedUses[%d]", i), "%q must be %s, %s or %s", u, UseWorkload, UseTunnel, UseLoadBalancer)
		case seen[u]:
			v.add(fmt.Sprintf("spec.allowedUses[%d]", i), "%s is listed twice", u)
		}
		seen[u] = true
	}
	if !seen[UseLoadBalancer] {
		return
	}
	if seen[UseWorkload] || seen[UseTunnel] {
		v.add("spec.allowedUses", "LoadBalancer cannot be combined with Workload or Tunnel: a LoadBalancer pool's addresses belong to Services, not to pods or tunnels; make two pools")
	}
	if p.Spec.NATOutgoing {
		v.add("spec.natOutgoing", "does not apply to a LoadBalancer pool (no pod has its addresses)")
	}
	if p.Spec.NodeSelector != nil {
		v.add("spec.nodeSelector", "does not apply to a LoadBalancer pool (its addresses belong to Services, not to nodes)")
	}
	if p.Spec.BGPAggregate != AggregateNone {
		v.add("spec.bgpAggregate", "does not apply to a LoadBalancer pool (it has no blocks; Service addresses are advertised per BGPConfiguration serviceLoadBalancerIPs)")
	}
}

// Validate implements Object.
func (c *IPAMConfig) Validate() error {
	var v validator
	v.typeMeta(&c.TypeMeta, KindIPAMConfig)
	v.meta(&c.Metadata, kindInfoOf(c))
	if c.Spec.MaxBlocksPerHost < 0 {
		v.add("spec.maxBlocksPerHost", "%d must not be negative (0 means no limit)", c.Spec.MaxBlocksPerHost)
	}
	return v.err()
}

// Validate implements Object.
func (c *BGPConfiguration) Validate() error {
	var v validator
	v.typeMeta(&c.TypeMeta, KindBGPConfiguration)
	v.meta(&c.Metadata, kindInfoOf(c))
	if c.Spec.ASNumber != nil {
		if p := checkASN(*c.Spec.ASNumber); p != "" {
			v.add("spec.asNumber", "%s", p)
		}
	}
	if c.Spec.ListenPort != nil && *c.Spec.ListenPort == 0 {
		v.add("spec.listenPort", "must be between 1 and 65535")
	}
	v.password("spec.nodeMeshPassword", c.Spec.NodeMeshPassword)
	v.bgpTimers("spec.", c.Spec.KeepaliveTime, c.Spec.HoldTime, c.Spec.NodeMeshMaxRestartTime, "nodeMeshMaxRestartTime")
	v.serviceAdvertisement(c)
	v.vxlanSettings(&c.Spec)
	v.autoReflectors(&c.Spec.AutoReflectorSpec)
	return v.err()
}

// Validate implements Object.
func (p *BGPPeer) Validate() error {
	var v validator
	v.typeMeta(&p.TypeMeta, KindBGPPeer)
	v.meta(&p.Metadata, kindInfoOf(p))
	s := &p.Spec
	switch {
	case s.PeerIP == "" && s.PeerSelector == nil:
		v.add("spec.peerIP", "exactly one of peerIP and peerSelector must be set")
	case s.PeerIP != "" && s.PeerSelector != nil:
		v.add("spec.peerSelector", "must not be set together with spec.peerIP")
	}
	if s.PeerIP != "" {
		v.peerAddr("spec.peerIP", s.PeerIP)
		if s.ASNumber == 0 {
			v.add("spec.asNumber", "is required with peerIP")
		}
	}
	if s.ASNumber != 0 {
		if s.PeerSelector != nil && s.PeerIP == "" {
			v.add("spec.asNumber", "must not be set with peerSelector: the selected nodes' own AS numbers are used")
		} else if msg := checkASN(s.ASNumber); msg != "" {
			v.add("spec.asNumber", "%s", msg)
		}
	}
	v.selector("spec.peerSelector", s.PeerSelector)
	if s.Node != "" {
		if s.NodeSelector != nil {
			v.add("spec.nodeSelector", "must not be set together with spec.node")
		}
		if msg := checkDNSSubdomain(s.Node); msg != "" {
			v.add("spec.node", "%s", msg)
		}
	}
	v.selector("spec.nodeSelector", s.NodeSelector)
	v.password("spec.password", s.Password)
	v.bgpTimers("spec.", s.KeepaliveTime, s.HoldTime, s.MaxRestartTime, "maxRestartTime")
	switch s.SourceAddress {
	case "", SourceAddressUseNodeIP, SourceAddressNone:
	default:
		v.add("spec.sourceAddress", "%q is not one of %s, %s", s.SourceAddress, SourceAddressUseNodeIP, SourceAddressNone)
	}
	seen := map[string]bool{}
	for i, name := range s.Filters {
		switch {
		case name == "":
			v.add(idx("spec.filters", i), "must not be empty")
		case checkDNSSubdomain(name) != "":
			v.add(idx("spec.filters", i), "%s", checkDNSSubdomain(name))
		case seen[name]:
			v.add(idx("spec.filters", i), "%q is listed twice", name)
		}
		seen[name] = true
	}
	v.bfd("spec.bfd", s.BFD)
	v.peerASAndNextHop(s)
	return v.err()
}

// peerASAndNextHop validates a BGPPeer's localASNumber, keepOriginalNextHop
// and nextHopMode.
func (v *validator) peerASAndNextHop(s *BGPPeerSpec) {
	if s.LocalASNumber != 0 {
		switch {
		case checkASN(s.LocalASNumber) != "":
			v.add("spec.localASNumber", "%s", checkASN(s.LocalASNumber))
		case s.PeerSelector != nil:
			v.add("spec.localASNumber", "must not be set with peerSelector: cluster nodes peer as their own AS numbers (a local AS is for a router outside the cluster, spec.peerIP)")
		}
	}
	switch s.NextHopMode {
	case "", NextHopModeAuto, NextHopModeSelf, NextHopModeKeep:
		if s.KeepOriginalNextHop && s.NextHopMode != "" {
			v.add("spec.keepOriginalNextHop", "keepOriginalNextHop and nextHopMode cannot both be set (keepOriginalNextHop is nextHopMode Keep)")
		}
	default:
		v.add("spec.nextHopMode", "%q is not one of %s, %s, %s", s.NextHopMode, NextHopModeAuto, NextHopModeSelf, NextHopModeKeep)
	}
}

// EffectiveNextHopMode is the peer's next-hop mode: nextHopMode, Keep for
// keepOriginalNextHop, else Auto.
func (s *BGPPeerSpec) EffectiveNextHopMode() string {
	switch {
	case s.NextHopMode != "":
		return s.NextHopMode
	case s.KeepOriginalNextHop:
		return NextHopModeKeep
	}
	return NextHopModeAuto
}

// Validate implements Object.
func (w *WorkloadEndpoint) Validate() error {
	var v validator
	v.typeMeta(&w.TypeMeta, KindWorkloadEndpoint)
	v.meta(&w.Metadata, kindInfoOf(w))
	s := &w.Spec
	if s.Node == "" {
		v.add("spec.node", "is required")
	} else if msg := checkDNSSubdomain(s.Node); msg != "" {
		v.add("spec.node", "%s", msg)
	}
	if s.Pod != "" {
		if msg := checkDNSSubdomain(s.Pod); msg != "" {
			v.add("spec.pod", "%s", msg)
		}
	}
	if s.ContainerID == "" {
		v.add("spec.containerID", "is required")
	} else if !isContainerID(s.ContainerID) {
		v.add("spec.containerID", "%q must be letters, digits, '_', '.' and '-', starting with a letter or digit", s.ContainerID)
	}
	if msg := checkIfName(s.InterfaceName); msg != "" {
		v.add("spec.interfaceName", "%s", msg)
	}
	if s.Endpoint != "" {
		if msg := checkIfName(s.Endpoint); msg != "" {
			v.add("spec.endpoint", "%s", msg)
		}
	}
	if s.MAC != "" && !validMAC(s.MAC) {
		v.add("spec.mac", "%q is not a valid MAC address (want six hex bytes, like \"ee:ee:ee:ee:ee:ee\")", s.MAC)
	}
	if len(s.IPNetworks) == 0 {
		v.add("spec.ipNetworks", "at least one address is required")
	}
	for i, n := range s.IPNetworks {
		pr, err := netip.ParsePrefix(n)
		if err == nil && pr.IsSingleIP() && pr.Addr().Zone() == "" && !pr.Addr().Is4In6() && !pr.Addr().IsLinkLocalUnicast() {
			continue // the common case, without building the field path
		}
		// A pod address with a shorter prefix is a likely mistake; say
		// so rather than complain about host bits.
		if err == nil && pr.Bits() != pr.Addr().BitLen() {
			v.add(idx("spec.ipNetworks", i), "%q must be a single address, like %q", n, netip.PrefixFrom(pr.Addr(), pr.Addr().BitLen()).String())
			continue
		}
		if pr, ok := v.cidr(idx("spec.ipNetworks", i), n); ok && (pr.Addr().Is4In6() || pr.Addr().IsLinkLocalUnicast()) {
			v.add(idx("spec.ipNetworks", i), "%q is not a pod address (IPv4-mapped or link-local)", n)
		}
	}

	v.labels("spec.namespaceLabels", s.NamespaceLabels)
	for i, prof := range s.Profiles {
		if prof == "" {
			v.add(idx("spec.profiles", i), "must not be empty")
		}
	}
	type portKey struct{ name, proto string }
	seen := make(map[portKey]bool)
	for i, pt := range s.Ports {
		p := idx("spec.ports", i)
		if msg := checkPortName(pt.Name); msg != "" {
			v.add(p+".name", "%s", msg)
		}
		if pt.Protocol != "" && !validProtocol(pt.Protocol, ProtocolTCP, ProtocolUDP, ProtocolSCTP) {
			v.add(p+".protocol", "%q is not one of TCP, UDP, SCTP", pt.Protocol)
		}
		if pt.Port == 0 {
			v.add(p+".port", "must be between 1 and 65535")
		}
		k := portKey{pt.Name, pt.Protocol}
		if k.proto == "" {
			k.proto = ProtocolTCP
		}
		if seen[k] {
			v.add(p+".name", "%q is listed twice for protocol %s", pt.Name, k.proto)
		}
		seen[k] = true
	}
	return v.err()
}

// policyTypes validates a list of policy types: Ingress or Egress, each at
// most once.
func (v *validator) policyTypes(path string, types []PolicyType) {
	seen := make(map[PolicyType]bool)
	for i, t := range types {
		switch {
		case t != PolicyTypeIngress && t != PolicyTypeEgress:
			v.add(idx(path, i), "%q is not one of Ingress, Egress", t)
		case seen[t]:
			v.add(idx(path, i), "%q is listed twice", t)
		}
		seen[t] = true
	}
}

// Validate implements Object.
func (p *NetworkPolicy) Validate() error {
	var v validator
	v.typeMeta(&p.TypeMeta, KindNetworkPolicy)
	v.meta(&p.Metadata, kindInfoOf(p))
	v.selector("spec.podSelector", &p.Spec.PodSelector)
	for i, r := range p.Spec.Ingress {
		path := idx("spec.ingress", i)
		v.npPorts(path+".ports", r.Ports)
		v.npPeers(path+".from", r.From)
	}
	for i, r := range p.Spec.Egress {
		path := idx("spec.egress", i)
		v.npPorts(path+".ports", r.Ports)
		v.npPeers(path+".to", r.To)
	}
	v.policyTypes("spec.policyTypes", p.Spec.PolicyTypes)
	return v.err()
}

func (v *validator) npPorts(path string, ports []NetworkPolicyPort) {
	for i, pt := range ports {
		p := idx(path, i)
		if pt.Protocol != nil && !validProtocol(*pt.Protocol, ProtocolTCP, ProtocolUDP, ProtocolSCTP) {
			v.add(p+".protocol", "%q is not one of TCP, UDP, SCTP", *pt.Protocol)
		}
		numeric := false
		if pt.Port != nil {
			if pt.Port.IsString {
				if msg := checkPortName(pt.Port.StrVal); msg != "" {
					v.add(p+".port", "%s", msg)
				}
			} else if pt.Port.IntVal < 1 || pt.Port.IntVal > math.MaxUint16 {
				v.add(p+".port", "%d must be between 1 and 65535", pt.Port.IntVal)
			} else {
				numeric = true
			}
		}
		if pt.EndPort != nil {
			switch {
			case pt.Port == nil:
				v.add(p+".endPort", "requires port")
			case pt.Port.IsString:
				v.add(p+".endPort", "cannot be used with the named port %q", pt.Port.StrVal)
			case *pt.EndPort < 1 || *pt.EndPort > math.MaxUint16:
				v.add(p+".endPort", "%d must be between 1 and 65535", *pt.EndPort)
			case numeric && *pt.EndPort < pt.Port.IntVal:
				v.add(p+".endPort", "%d must not be less than port %d", *pt.EndPort, pt.Port.IntVal)
			}
		}
	}
}

func (v *validator) npPeers(path string, peers []NetworkPolicyPeer) {
	for i, peer := range peers {
		p := idx(path, i)
		if peer.IPBlock == nil && peer.PodSelector == nil && peer.NamespaceSelector == nil {
			v.add(p, "must set podSelector, namespaceSelector or ipBlock")
		}
		if peer.IPBlock != nil && (peer.PodSelector != nil || peer.NamespaceSelector != nil) {
			v.add(p+".ipBlock", "cannot be combined with podSelector or namespaceSelector")
		}
		v.selector(p+".podSelector", peer.PodSelector)
		v.selector(p+".namespaceSelector", peer.NamespaceSelector)
		if b := peer.IPBlock; b != nil {
			cidr, ok := v.cidr(p+".ipBlock.cidr", b.CIDR)
			for j, e := range b.Except {
				ep := idx(p+".ipBlock.except", j)
				ex, exOK := v.cidr(ep, e)
				if ok && exOK && (ex.Bits() <= cidr.Bits() || !cidr.Contains(ex.Addr())) {
					v.add(ep, "%s must be strictly inside cidr %s", ex, cidr)
				}
			}
		}
	}
}

// Validate implements Object.
func (p *GlobalNetworkPolicy) Validate() error {
	var v validator
	v.typeMeta(&p.TypeMeta, KindGlobalNetworkPolicy)
	v.meta(&p.Metadata, kindInfoOf(p))
	v.gnpSpec(p)
	return v.err()
}

// gnpSpec validates the spec of a GlobalNetworkPolicy or of a staged one.
func (v *validator) gnpSpec(p *GlobalNetworkPolicy) {
	s := &p.Spec
	if s.Tier != "" {
		if msg := checkDNSLabel(s.Tier); msg != "" {
			v.add("spec.tier", "%s", msg)
		}
	}
	if s.Order != nil && (math.IsNaN(*s.Order) || math.IsInf(*s.Order, 0)) {
		v.add("spec.order", "must be a finite number")
	}
	v.selector("spec.selector", s.Selector)
	v.selector("spec.namespaceSelector", s.NamespaceSelector)
	v.policyTypes("spec.types", s.Types)
	if len(s.Types) > 0 {
		if len(s.Ingress) > 0 && !hasType(s.Types, PolicyTypeIngress) {
			v.add("spec.ingress", "has rules but spec.types does not include Ingress")
		}
		if len(s.Egress) > 0 && !hasType(s.Types, PolicyTypeEgress) {
			v.add("spec.egress", "has rules but spec.types does not include Egress")
		}
	}
	for i, r := range s.Ingress {
		v.rule(idx("spec.ingress", i), &r)
	}
	for i, r := range s.Egress {
		v.rule(idx("spec.egress", i), &r)
	}
	v.hostPolicyFlags(p)
}

func (v *validator) rule(path string, r *Rule) {
	switch r.Action {
	case ActionAllow, ActionDeny, ActionPass:
	case "":
		v.add(path+".action", "is required (Allow, Deny or Pass)")
	default:
		v.add(path+".action", "%q is not one of Allow, Deny, Pass", r.Action)
	}
	portsOK := false
	if r.Protocol != nil {
		if !validProtocol(*r.Protocol, ProtocolTCP, ProtocolUDP, ProtocolSCTP, ProtocolICMP, ProtocolICMPv6) {
			v.add(path+".protocol", "%q is not one of TCP, UDP, SCTP, ICMP, ICMPv6", *r.Protocol)
		} else {
			portsOK = *r.Protocol != ProtocolICMP && *r.Protocol != ProtocolICMPv6
		}
	}
	v.entity(path+".source", &r.Source, portsOK)
	v.entity(path+".destination", &r.Destination, portsOK)
}

func (v *validator) entity(path string, e *EntityRule, portsOK bool) {
	v.selector(path+".selector", e.Selector)
	v.selector(path+".namespaceSelector", e.NamespaceSelector)
	for i, n := range e.Nets {
		v.cidr(idx(path+".nets", i), n)
	}
	for i, n := range e.NotNets {
		v.cidr(idx(path+".notNets", i), n)
	}
	if len(e.Ports) > 0 && !portsOK {
		v.add(path+".ports", "require the rule's protocol to be TCP, UDP or SCTP")
	}
	for i, pt := range e.Ports {
		if msg := checkRulePort(pt); msg != "" {
			v.add(idx(path+".ports", i), "%s", msg)
		}
	}
}

// checkRulePort checks a GlobalNetworkPolicy port: a number, a "lo:hi"
// range or a named port.
func checkRulePort(pt IntOrString) string {
	if !pt.IsString {
		if pt.IntVal < 1 || pt.IntVal > math.MaxUint16 {
			return fmt.Sprintf("%d must be between 1 and 65535", pt.IntVal)
		}
		return ""
	}
	s := pt.StrVal
	if lo, hi, ok := ParsePortRange(s); ok {
		switch {
		case lo < 1 || lo > math.MaxUint16 || hi < 1 || hi > math.MaxUint16:
			return fmt.Sprintf("range %q: ports must be between 1 and 65535", s)
		case lo > hi:
			return fmt.Sprintf("range %q: start must not be greater than end", s)
		}
		return ""
	}
	if isDigits(s) {
		return fmt.Sprintf("%q must be written as a number, not a string", s)
	}
	return checkPortName(s)
}
