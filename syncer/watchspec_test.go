package syncer

import (
	"testing"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// The view's watch skips the keys that change with every pod anywhere
// (blocks, handles, LoadBalancer and Kubernetes records) and none of the
// keys it holds: a key layout change that moved one into the skipped
// range would silently empty the view.
func TestWatchSpecSkipsOnlyIrrelevantKeys(t *testing.T) {
	inSkip := func(key string) bool {
		for _, r := range watchSpec.Skip {
			if key >= r.From && key < r.To {
				return true
			}
		}
		return false
	}
	for _, key := range []string{
		datastore.BGPMeshKeyKey, datastore.BGPSecretsKey, datastore.NodeGCPrefix + "n1",
		ipam.AffinitiesPrefix + "n1/10.244.0.0-26", ipam.BlockSummariesPrefix + "10.244.0.0-26",
		"resources/nodes/n1", "resources/workloadendpoints/default/web", "resources/services/default/web",
	} {
		if !relevant(key) {
			t.Errorf("%s: not relevant, want it in the view", key)
		}
		if inSkip(key) || key >= watchSpec.End {
			t.Errorf("%s: outside the view's watch", key)
		}
	}
	for _, key := range []string{
		ipam.BlocksPrefix + "10.244.0.0-26", "ipam/handles/k8s-pod-network.abc", "ipam/lb/addresses/198.19.0.1",
		"kube/pods/default/web", "kube/namespaces/default",
	} {
		if relevant(key) {
			t.Errorf("%s: relevant, want it out of the view", key)
		}
		if !inSkip(key) {
			t.Errorf("%s: etcd sends it to every view, want it skipped", key)
		}
	}
}
