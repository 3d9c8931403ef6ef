package ctl

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/policy"
)

// failsafeWarnings are the sentences tabbyctl prints after storing
// GlobalNetworkPolicies that would block a failsafe port on the host
// endpoints they select (policy.FailsafeConflicts): the stored host
// endpoints and, with autoHostEndpoints Enabled, every node's automatic
// one, against the cluster's failsafe ports. It lists from the store only
// when a policy was stored; a failed listing is one warning.
func (c *Client) failsafeWarnings(ctx context.Context, objs []api.Object) []string {
	var gnps []*api.GlobalNetworkPolicy
	for _, o := range objs {
		if g, ok := o.(*api.GlobalNetworkPolicy); ok {
			gnps = append(gnps, g)
		}
	}
	if len(gnps) == 0 {
		return nil
	}
	heps, in, out, err := c.hostEndpointsAndFailsafes(ctx)
	if err != nil {
		return []string{fmt.Sprintf("could not check the policies against the failsafe ports: %v", err)}
	}
	var msgs []string
	for _, g := range gnps {
		msgs = append(msgs, policy.FailsafeConflicts(g, heps, in, out)...)
	}
	return msgs
}

// hostEndpointsAndFailsafes lists the cluster's host endpoints, automatic
// ones included, and the failsafe ports in force.
func (c *Client) hostEndpointsAndFailsafes(ctx context.Context) (heps []*api.HostEndpoint, in, out []policy.Failsafe, err error) {
	heps, _, err = datastore.ListAs[*api.HostEndpoint](ctx, c.Store, api.KindHostEndpoint, "")
	if err != nil {
		return nil, nil, nil, err
	}
	var cc *api.ClusterConfiguration
	obj, err := c.Store.Get(ctx, api.KindClusterConfiguration, "", api.SingletonName)
	switch {
	case isNotFound(err):
	case err != nil:
		return nil, nil, nil, err
	default:
		if x, ok := obj.(*api.ClusterConfiguration); ok {
			cc = x
		}
	}
	if cc.AutoHostEndpointsEnabled() {
		nodes, _, err := datastore.ListAs[*api.Node](ctx, c.Store, api.KindNode, "")
		if err != nil {
			return nil, nil, nil, err
		}
		for _, n := range nodes {
			heps = append(heps, api.AutoHostEndpoint(n))
		}
	}
	return heps, policy.FailsafesFrom(cc.FailsafeInbound()), policy.FailsafesFrom(cc.FailsafeOutbound()), nil
}

// printWarnings writes each warning on its own line.
func printWarnings(w io.Writer, msgs []string) {
	for _, m := range msgs {
		fmt.Fprintf(w, "warning: %s\n", m)
	}
}

// protoPorts renders failsafe ports on one line ("<defaults>" for nil).
func protoPorts(ps *[]api.ProtoPort) string {
	if ps == nil {
		return "<defaults>"
	}
	if len(*ps) == 0 {
		return "<none>"
	}
	var s []string
	for _, p := range *ps {
		s = append(s, p.String())
	}
	return strings.Join(s, ",")
}

// hostEndpointLines are node status's lines about host endpoints.
func hostEndpointLines(b *strings.Builder, st []api.HostEndpointStatus) {
	if len(st) == 0 {
		return
	}
	var parts []string
	for _, h := range st {
		parts = append(parts, fmt.Sprintf("%s (%s: %s)", h.Name, h.Interface, h.State))
	}
	fmt.Fprintf(b, "Host endpoints: %s\n", strings.Join(parts, ", "))
}
