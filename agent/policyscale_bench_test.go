package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/policy"
	"github.com/tabbynet/tabby/syncer/syncertest"
)

// The cluster of BenchmarkPolicyRemotePodAdd: 1,000 nodes of 30 endpoints
// each (node0 is this one) and 1,000 NetworkPolicies shaped like the scale
// harness's (lab/simrun.go writePolicies): sim-target admits role=probe;
// sim-pI selects app=svc-(I%100) and admits role=r-(I%50). The simulated
// endpoints carry lab's simLabels (app=svc-(k%100), role=r-(k%50)). This
// node's 31 pods are app=sim-target and app=svc-0…svc-29, so that 301
// policies apply here and their rules make 31 selector sets: role=probe
// and role=r-0…r-29 (600 members each). A remote pod with role r-0…r-29 is
// relevant here; one with r-30…r-49 is not.
const (
	scaleNodes       = 1000
	scaleEpsPerNode  = 30
	scalePolicies    = 1000
	scaleLocalApps   = 30
	scaleRelevantMax = 30 // roles r-0…r-29 are in a set here
)

// scaleSnapshots holds the list of each cluster size, built once.
var scaleSnapshots sync.Map // node count → func() ([]datastore.KV, error)

func scaleSnapshot(nodes int) ([]datastore.KV, error) {
	f, _ := scaleSnapshots.LoadOrStore(nodes, sync.OnceValues(func() ([]datastore.KV, error) { return buildScaleSnapshot(nodes) }))
	return f.(func() ([]datastore.KV, error))()
}

func buildScaleSnapshot(nodes int) ([]datastore.KV, error) {
	var kvs []datastore.KV
	put := func(obj api.Object) error {
		obj.SetDefaults()
		key, err := datastore.ResourceKey(api.KindOf(obj), obj.GetMeta().Namespace, obj.GetMeta().Name)
		if err != nil {
			return err
		}
		b, err := json.Marshal(obj)
		if err != nil {
			return err
		}
		kvs = append(kvs, datastore.KV{Key: key, Value: b, ModRevision: 1})
		return nil
	}
	objs := []api.Object{&api.IPPool{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", NATOutgoing: true}}}
	for n := range nodes {
		objs = append(objs, &api.Node{Metadata: api.ObjectMeta{Name: scaleNode(n)},
			Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: fmt.Sprintf("198.18.%d.%d/16", 4+n/250, 1+n%250)}}})
	}
	objs = append(objs, scaleWEP(0, 0, map[string]string{"app": "sim-target"}))
	for k := range scaleLocalApps {
		objs = append(objs, scaleWEP(0, k+1, map[string]string{"app": fmt.Sprintf("svc-%d", k)}))
	}
	for n := 1; n < nodes; n++ {
		for k := range scaleEpsPerNode {
			objs = append(objs, scaleWEP(n, k, map[string]string{"app": fmt.Sprintf("svc-%d", k%100), "role": fmt.Sprintf("r-%d", k%50)}))
		}
	}
	tcp := "TCP"
	pol := func(name string, sel, from map[string]string) *api.NetworkPolicy {
		return &api.NetworkPolicy{Metadata: api.ObjectMeta{Name: name, Namespace: "default"},
			Spec: api.NetworkPolicySpec{PodSelector: api.LabelSelector{MatchLabels: sel},
				Ingress: []api.NetworkPolicyIngressRule{{From: []api.NetworkPolicyPeer{{PodSelector: &api.LabelSelector{MatchLabels: from}}}},
					{Ports: []api.NetworkPolicyPort{{Protocol: &tcp}}}},
				PolicyTypes: []api.PolicyType{api.PolicyTypeIngress}}}
	}
	objs = append(objs, pol("sim-target", map[string]string{"app": "sim-target"}, map[string]string{"role": "probe"}))
	for i := 1; i < scalePolicies; i++ {
		objs = append(objs, pol(fmt.Sprintf("sim-p%d", i), map[string]string{"app": fmt.Sprintf("svc-%d", i%100)},
			map[string]string{"role": fmt.Sprintf("r-%d", i%50)}))
	}
	for _, o := range objs {
		if err := put(o); err != nil {
			return nil, err
		}
	}
	return kvs, nil
}

func scaleNode(n int) string { return fmt.Sprintf("node%d", n) }

// scaleWEP is endpoint k of node n; its address is unique for k < 65.
func scaleWEP(n, k int, labels map[string]string) *api.WorkloadEndpoint {
	i := n*65 + k
	w := testWEP(scaleNode(n), "default", fmt.Sprintf("p%d", k), fmt.Sprintf("cali%011x", i), fmt.Sprintf("10.%d.%d.%d", 244+i>>16, i>>8&0xff, i&0xff), labels)
	return w
}

// BenchmarkPolicyRemotePodAdd is what a pod added on another node costs
// this agent's cluster view and policy owner with 30,000 endpoints and
// 1,000 policies (the cluster above): the view decodes and indexes the
// endpoint, the owner's filter decides, and when it wakes the owner its
// pass compiles and hands the result to the (fake) firewall, as the
// owner's loop would. A relevant pod's role is in one of this node's sets,
// an irrelevant one's is not. It reports this process's CPU (user +
// system) per remote ADD, cpu-µs/pod, and the passes it caused per ADD.
// Run it with a fixed count: -benchtime=400x.
// BenchmarkPolicyRemotePodAddSizes is the same at 100, 300 and 1,000 nodes
// (3,000 to 30,000 endpoints): the cost should not grow with them.
func BenchmarkPolicyRemotePodAdd(b *testing.B) {
	for _, relevant := range []bool{false, true} {
		name := map[bool]string{false: "irrelevant", true: "relevant"}[relevant]
		b.Run(name, func(b *testing.B) { benchRemotePodAdd(b, scaleNodes, relevant) })
	}
}

