package syncer

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/testkit"
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

// BenchmarkViewMemory is the view's heap at 30,000 endpoints (1,000
// nodes of 30 pods, labelled as Kubernetes pods are: a few deployments'
// labels, a namespace's), reported as heap bytes per endpoint after a
// full GC, with the records' bytes already released: an agent's view
// (node0's, other nodes' endpoints compact: CompactRemote) and one that
// keeps every endpoint whole (the Kubernetes controllers').
func BenchmarkViewMemory(b *testing.B) {
	b.Run("agent", func(b *testing.B) { benchViewMemory(b, "node0") })
	b.Run("whole", func(b *testing.B) { benchViewMemory(b, "") })
}

func benchViewMemory(b *testing.B, local string) {
	const nodes, perNode = 1000, 30
	if os.Getenv("TABBY_BENCH_HEAPPROFILE") != "" {
		runtime.MemProfileRate = 512
	}
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		before := testkit.HeapAfterGC()
		b.StartTimer()
		s := New(nil, slog.New(slog.DiscardHandler))
		if local != "" {
			s.CompactRemote(local)
		}
		s.apply(datastore.Event{Type: datastore.EventResync, Revision: 1})
		rev := int64(1)
		for n := range nodes {
			evs := make([]datastore.Event, 0, perNode)
			for p := range perNode {
				rev++
				kv := memoryEndpoint(n, p)
				kv.ModRevision = rev
				evs = append(evs, datastore.Event{Type: datastore.EventPut, KV: kv, Revision: rev})
			}
			s.apply(evs...)
		}
		b.StopTimer()
		// Read as an owner pass does (the view settles what it holds).
		if got := len(s.Endpoints()) + len(s.RemoteEndpoints()); got != nodes*perNode {
			b.Fatalf("view holds %d endpoints, want %d", got, nodes*perNode)
		}
		b.ReportMetric(float64(testkit.HeapAfterGC()-before)/float64(nodes*perNode), "heap-B/endpoint")
		if f := os.Getenv("TABBY_BENCH_HEAPPROFILE"); f != "" {
			if err := testkit.WriteHeapProfile(f); err != nil {
				b.Fatal(err)
			}
		}
		runtime.KeepAlive(s)
		b.StartTimer()
	}
}

// memoryEndpoint is the record of pod p of node n as the agent writes it.
func memoryEndpoint(n, p int) datastore.KV {
	node, pod := fmt.Sprintf("node%d", n), fmt.Sprintf("web-%d-%d", n, p)
	id := fmt.Sprintf("%064x", n*1000+p)
	app := fmt.Sprintf("app%d", (n*30+p)%50) // 50 deployments
	ns := fmt.Sprintf("team%d", (n*30+p)%10)
	w := &api.WorkloadEndpoint{
		Metadata: api.ObjectMeta{Namespace: ns, Name: node + "-k8s-" + pod + "-eth0",
			Labels:      map[string]string{"app": app, "tier": "frontend", "pod-template-hash": fmt.Sprintf("%x", 0x5d8f7c9b4+(n*30+p)%50)},
			Annotations: map[string]string{api.AnnotationOrigin: api.OriginKubernetes}},
		Spec: api.WorkloadEndpointSpec{Node: node, Orchestrator: "k8s", Pod: pod, ContainerID: id, Endpoint: "eth0",
			InterfaceName: "cali" + id[:11], MAC: "0e:11:22:33:44:55", IPAMHandle: "k8s-pod-network." + id,
			IPNetworks:      []string{fmt.Sprintf("10.%d.%d.%d/32", 64+n/256, n%256, p)},
			NamespaceLabels: map[string]string{"kubernetes.io/metadata.name": ns},
			Ports:           []api.EndpointPort{{Name: "http", Protocol: "TCP", Port: 8080}}},
	}
	w.SetDefaults()
	key, _ := datastore.ResourceKey(api.KindWorkloadEndpoint, ns, w.Metadata.Name)
	v, _ := json.Marshal(w)
	return datastore.KV{Key: key, Value: v}
}
