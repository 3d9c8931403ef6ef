package syncer_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/syncer"
)

// benchEtcdEnv makes the test binary an etcd that writes pod ADDs on
// command (see TestMain): the writer's and etcd's CPU stay out of the
// benchmark's process.
const benchEtcdEnv = "TABBY_SYNCER_BENCH_ETCD"

func TestMain(m *testing.M) {
	storetest.ServeChild(benchEtcdEnv, benchEtcdCommand)
	os.Exit(m.Run())
}

// BenchmarkRemotePodEvents is what a pod added on another node costs one
// agent's cluster view, end to end: a real etcd in another process
// (written by the real IPAM allocator and the endpoint create an ADD
// makes: the block and handle in one transaction, then the endpoint), this
// process's etcd client and watch, the view's decoding and indexes, and
// the agent's owners' filters deciding "nothing for me". The view starts
// with 30 nodes of 30 pods each. It reports this process's CPU time (user
// + system, getrusage) per remote ADD: cpu-µs/pod; allocs/op are this
// process's too, per ADD. With TABBY_BENCH_RIDER=1 the endpoint rides in
// the IPAM transaction (AssignRequest.With), as the agent writes it: one
// transaction per ADD.
func BenchmarkRemotePodEvents(b *testing.B) {
	ch := storetest.StartChild(b, benchEtcdEnv)
	ch.Do(b, "preload 30 30")
	store, err := datastore.New(b.Context(), datastore.Config{Endpoints: []string{ch.URL}})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	v := syncer.New(store, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(b.Context())
	done := make(chan struct{})
	go func() { defer close(done); _ = v.Run(ctx) }()
	defer func() { cancel(); <-done }()
	woken := agentLikeOwners(v, "node0")
	if err := v.WaitSynced(ctx); err != nil {
		b.Fatal(err)
	}
	// Warm up: the node's first pod claims its block.
	v.WaitRevision(ctx, ch.Do(b, "add 20"))

	const chunk = 50
	b.ReportAllocs()
	before, n := cpuTime(), 0
	b.ResetTimer()
	for n < b.N {
		k := min(chunk, b.N-n)
		if err := v.WaitRevision(ctx, ch.Do(b, fmt.Sprintf("add %d", k))); err != nil {
			b.Fatal(err)
		}
		n += k
	}
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-before).Microseconds())/float64(b.N), "cpu-µs/pod")
	// A new block of the other node (every 64th pod) wakes the tunnel
	// owner; nothing else should.
	b.ReportMetric(float64(woken())/float64(b.N), "wakes/pod")
}