func BenchmarkPolicyRemotePodAddSizes(b *testing.B) {
	for _, nodes := range []int{100, 300, scaleNodes} {
		for _, relevant := range []bool{false, true} {
			name := fmt.Sprintf("nodes=%d/%s", nodes, map[bool]string{false: "irrelevant", true: "relevant"}[relevant])
			b.Run(name, func(b *testing.B) { benchRemotePodAdd(b, nodes, relevant) })
		}
	}
}

func benchRemotePodAdd(b *testing.B, nodes int, relevant bool) {
	kvs, err := scaleSnapshot(nodes)
	if err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	src := make(syncertest.Script)
	v := syncertest.Start(b, src, quietLog(), false)
	fw := &memoFirewall{}
	p := newPolicyOwner(scaleNode(0), v, fw, quietLog())
	src <- datastore.Event{Type: datastore.EventResync, Snapshot: kvs, Revision: 1}
	if err := v.WaitSynced(ctx); err != nil {
		b.Fatal(err)
	}
	if err := p.sync(ctx, false); err != nil {
		b.Fatal(err)
	}
	// The pods to add, encoded before the clock starts: 30 more on each
	// remote node in turn.
	events := make([]datastore.Event, b.N)
	for i := range events {
		role := scaleRelevantMax + i%(50-scaleRelevantMax)
		if relevant {
			role = i % scaleRelevantMax
		}
		w := scaleWEP(1+i%(nodes-1), scaleEpsPerNode+i/(nodes-1)%35, map[string]string{"app": fmt.Sprintf("svc-%d", i%100), "role": fmt.Sprintf("r-%d", role)})
		w.Metadata.Name += fmt.Sprintf("-%d", i)
		b, err := json.Marshal(w)
		if err != nil {
			panic(err)
		}
		key, _ := datastore.ResourceKey(api.KindWorkloadEndpoint, w.Metadata.Namespace, w.Metadata.Name)
		rev := int64(2 + i)
		events[i] = datastore.Event{Type: datastore.EventPut, KV: datastore.KV{Key: key, Value: b, ModRevision: rev}, Revision: rev}
	}
	drain(p.sub.C())
	drain(p.kick)
	passes := 0
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	for i := range b.N {
		src <- events[i]
		if err := v.WaitRevision(ctx, events[i].Revision); err != nil {
			b.Fatal(err)
		}
		for woke := true; woke; {
			select {
			case <-p.sub.C():
			case <-p.kick:
			default:
				woke = false
				continue
			}
			passes++
			if err := p.sync(ctx, false); err != nil {
				b.Fatal(err)
			}
		}
	}
	cpu := processCPU() - cpu0
	b.StopTimer()
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/pod")
	b.ReportMetric(float64(passes)/float64(b.N), "passes/pod")
}

// processCPU is this process's CPU time so far (user + system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// memoFirewall stands for the kernel backend's own bookkeeping, without a
// kernel: like the nftables backend it skips the chains and sets that are
// the very objects it applied last (the compiler shares what did not
// change) and diffs the members of the others. (dataplane/fake re-renders
// and compares every member on every Apply: at 18,000 set members that
// alone is tens of milliseconds, which is the fake's cost, not the agent's.)
type memoFirewall struct {
	chains map[string][]policy.Rule
	sets   map[string]policy.Set
}

func (f *memoFirewall) Remove(context.Context) error { f.chains, f.sets = nil, nil; return nil }

func (f *memoFirewall) Apply(_ context.Context, s dataplane.FirewallState) (dataplane.ApplyStats, error) {
	var st dataplane.ApplyStats
	chains := make(map[string][]policy.Rule, len(s.Chains))
	for _, c := range s.Chains {
		k := c.Table + "/" + c.Name
		chains[k] = c.Rules
		if old, ok := f.chains[k]; !ok || !policy.SameSlice(old, c.Rules) {
			st.ChainsWritten++
			st.RulesWritten += len(c.Rules)
		}
	}
	st.ChainsDeleted = len(f.chains) + st.ChainsWritten - len(chains)
	sets := make(map[string]policy.Set, len(s.Sets))
	for _, n := range s.Sets {
		sets[n.Name] = n
		old, ok := f.sets[n.Name]
		switch {
		case !ok:
			st.SetsCreated++
			st.MembersAdded += len(n.Nets) + len(n.AddrPorts)
		case !policy.SameSlice(old.Nets, n.Nets):
			// Both sorted: one merge.
			a, b := old.Nets, n.Nets
			for len(a) > 0 || len(b) > 0 {
				switch {
				case len(b) == 0 || len(a) > 0 && a[0].Addr().Less(b[0].Addr()):
					st.MembersRemoved++
					a = a[1:]
				case len(a) == 0 || b[0].Addr().Less(a[0].Addr()):
					st.MembersAdded++
					b = b[1:]
				default:
					a, b = a[1:], b[1:]
				}
			}
		}
	}
	f.chains, f.sets = chains, sets
	return st, nil
}
