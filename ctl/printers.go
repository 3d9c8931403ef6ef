package ctl

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/tabbynet/tabby/api"
)

// printContext is what the table printers need beyond the objects.
type printContext struct {
	// bgp is the cluster's BGPConfiguration, nil when there is none.
	bgp *api.BGPConfiguration
	// services are the agents' Service decisions (get services).
	services serviceAds
}

// columnsOf returns the table header of a kind: the normal columns and the
// extra ones of -o wide.
func columnsOf(kind string) (header, wide []string) {
	switch kind {
	case api.KindNode:
		return []string{"NAME", "ADDRESS", "ASN", "RR-CLUSTER", "ORIGIN"}, []string{"LABELS"}
	case api.KindIPPool:
		return []string{"NAME", "CIDR", "BLOCKSIZE", "NAT", "DISABLED"}, []string{"NODE-SELECTOR", "BGP-EXPORT", "USES"}
	case api.KindIPAMConfig:
		return []string{"NAME", "STRICT-AFFINITY", "AUTO-ALLOCATE", "MAX-BLOCKS-PER-HOST"}, nil
	case api.KindBGPConfiguration:
		return []string{"NAME", "ASN", "MESH", "LISTEN-PORT"}, []string{"KEEPALIVE", "HOLD", "MESH-RESTART-TIME"}
	case api.KindBGPPeer:
		return []string{"NAME", "PEERIP", "NODE", "ASN"}, []string{"KEEPALIVE", "HOLD", "PASSWORD", "SOURCE", "FILTERS", "MAX-PREFIXES", "BFD"}
	case api.KindBGPFilter:
		return []string{"NAME", "IMPORT-V4", "EXPORT-V4", "IMPORT-V6", "EXPORT-V6"}, []string{"RULES"}
	case api.KindWorkloadEndpoint:
		return []string{"NAMESPACE", "NAME", "NODE", "IP", "INTERFACE", "ORIGIN"}, []string{"POD", "CONTAINER", "MAC", "LABELS"}
	case api.KindNetworkPolicy:
		return []string{"NAMESPACE", "NAME", "POD-SELECTOR", "TYPES", "ORIGIN"}, []string{"INGRESS-RULES", "EGRESS-RULES"}
	case api.KindGlobalNetworkPolicy:
		return []string{"NAME", "ORDER", "SELECTOR", "TYPES"}, []string{"NAMESPACE-SELECTOR", "INGRESS-RULES", "EGRESS-RULES"}
	case api.KindService:
		return []string{"NAMESPACE", "NAME", "TYPE", "TRAFFIC-POLICY", "ADVERTISED", "NOT-ADVERTISED"}, []string{"CLUSTER-IPS", "ENDPOINT-NODES"}
	case api.KindHostEndpoint:
		return []string{"NAME", "NODE", "INTERFACE"}, []string{"EXPECTED-IPS", "PROFILES", "LABELS"}
	case api.KindClusterConfiguration:
		return []string{"NAME", "AUTO-HOST-ENDPOINTS"}, []string{"FAILSAFE-INBOUND", "FAILSAFE-OUTBOUND"}
	}
	return []string{"NAME"}, nil
}