// agentLikeOwners subscribes the agent's owners' filters for node (routes,
// BGP, tunnel, node GC, policy without policies) and returns how many
// updates they took.
func agentLikeOwners(v *syncer.Syncer, node string) func() int64 {
	mine := func(w *api.WorkloadEndpoint) bool { return w.Spec.Node == node }
	blockOf := func(b *ipam.BlockSummary) bool { return b.Affinity == node }
	claimOf := func(a *ipam.Affinity) bool { return a.Node == node }
	subs := []*syncer.Signal{
		v.Notify("routes", syncer.On[api.IPPool](nil),
			syncer.On(func(u syncer.Update[api.WorkloadEndpoint]) bool { return u.Either(mine) }),
			syncer.On(func(u syncer.Update[ipam.BlockSummary]) bool { return u.Either(blockOf) }),
			syncer.On(func(u syncer.Update[ipam.Affinity]) bool { return u.Either(claimOf) })),
		v.Notify("bgp", syncer.On[api.Node](nil), syncer.On[api.BGPConfiguration](nil), syncer.On[api.BGPPeer](nil),
			syncer.On(func(u syncer.Update[ipam.BlockSummary]) bool { return u.Either(blockOf) }),
			syncer.On(func(u syncer.Update[ipam.Affinity]) bool { return u.Either(claimOf) })),
		v.Notify("tunnel", syncer.On[api.IPPool](nil), syncer.On[api.Node](nil), syncer.On[ipam.BlockSummary](nil)),
		v.Notify("nodegc", syncer.On(func(u syncer.Update[api.Node]) bool { return u.Old == nil || u.New == nil }), syncer.On[datastore.KV](nil)),
		v.Notify("policy", syncer.On[api.NetworkPolicy](nil),
			syncer.On(func(u syncer.Update[api.WorkloadEndpoint]) bool { return u.Either(mine) || v.PolicyCount() > 0 }), syncer.On[api.GlobalNetworkPolicy](nil)),
	}
	start := make([]int64, len(subs))
	for i, s := range subs {
		start[i] = s.Matched()
	}
	return func() int64 {
		var n int64
		for i, s := range subs {
			n += s.Matched() - start[i]
		}
		return n
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchEtcdCommand is the child's command (storetest.ServeChild): a
// writer making pod ADDs as the agent does. "preload N P" adds P pods on
// each of N nodes, "add K" K pods on node1.
func benchEtcdCommand(ctx context.Context, store *datastore.Store, f []string) (int64, error) {
	benchOnce.Do(func() {
		benchAlloc = ipam.New(store)
		_, benchErr = benchAlloc.CreatePool(ctx, &api.IPPool{Metadata: api.ObjectMeta{Name: "default"},
			Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16"}})
	})
	if benchErr != nil {
		return 0, benchErr
	}
	add := func(node string) (int64, error) {
		benchPods++
		return benchAdd(ctx, store, benchAlloc, node, benchPods)
	}
	var rev int64
	var err error
	switch {
	case len(f) == 3 && f[0] == "preload":
		nodes, _ := strconv.Atoi(f[1])
		per, _ := strconv.Atoi(f[2])
		for n := range nodes {
			for range per {
				if rev, err = add(fmt.Sprintf("node%d", n+2)); err != nil {
					return 0, err
				}
			}
		}
	case len(f) == 2 && f[0] == "add":
		k, _ := strconv.Atoi(f[1])
		for range k {
			if rev, err = add("node1"); err != nil {
				return 0, err
			}
		}
	default:
		return 0, fmt.Errorf("unknown command %q", f)
	}
	return rev, nil
}

// The child's writer state (one child process, one command at a time).
var (
	benchOnce  sync.Once
	benchAlloc *ipam.Allocator
	benchErr   error
	benchPods  int
)

// benchAdd writes what an ADD of pod i on node writes: the IPAM
// assignment, then the WorkloadEndpoint (as the agent builds it).
func benchAdd(ctx context.Context, store *datastore.Store, alloc *ipam.Allocator, node string, i int) (int64, error) {
	id := fmt.Sprintf("%064x", i)
	pod := fmt.Sprintf("web-%d", i)
	handle := "k8s-pod-network." + id
	req := ipam.AssignRequest{Node: node, Handle: handle, Family: 4,
		Attrs: ipam.Attributes{Node: node, Namespace: "default", Pod: pod, ContainerID: id}}
	if os.Getenv("TABBY_BENCH_RIDER") == "1" {
		req.With = func(addr netip.Addr) ([]datastore.Cmp, []datastore.Op, error) {
			_, c, op, err := datastore.CreateOp(benchEndpoint(node, pod, id, handle, addr))
			return []datastore.Cmp{c}, []datastore.Op{op}, err
		}
	}
	a, err := alloc.Assign(ctx, req)
	if err != nil {
		return 0, err
	}
	if req.With != nil {
		return a.WithRev, nil
	}
	obj, err := store.Create(ctx, benchEndpoint(node, pod, id, handle, a.Addr))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(obj.GetMeta().ResourceVersion, 10, 64)
}

// benchEndpoint is the endpoint an ADD of pod writes, as the agent builds it.
func benchEndpoint(node, pod, id, handle string, addr netip.Addr) *api.WorkloadEndpoint {
	w := &api.WorkloadEndpoint{
		Metadata: api.ObjectMeta{Namespace: "default", Name: node + "-k8s-" + pod + "-eth0",
			Labels:      map[string]string{"app": "web", "tier": "frontend", "pod-template-hash": "5d8f7c9b4"},
			Annotations: map[string]string{api.AnnotationOrigin: api.OriginKubernetes}},
		Spec: api.WorkloadEndpointSpec{Node: node, Orchestrator: "k8s", Pod: pod, ContainerID: id, Endpoint: "eth0",
			InterfaceName: "cali" + id[:11], MAC: "0e:11:22:33:44:55", IPAMHandle: handle,
			IPNetworks:      []string{netip.PrefixFrom(addr, 32).String()},
			NamespaceLabels: map[string]string{"kubernetes.io/metadata.name": "default"}},
	}
	w.SetDefaults()
	return w
}
