package kube

import (
	"fmt"

	npav1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/tabbynet/tabby/api"
)

// cnpAction is the Tabby action of a ClusterNetworkPolicy action
// (contract B: Accept → Allow, Deny → Deny, Pass → Pass).
func cnpAction(a npav1.ClusterNetworkPolicyRuleAction) (string, error) {
	switch a {
	case npav1.ClusterNetworkPolicyRuleActionAccept:
		return api.ActionAllow, nil
	case npav1.ClusterNetworkPolicyRuleActionDeny:
		return api.ActionDeny, nil
	case npav1.ClusterNetworkPolicyRuleActionPass:
		return api.ActionPass, nil
	}
	return "", fmt.Errorf("%q is not one of Accept, Deny, Pass", a)
}

// protoPorts is one protocol alternative of a rule: proto "" is any
// protocol (and then no ports).
type protoPorts struct {
	proto string
	ports []api.IntOrString
}

// cnpRules expands one rule into Tabby rules: one per peer and protocol
// alternative, all with the rule's action. Peers are the source of an
// ingress rule, the destination of an egress one; ports are always the
// destination's. No peers (a nodes peer selecting no node): no rules.
func cnpRules(path string, action npav1.ClusterNetworkPolicyRuleAction, peers []api.EntityRule, protocols []npav1.ClusterNetworkPolicyProtocol, ingress bool) ([]api.Rule, error) {
	act, err := cnpAction(action)
	if err != nil {
		return nil, fmt.Errorf("%s.action: %w", path, err)
	}
	alts, err := cnpProtocols(path+".protocols", protocols)
	if err != nil {
		return nil, err
	}
	var out []api.Rule
	for _, peer := range peers {
		for _, a := range alts {
			r := api.Rule{Action: act}
			if a.proto != "" {
				p := a.proto
				r.Protocol = &p
			}
			if ingress {
				r.Source = peer
				r.Destination.Ports = a.ports
			} else {
				r.Destination = peer
				r.Destination.Ports = a.ports
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// cnpProtocols lists a rule's protocol alternatives; none means any
// protocol. A named port carries no protocol in the API: it becomes one
// alternative per protocol, each matching the ports of that name and
// protocol (a pod's named port has one protocol, so only one can match).
func cnpProtocols(path string, in []npav1.ClusterNetworkPolicyProtocol) ([]protoPorts, error) {
	if len(in) == 0 {
		return []protoPorts{{}}, nil
	}
	var out []protoPorts
	for i, p := range in {
		at := fmt.Sprintf("%s[%d]", path, i)
		set := 0
		for _, b := range []bool{p.TCP != nil, p.UDP != nil, p.SCTP != nil, p.DestinationNamedPort != ""} {
			if b {
				set++
			}
		}
		if set != 1 {
			return nil, fmt.Errorf("%s: exactly one of tcp, udp, sctp and destinationNamedPort must be set, found %d", at, set)
		}
		var proto string
		var port *npav1.Port
		switch {
		case p.TCP != nil:
			proto, port = api.ProtocolTCP, p.TCP.DestinationPort
		case p.UDP != nil:
			proto, port = api.ProtocolUDP, p.UDP.DestinationPort
		case p.SCTP != nil:
			proto, port = api.ProtocolSCTP, p.SCTP.DestinationPort
		default:
			named := []api.IntOrString{api.FromString(p.DestinationNamedPort)}
			for _, pr := range []string{api.ProtocolTCP, api.ProtocolUDP, api.ProtocolSCTP} {
				out = append(out, protoPorts{pr, named})
			}
			continue
		}
		ports, err := cnpPort(port)
		if err != nil {
			return nil, fmt.Errorf("%s.%s.destinationPort: %w", at, lower(proto), err)
		}
		out = append(out, protoPorts{proto, ports})
	}
	return out, nil
}

// cnpPort is a destination port as Tabby ports: a number or a "lo:hi"
// range; nil (no port) is any port.
func cnpPort(p *npav1.Port) ([]api.IntOrString, error) {
	if p == nil {
		return nil, nil
	}
	valid := func(n int32) bool { return n >= 1 && n <= 65535 }
	switch {
	case p.Number != 0 && p.Range != nil:
		return nil, fmt.Errorf("only one of number and range may be set")
	case p.Range != nil:
		lo, hi := p.Range.Start, p.Range.End
		if !valid(lo) || !valid(hi) {
			return nil, fmt.Errorf("range %d-%d: ports must be between 1 and 65535", lo, hi)
		}
		if lo > hi {
			return nil, fmt.Errorf("range %d-%d: start must not be greater than end", lo, hi)
		}
		if lo == hi {
			return []api.IntOrString{api.FromInt(lo)}, nil
		}
		return []api.IntOrString{api.FromString(fmt.Sprintf("%d:%d", lo, hi))}, nil
	case !valid(p.Number):
		return nil, fmt.Errorf("number %d is not between 1 and 65535", p.Number)
	}
	return []api.IntOrString{api.FromInt(p.Number)}, nil
}

func lower(proto string) string {
	switch proto {
	case api.ProtocolTCP:
		return "tcp"
	case api.ProtocolUDP:
		return "udp"
	}
	return "sctp"
}