// rowOf returns obj's table cells: the normal ones and the -o wide extras.
func rowOf(obj api.Object, pc printContext) (cells, wide []string) {
	switch o := obj.(type) {
	case *api.Node:
		addr, asn := "<none>", strconv.FormatUint(uint64(o.EffectiveASN(pc.bgp)), 10)
		if o.Spec.BGP != nil && o.Spec.BGP.IPv4Address != "" {
			addr = o.Spec.BGP.IPv4Address
		}
		if o.Spec.BGP == nil || o.Spec.BGP.ASNumber == nil {
			asn = "(" + asn + ")" // inherited, as calicoctl shows it
		}
		return []string{o.Metadata.Name, addr, asn, orNone(o.RouteReflectorClusterID()), api.Origin(o)},
			[]string{formatLabels(o.Metadata.Labels)}
	case *api.IPPool:
		return []string{o.Metadata.Name, o.Spec.CIDR, strconv.Itoa(o.Spec.BlockSize), strconv.FormatBool(o.Spec.NATOutgoing), strconv.FormatBool(o.Spec.Disabled)},
			[]string{poolSelector(o.Spec.NodeSelector), strconv.FormatBool(!o.Spec.DisableBGPExport), poolUses(o)}
	case *api.IPAMConfig:
		maxBlocks := "unlimited"
		if o.Spec.MaxBlocksPerHost > 0 {
			maxBlocks = strconv.Itoa(o.Spec.MaxBlocksPerHost)
		}
		return []string{o.Metadata.Name, strconv.FormatBool(o.Spec.StrictAffinity), strconv.FormatBool(o.AutoAllocate()), maxBlocks}, nil
	case *api.BGPConfiguration:
		return []string{o.Metadata.Name, strconv.FormatUint(uint64(o.EffectiveASN()), 10), strconv.FormatBool(o.MeshEnabled()), strconv.Itoa(int(o.Port()))},
			[]string{duration(o.Spec.KeepaliveTime), duration(o.Spec.HoldTime), duration(o.Spec.NodeMeshMaxRestartTime)}
	case *api.BGPPeer:
		peer := o.Spec.PeerIP
		if peer == "" {
			peer = "selector: " + o.Spec.PeerSelector.String()
		}
		node := "(global)"
		switch {
		case o.Spec.Node != "":
			node = o.Spec.Node
		case o.Spec.NodeSelector != nil:
			node = "selector: " + selector(o.Spec.NodeSelector)
		}
		asn := "(node's)"
		if o.Spec.ASNumber != 0 {
			asn = strconv.FormatUint(uint64(o.Spec.ASNumber), 10)
		}
		pw := "no"
		if !o.Spec.Password.IsZero() {
			pw = "yes"
		}
		maxPfx := "<default>"
		if o.Spec.MaxPrefixes != 0 {
			maxPfx = strconv.FormatUint(uint64(o.Spec.MaxPrefixes), 10)
		}
		bfd := "off"
		if b := o.Spec.BFD; b != nil && b.Enabled {
			bfd = fmt.Sprintf("%s×%d", b.EffectiveInterval(), b.EffectiveMultiplier())
		}
		return []string{o.Metadata.Name, peer, node, asn},
			[]string{duration(o.Spec.KeepaliveTime), duration(o.Spec.HoldTime), pw, o.Spec.SourceAddress,
				orNone(strings.Join(o.Spec.Filters, ",")), maxPfx, bfd}
	case *api.BGPFilter:
		var rules []string
		for _, l := range []struct {
			name  string
			rules []api.BGPFilterRule
		}{{"import", o.Spec.ImportV4}, {"export", o.Spec.ExportV4}, {"importV6", o.Spec.ImportV6}, {"exportV6", o.Spec.ExportV6}} {
			for _, r := range l.rules {
				rules = append(rules, l.name+" "+filterRule(r))
			}
		}
		return []string{o.Metadata.Name, strconv.Itoa(len(o.Spec.ImportV4)), strconv.Itoa(len(o.Spec.ExportV4)),
				strconv.Itoa(len(o.Spec.ImportV6)), strconv.Itoa(len(o.Spec.ExportV6))},
			[]string{orNone(strings.Join(rules, "; "))}
	case *api.Service:
		return serviceRow(o, pc.services)
	case *api.WorkloadEndpoint:
		return []string{o.Metadata.Namespace, o.Metadata.Name, o.Spec.Node, orNone(strings.Join(o.Spec.IPNetworks, ",")), orNone(o.Spec.InterfaceName), api.Origin(o)},
			[]string{orNone(o.Spec.Pod), orNone(shortID(o.Spec.ContainerID)), orNone(o.Spec.MAC), formatLabels(o.Metadata.Labels)}
	case *api.NetworkPolicy:
		in, eg := o.AppliesTo()
		return []string{o.Metadata.Namespace, o.Metadata.Name, selector(&o.Spec.PodSelector), types(in, eg), api.Origin(o)},
			[]string{strconv.Itoa(len(o.Spec.Ingress)), strconv.Itoa(len(o.Spec.Egress))}
	case *api.GlobalNetworkPolicy:
		order := "<none>"
		if o.Spec.Order != nil {
			order = strconv.FormatFloat(*o.Spec.Order, 'g', -1, 64)
		}
		in, eg := o.AppliesTo()
		return []string{o.Metadata.Name, order, gnpSelector(o.Spec.Selector), types(in, eg)},
			[]string{gnpSelector(o.Spec.NamespaceSelector), strconv.Itoa(len(o.Spec.Ingress)), strconv.Itoa(len(o.Spec.Egress))}
	case *api.HostEndpoint:
		return []string{o.Metadata.Name, o.Spec.Node, o.Spec.InterfaceName},
			[]string{orNone(strings.Join(o.Spec.ExpectedIPs, ",")), orNone(strings.Join(o.Spec.Profiles, ",")), formatLabels(o.Metadata.Labels)}
	case *api.ClusterConfiguration:
		auto := api.Disabled
		if o.AutoHostEndpointsEnabled() {
			auto = api.Enabled
		}
		return []string{o.Metadata.Name, auto}, []string{protoPorts(o.Spec.FailsafeInboundHostPorts), protoPorts(o.Spec.FailsafeOutboundHostPorts)}
	}
	return []string{obj.GetMeta().Name}, nil
}

// filterRule renders a BGPFilter rule on one line: "In 10.0.0.0/8 /24-28 Accept".
func filterRule(r api.BGPFilterRule) string {
	if r.CIDR == "" {
		return "all " + r.Action
	}
	s := r.MatchOperator + " " + r.CIDR
	if pl := r.PrefixLength; pl != nil {
		lo, hi := "", ""
		if pl.Min != nil {
			lo = strconv.Itoa(int(*pl.Min))
		}
		if pl.Max != nil {
			hi = strconv.Itoa(int(*pl.Max))
		}
		s += " /" + lo + "-" + hi
	}
	return s + " " + r.Action
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func duration(d *api.Duration) string {
	if d == nil {
		return "<default>"
	}
	return d.Duration.String()
}

// selector renders a selector; an empty one selects everything: "all()".
func selector(s *api.LabelSelector) string {
	if s.IsEmpty() {
		return "all()"
	}
	return s.String()
}

// poolSelector: a pool without a nodeSelector serves every node.
func poolSelector(s *api.LabelSelector) string {
	if s == nil {
		return "all()"
	}
	return selector(s)
}

// gnpSelector: a GlobalNetworkPolicy without a selector applies to every
// endpoint, as in Calico.
func gnpSelector(s *api.LabelSelector) string {
	if s == nil {
		return "all()"
	}
	return selector(s)
}

func types(in, eg bool) string {
	switch {
	case in && eg:
		return "Ingress,Egress"
	case eg:
		return "Egress"
	case in:
		return "Ingress"
	}
	return "<none>"
}

// poolUses is a pool's allowedUses ("Workload,Tunnel" when defaulted).
func poolUses(p *api.IPPool) string {
	uses := make([]string, 0, 2)
	for _, u := range p.Uses() {
		uses = append(uses, string(u))
	}
	return strings.Join(uses, ",")
}
