package agent

import (
	"errors"
	"fmt"
	"slices"

	"github.com/tabbynet/tabby/agent/routetable"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/syncer"
)

// serviceState is the Service side of the BGP owner (docs/bgp.md,
// "Services"): the last pass's decisions, for the status, and the refusals
// already logged.
type serviceState struct {
	serviceDecisions []bgp.ServiceDecision
	refusedLogged    map[string]bool // "<service> <prefix> <reason>"
}

// serviceAffects takes the Service record updates that can change what
// this node advertises: a record created or deleted, its addresses or
// traffic policy changed, or this node gaining or losing its last ready
// endpoint. Endpoints moving between other nodes cost this node nothing.
func serviceAffects(node string) func(syncer.Update[api.Service]) bool {
	return func(u syncer.Update[api.Service]) bool {
		if u.Old == nil || u.New == nil {
			return true
		}
		o, n := &u.Old.Spec, &u.New.Spec
		return !slices.Equal(o.ExternalIPs, n.ExternalIPs) || !slices.Equal(o.LoadBalancerIPs, n.LoadBalancerIPs) ||
			o.ExternalTrafficPolicy != n.ExternalTrafficPolicy || u.Old.HasEndpointOn(node) != u.New.HasEndpointOn(node)
	}
}

// serviceView is the ServiceView of this node under the cluster view.
func (b *bgpOwner) serviceView() *bgp.ServiceView {
	return &bgp.ServiceView{
		Node:     b.node,
		Config:   api.EffectiveServices(b.view.BGPConfiguration(), b.view.NodeBGPConfiguration(b.node)),
		Services: b.view.Services(),
		IPv6:     b.nodeAddr6.IsValid(),
		Pools:    poolPrefixes(b.view.Pools()),
	}
}

// noteServiceDecisions keeps ds for the status and logs, once each, the
// addresses the configuration refuses.
func (b *bgpOwner) noteServiceDecisions(ds []bgp.ServiceDecision) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.serviceDecisions = ds
	now := map[string]bool{}
	for _, d := range ds {
		if !d.Refused {
			continue
		}
		k := d.Service + " " + d.Prefix.String() + " " + d.Reason
		now[k] = true
		if !b.refusedLogged[k] {
			b.log.Warn("service address not advertised", "service", d.Service, "kind", d.Kind, "address", d.Prefix.Addr(), "reason", d.Reason)
		}
	}
	b.refusedLogged = now
}

// serviceBlackholes are the Service class's routes: a blackhole for every
// Service prefix this node advertises, so that traffic the routers send
// here for an address kube-proxy does not translate (an unused ClusterIP,
// a port no Service has) is dropped instead of going back out of the
// default route to the router that sent it (docs/bgp.md).
func serviceBlackholes(ds []bgp.ServiceDecision) []dataplane.Route {
	var out []dataplane.Route
	for _, d := range ds {
		if d.Advertised {
			out = append(out, dataplane.Route{Dst: d.Prefix, Type: dataplane.RouteBlackhole, Proto: dataplane.RouteProtoWorkload})
		}
	}
	slices.SortFunc(out, func(x, y dataplane.Route) int { return x.Dst.Compare(y.Dst) })
	return slices.CompactFunc(out, func(x, y dataplane.Route) bool { return x.Dst == y.Dst })
}

// reconcileServiceRoutes programs the Service class for what the speaker
// advertises.
func (b *bgpOwner) reconcileServiceRoutes(ds []bgp.ServiceDecision) error {
	if b.table == nil {
		return nil
	}
	holes := serviceBlackholes(ds)
	err := b.table.SetClass(routetable.Service, holes)
	if err = errors.Join(err, b.table.Apply(routetable.Service)); err != nil {
		return fmt.Errorf("service routes: %w", err)
	}
	if b.metrics != nil {
		b.metrics.routes.WithLabelValues("service").Set(float64(len(holes)))
	}
	return nil
}

// serviceStatus renders the decisions for the agent's status. Called with
// b.mu held.
func (s *serviceState) serviceStatus() []api.ServiceAdvertisementStatus {
	var out []api.ServiceAdvertisementStatus
	for _, d := range s.serviceDecisions {
		out = append(out, api.ServiceAdvertisementStatus{Service: d.Service, Kind: d.Kind, Prefix: d.Prefix.String(),
			Advertised: d.Advertised, Refused: d.Refused, Reason: d.Reason})
	}
	return out
}
