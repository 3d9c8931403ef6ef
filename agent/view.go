package agent

import (
	"slices"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/ipam"
)

// Predicates over the cluster view's values that several owners' filters
// share (with syncer.Update.Either).

// endpointOn takes node's workload endpoints.
func endpointOn(node string) func(*api.WorkloadEndpoint) bool {
	return func(w *api.WorkloadEndpoint) bool { return w.Spec.Node == node }
}

// blockOfOrLendingTo takes the blocks affine to node or lending it
// addresses.
func blockOfOrLendingTo(node string) func(*ipam.BlockSummary) bool {
	return func(b *ipam.BlockSummary) bool {
		return b.Affinity == node || slices.ContainsFunc(b.Borrowed, func(a ipam.BorrowedAddr) bool { return a.Node == node })
	}
}

// claimOf takes node's block claims.
func claimOf(node string) func(*ipam.Affinity) bool {
	return func(a *ipam.Affinity) bool { return a.Node == node }
}
