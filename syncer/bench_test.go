package syncer

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// BenchmarkRemotePodAdd is what another node's pod ADD costs this node's
// view: the events of its block (an allocation in a block affine to that
// node: no update) and its endpoint (one update), with four wake-only
// subscribers like the agent's owners, none of which takes it.
func BenchmarkRemotePodAdd(b *testing.B) {
	s := New(nil, slog.New(slog.DiscardHandler))
	s.apply(datastore.Event{Type: datastore.EventResync, Revision: 1})
	for range 4 {
		s.Notify("other-node-owner", On(func(u Update[api.WorkloadEndpoint]) bool {
			return u.New != nil && u.New.Spec.Node == "node2"
		}))
	}
	blockKey := "ipam/blocks/10.244.0.0-26"
	block := func(n int) []byte {
		allocs := make([]*int, 64)
		var unalloc []int
		var attrs []map[string]any
		for ord := range 64 {
			if ord < n {
				i := len(attrs)
				allocs[ord] = &i
				attrs = append(attrs, map[string]any{"handle": fmt.Sprintf("k8s-pod-network.%064d", ord), "node": "node1",
					"namespace": "default", "pod": fmt.Sprintf("web-%d", ord), "containerID": fmt.Sprintf("%064d", ord), "time": time.Now()})
				continue
			}
			unalloc = append(unalloc, ord)
		}
		v, _ := json.Marshal(map[string]any{"cidr": "10.244.0.0/26", "affinity": "host:node1", "allocations": allocs, "unallocated": unalloc, "attributes": attrs})
		return v
	}
	var blocks, weps [][]byte
	var wepKeys []string
	for n := 1; n < 64; n++ {
		blocks = append(blocks, block(n))
		w := &api.WorkloadEndpoint{Metadata: api.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("node1-k8s-web-%d-eth0", n)},
			Spec: api.WorkloadEndpointSpec{Node: "node1", Orchestrator: "k8s", Pod: fmt.Sprintf("web-%d", n), ContainerID: fmt.Sprintf("%064d", n),
				Endpoint: "eth0", InterfaceName: "cali0123456789a", IPNetworks: []string{fmt.Sprintf("10.244.0.%d/32", n)}}}
		w.SetDefaults()
		key, _ := datastore.ResourceKey(api.KindWorkloadEndpoint, "default", w.Metadata.Name)
		v, _ := json.Marshal(w)
		weps, wepKeys = append(weps, v), append(wepKeys, key)
	}
	rev := int64(1)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		n := i % 63
		rev++
		s.apply(datastore.Event{Type: datastore.EventPut, KV: datastore.KV{Key: blockKey, Value: blocks[n], ModRevision: rev}, Revision: rev})
		rev++
		s.apply(datastore.Event{Type: datastore.EventPut, KV: datastore.KV{Key: wepKeys[n], Value: weps[n], ModRevision: rev}, Revision: rev})
	}
}
