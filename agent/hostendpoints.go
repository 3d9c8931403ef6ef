package agent

import (
	"context"
	"net"
	"slices"
	"sort"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/policy"
	"github.com/tabbynet/tabby/syncer"
)

// hostConfig is what the policy owner needs for host endpoints, besides
// the view: the agent's own health port (a failsafe) and how to tell an
// interface exists.
type hostConfig struct {
	// healthPort, when set, is added to the inbound failsafes.
	healthPort uint16
	// linkExists reports whether the node has an interface of that name;
	// nil is net.InterfaceByName.
	linkExists func(name string) bool
}

// hostInputs are the policy inputs about host endpoints: every stored
// HostEndpoint plus, with autoHostEndpoints Enabled, this node's automatic
// one (unless a stored endpoint has its name), and the failsafes in force.
func (p *policyOwner) hostInputs() (heps []*api.HostEndpoint, in, out []policy.Failsafe) {
	heps = p.view.HostEndpoints()
	cc := p.view.ClusterConfiguration()
	if cc.AutoHostEndpointsEnabled() {
		if n, ok := p.view.Node(p.node); ok {
			auto := api.AutoHostEndpoint(n)
			if !slices.ContainsFunc(heps, func(h *api.HostEndpoint) bool { return h.Metadata.Name == auto.Metadata.Name }) {
				heps = append(heps, auto)
			}
		}
	}
	in = policy.FailsafesFrom(cc.FailsafeInbound())
	if p.host.healthPort != 0 {
		in = append(in, policy.Failsafe{Proto: "tcp", Port: p.host.healthPort})
	}
	return heps, in, policy.FailsafesFrom(cc.FailsafeOutbound())
}

// hostStatus reports this node's host endpoints: policed, or waiting for
// an interface the node does not have (its rules are in place and apply
// the moment the interface appears: they match the name; the report
// clears at the next pass, on any change or at the resync).
func (p *policyOwner) hostStatus(heps []*api.HostEndpoint) []api.HostEndpointStatus {
	exists := p.host.linkExists
	if exists == nil {
		exists = func(name string) bool { _, err := net.InterfaceByName(name); return err == nil }
	}
	var out []api.HostEndpointStatus
	for _, h := range heps {
		if h.Spec.Node != p.node {
			continue
		}
		st := api.HostEndpointStatus{Name: h.Metadata.Name, Interface: h.Spec.InterfaceName, State: api.HostEndpointPoliced}
		if !h.AllInterfaces() && !exists(h.Spec.InterfaceName) {
			st.State = api.HostEndpointNoInterface
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// affectsHost takes the Node updates that change this node's automatic
// host endpoint: this node's.
func (p *policyOwner) affectsHost(u syncer.Update[api.Node]) bool {
	return u.Either(func(n *api.Node) bool { return n.Metadata.Name == p.node })
}

// HostEndpoints returns the state of this node's host endpoints as the
// last policy pass saw them.
func (p *policyOwner) hostEndpoints() []api.HostEndpointStatus {
	p.hostMu.Lock()
	defer p.hostMu.Unlock()
	return slices.Clone(p.hostSt)
}

// watchLinks wakes the policy loop when an interface appears that a host
// endpoint of this node waits for. Without the watch (it failed, or ended)
// the periodic pass still notices. It returns when ctx ends.
func (p *policyOwner) watchLinks(ctx context.Context, watch func(context.Context) (<-chan string, error)) {
	links, err := watch(ctx)
	if err != nil {
		p.log.Warn("not watching interfaces: host endpoints waiting for one are reported at the resync", "err", err)
		return
	}
	for name := range links {
		if slices.ContainsFunc(p.hostEndpoints(), func(h api.HostEndpointStatus) bool {
			return h.Interface == name && h.State == api.HostEndpointNoInterface
		}) {
			select {
			case p.kick <- struct{}{}:
			default:
			}
		}
	}
}
