package ctl

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// podOf is "namespace/pod", or "" when the allocation names no pod.
func podOf(a ipam.Allocation) string {
	if a.Pod == "" {
		return ""
	}
	return a.Namespace + "/" + a.Pod
}

// findAllocation returns the allocation of addr in all, sorted by address
// as (*ipam.Allocator).Allocations returns it.
func findAllocation(all []ipam.Allocation, addr netip.Addr) (ipam.Allocation, bool) {
	i, ok := slices.BinarySearchFunc(all, addr, func(a ipam.Allocation, t netip.Addr) int { return a.Addr.Compare(t) })
	if !ok {
		return ipam.Allocation{}, false
	}
	return all[i], true
}

// endpointsByAddr lists every workload endpoint and indexes them by address.
func (c *Client) endpointsByAddr(ctx context.Context) (map[netip.Addr][]*api.WorkloadEndpoint, error) {
	weps, _, err := datastore.ListAs[*api.WorkloadEndpoint](ctx, c.Store, api.KindWorkloadEndpoint, "")
	if err != nil {
		return nil, fmt.Errorf("listing workload endpoints: %w", err)
	}
	byAddr := map[netip.Addr][]*api.WorkloadEndpoint{}
	for _, w := range weps {
		addrs, _ := w.Addrs() // entries that do not parse: ipam check reports them
		for _, a := range addrs {
			byAddr[a] = append(byAddr[a], w)
		}
	}
	return byAddr, nil
}

func wepName(w *api.WorkloadEndpoint) string { return w.Metadata.Namespace + "/" + w.Metadata.Name }
