package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/lab"
)

// churnOpsEnv sets how many pod operations (each one CNI ADD or one CNI DEL
// the test issues; retries of a DEL that failed count again) TestChurnCrash
// runs. The default keeps the test near two minutes on a loaded two-core
// machine; BENCHMARKS.md has a run of 2,000.
const churnOpsEnv = "TABBY_CHURN_OPS"

const (
	churnNodes   = 10
	churnWorkers = 6
	// churnGrace is the agents' --node-gc-grace in this lab.
	churnGrace = 10 * time.Second
	// deletedNode leaves for good a third of the way through; reAddedNode
	// loses its Node record and its agent half way through and is back
	// before the grace ends, with its pods.
	deletedNode = "node10"
	reAddedNode = "node9"
)

// churnNode is one lab node as the churn sees it: ops and kills on it hold
// the read lock, its removal or re-adding the write lock.
type churnNode struct {
	name string
	mu   sync.RWMutex
	gone bool
}

// TestChurnCrash: 10 nodes, pods added and deleted concurrently across
// them, while agents are killed with SIGKILL and restarted at random, one
// node is deleted (agent stopped, pods gone without DEL, Node record
// removed) and another loses its Node record and its agent and comes back
// within the node GC grace. A failed ADD or DEL (its agent was killed) is
// retried the way a runtime does. At the end, after node GC's grace: no
// address is held twice (IPAM, endpoints, lab pods), every allocation has
// its pod's endpoint (no leaks), every endpoint is a live pod's (none
// stale), each node's kernel has exactly its pods' routes and links, and
// the deleted node's endpoints, addresses and blocks are gone.
func TestChurnCrash(t *testing.T) {
	ops := 400
	if v := os.Getenv(churnOpsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 20 {
			t.Fatalf("%s=%q: want a number of at least 20", churnOpsEnv, v)
		}
		ops = n
	}
	l := upLab(t, lab.Options{Name: "c19churn", Nodes: churnNodes, AgentArgs: []string{"--node-gc-grace", churnGrace.String()}})
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	start := time.Now()

	nodes := make([]*churnNode, churnNodes)
	for i := range nodes {
		nodes[i] = &churnNode{name: fmt.Sprintf("node%d", i+1)}
	}
	nodeByName := func(n string) *churnNode {
		return nodes[slices.IndexFunc(nodes, func(c *churnNode) bool { return c.name == n })]
	}

	var (
		issued                        atomic.Int64 // ops issued
		addOK, addFail, delOK, delErr atomic.Int64
		kills                         atomic.Int64
		seq                           atomic.Int64
	)
	// worker adds and deletes pods of its own; a pod whose DEL failed is
	// kept and deleted again later.
	worker := func(w int, rng *rand.Rand) {
		var mine []string // pods (maybe failed) this worker must delete
		// delFailed holds pods whose DEL failed: their interfaces may be
		// half gone, so they are deleted again until it succeeds, as a
		// runtime does, never kept.
		delFailed := map[string]bool{}
		del := func(i int) {
			p := mine[i]
			st := l.State()
			if slices.IndexFunc(st.Pods, func(q lab.PodState) bool { return q.Name == p }) < 0 {
				// Its node was deleted, and the pod with it.
				mine = slices.Delete(mine, i, i+1)
				return
			}
			if err := l.DelPod(ctx, p); err != nil {
				delErr.Add(1)
				delFailed[p] = true
				return
			}
			delOK.Add(1)
			mine = slices.Delete(mine, i, i+1)
		}
		for issued.Add(1) <= int64(ops) {
			if len(mine) > 0 && (len(mine) >= 4 || rng.IntN(2) == 0) {
				del(rng.IntN(len(mine)))
				continue
			}
			c := nodes[rng.IntN(len(nodes))]
			c.mu.RLock()
			if c.gone {
				c.mu.RUnlock()
				issued.Add(-1)
				continue
			}
			name := fmt.Sprintf("c%d-%d", w, seq.Add(1))
			p, err := l.AddPod(ctx, c.name, name, lab.PodOptions{Namespace: "churn"})
			c.mu.RUnlock()
			switch {
			case err == nil && len(p.IPs) > 0:
				addOK.Add(1)
				mine = append(mine, name)
			default:
				addFail.Add(1)
				if slices.ContainsFunc(l.State().Pods, func(q lab.PodState) bool { return q.Name == name }) {
					mine = append(mine, name) // the DEL after the failed ADD failed too
				}
			}
		}
		// What is left: live pods stay (half of them), failed ones are
		// deleted until their DEL succeeds.
		deadline := time.Now().Add(3 * time.Minute)
		for i := len(mine) - 1; i >= 0; i-- {
			st := l.State()
			j := slices.IndexFunc(st.Pods, func(q lab.PodState) bool { return q.Name == mine[i] })
			if j >= 0 && len(st.Pods[j].IPs) > 0 && !delFailed[mine[i]] && rng.IntN(2) == 0 {
				continue
			}
			for {
				n := len(mine)
				del(i)
				if len(mine) < n || time.Now().After(deadline) {
					break
				}
				time.Sleep(500 * time.Millisecond)
			}
		}
	}

	// chaos kills an agent with SIGKILL every 1-3 s and restarts it 0-2 s
	// later, until the ops are done.
	chaosDone := make(chan struct{})
	var chaosErr []string
	go func() {
		defer close(chaosDone)
		rng := rand.New(rand.NewPCG(1, 2))
		for issued.Load() < int64(ops) && ctx.Err() == nil {
			time.Sleep(time.Second + time.Duration(rng.Int64N(int64(2*time.Second))))
			c := nodes[rng.IntN(len(nodes))]
			c.mu.RLock()
			if !c.gone {
				if err := l.StopAgent(ctx, c.name, syscall.SIGKILL); err != nil {
					chaosErr = append(chaosErr, err.Error())
				} else {
					kills.Add(1)
				}
				time.Sleep(time.Duration(rng.Int64N(int64(2 * time.Second))))
				if err := l.StartAgent(ctx, c.name); err != nil {
					chaosErr = append(chaosErr, err.Error())
				}
			}
			c.mu.RUnlock()
		}
	}()

	// The node events, at a third and at half of the ops.
	var deletedAt time.Time
	eventsDone := make(chan error, 1)
	type reclaimResult struct {
		at  time.Time
		err error
	}
	reclaimed := make(chan reclaimResult, 1)
	go func() {
		waitOps := func(n int64) {
			for issued.Load() < n && ctx.Err() == nil {
				time.Sleep(100 * time.Millisecond)
			}
		}
		waitOps(int64(ops / 3))
		d := nodeByName(deletedNode)
		d.mu.Lock()
		d.gone = true
		t.Logf("churn: deleting %s after %d ops", deletedNode, issued.Load())
		err := l.RemoveNode(ctx, deletedNode)
		deletedAt = time.Now()
		d.mu.Unlock()
		if err != nil {
			eventsDone <- fmt.Errorf("deleting %s: %w", deletedNode, err)
			return
		}
		// Reclaim is timed while the churn goes on.
		go func() {
			at, err := waitReclaimed(ctx, l, deletedNode, churnGrace+5*time.Minute)
			reclaimed <- reclaimResult{at, err}
		}()
		waitOps(int64(ops / 2))
		r := nodeByName(reAddedNode)
		r.mu.Lock()
		defer r.mu.Unlock()
		t.Logf("churn: %s loses its agent and its Node record after %d ops", reAddedNode, issued.Load())
		if err := l.StopAgent(ctx, reAddedNode, syscall.SIGTERM); err != nil {
			eventsDone <- err
			return
		}
		if err := l.Store().Delete(ctx, api.KindNode, "", reAddedNode, ""); err != nil {
			eventsDone <- fmt.Errorf("deleting Node %s: %w", reAddedNode, err)
			return
		}
		time.Sleep(churnGrace / 2) // gone, but not for the grace
		eventsDone <- l.StartAgent(ctx, reAddedNode)
	}()

	var wg sync.WaitGroup
	for w := range churnWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			worker(w, rand.New(rand.NewPCG(uint64(w), 19)))
		}()
	}
	wg.Wait()
	<-chaosDone
	if err := <-eventsDone; err != nil {
		t.Fatal(err)
	}
	churnTook := time.Since(start)
	if len(chaosErr) > 0 {
		t.Errorf("killing and restarting agents: %s", strings.Join(chaosErr, "; "))
	}
	// Every agent that is not running (killed just as the ops ended) runs.
	for _, n := range l.State().Nodes {
		if _, err := l.NodeStatus(ctx, n.Name); err != nil {
			_ = l.StartAgent(ctx, n.Name)
		}
	}
	if err := l.WaitEstablished(ctx); err != nil {
		t.Fatal(err)
	}
	// The pods whose DEL never succeeded are deleted now, as the runtime's
	// retries would.
	for _, p := range l.State().Pods {
		if len(p.IPs) == 0 {
			if err := retryDel(ctx, l, p.Name); err != nil {
				t.Errorf("DEL %s (its ADD failed): %v", p.Name, err)
			}
		}
	}

	r := <-reclaimed
	if r.err != nil {
		t.Fatal(r.err)
	}
	reclaimAfter := r.at.Sub(deletedAt)
	// And nothing of it came back since.
	if left, err := nodeLeftovers(ctx, l, ipam.New(l.Store()), deletedNode); err != nil || len(left) > 0 {
		t.Errorf("%s after its reclaim: %v (err %v)", deletedNode, left, err)
	}
	dups, leaks, stale := churnCheck(ctx, t, l)
	t.Logf("churn: %d ops (%d ADD ok, %d ADD failed, %d DEL ok, %d DEL failed and retried) on %d nodes with %d workers in %s; "+
		"%d agents killed with SIGKILL; %s deleted, %s re-added; duplicates %d, leaks %d, stale endpoints %d; "+
		"%s reclaimed %s after its deletion (grace %s); %d pods left; total %s",
		addOK.Load()+addFail.Load()+delOK.Load()+delErr.Load(), addOK.Load(), addFail.Load(), delOK.Load(), delErr.Load(),
		churnNodes, churnWorkers, churnTook.Round(time.Second), kills.Load(), deletedNode, reAddedNode, dups, leaks, stale,
		deletedNode, reclaimAfter.Round(100*time.Millisecond), churnGrace, len(l.State().Pods), time.Since(start).Round(time.Second))
	if kills.Load() == 0 {
		t.Error("no agent was killed: the run did not exercise crashes")
	}
}

// retryDel runs DEL for the pod until it succeeds (a minute at most).
func retryDel(ctx context.Context, l *lab.Lab, pod string) error {
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return testkit.Poll(wctx, time.Second, func() error { return l.DelPod(ctx, pod) })
}

// waitReclaimed waits until etcd holds nothing of node — endpoints,
// allocations, blocks, its gc record — and returns when it saw that.
func waitReclaimed(ctx context.Context, l *lab.Lab, node string, timeout time.Duration) (time.Time, error) {
	al := ipam.New(l.Store())
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var seen time.Time
	err := testkit.Poll(wctx, 200*time.Millisecond, func() error {
		left, err := nodeLeftovers(ctx, l, al, node)
		if err != nil {
			return err
		}
		if len(left) > 0 {
			return errors.New(strings.Join(left, ", "))
		}
		seen = time.Now()
		return nil
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("%s not reclaimed within %s: %w", node, timeout, err)
	}
	return seen, nil
}

// nodeLeftovers lists what etcd still holds of node.
func nodeLeftovers(ctx context.Context, l *lab.Lab, al *ipam.Allocator, node string) ([]string, error) {
	var left []string
	objs, _, err := l.Store().List(ctx, api.KindWorkloadEndpoint, "")
	if err != nil {
		return nil, err
	}
	for _, o := range objs {
		if w := o.(*api.WorkloadEndpoint); w.Spec.Node == node {
			left = append(left, "endpoint "+w.Metadata.Name)
		}
	}
	allocs, err := al.Allocations(ctx)
	if err != nil {
		return nil, err
	}
	for _, a := range allocs {
		if a.Node == node {
			left = append(left, "address "+a.Addr.String())
		}
	}
	blocks, err := al.Blocks(ctx)
	if err != nil {
		return nil, err
	}
	for _, b := range blocks {
		if b.Affinity == node {
			left = append(left, "block "+b.CIDR.String())
		}
	}
	switch _, err := l.Store().GetKV(ctx, datastore.NodeGCKey(node)); {
	case err == nil:
		left = append(left, "gc record")
	case !errors.Is(err, datastore.ErrNotFound):
		return nil, err
	}
	return left, nil
}

// churnCheck compares IPAM, endpoints, the lab's pods and each node's
// kernel, reports every difference and returns the counts of duplicate
// addresses, leaked addresses and stale endpoints.
func churnCheck(ctx context.Context, t *testing.T, l *lab.Lab) (dups, leaks, stale int) {
	t.Helper()
	st := l.State()
	type podKey struct{ node, containerID string }
	pods := map[podKey]lab.PodState{}
	podAddrs := map[netip.Addr][]string{}
	for _, p := range st.Pods {
		if len(p.IPs) == 0 {
			t.Errorf("pod %s has no address after the retries", p.Name)
			continue
		}
		pods[podKey{p.Node, p.ContainerID}] = p
		podAddrs[p.IPs[0].Addr()] = append(podAddrs[p.IPs[0].Addr()], p.Name)
	}
	for a, names := range podAddrs {
		if len(names) > 1 {
			dups++
			t.Errorf("pods %v share %s", names, a)
		}
	}

	objs, _, err := l.Store().List(ctx, api.KindWorkloadEndpoint, "")
	if err != nil {
		t.Fatal(err)
	}
	epAddrs := map[netip.Addr][]string{}
	seen := map[podKey]bool{}
	for _, o := range objs {
		w := o.(*api.WorkloadEndpoint)
		k := podKey{w.Spec.Node, w.Spec.ContainerID}
		var addrs []netip.Addr
		for _, n := range w.Spec.IPNetworks {
			if p, err := netip.ParsePrefix(n); err == nil {
				addrs = append(addrs, p.Addr())
				epAddrs[p.Addr()] = append(epAddrs[p.Addr()], w.Metadata.Name)
			}
		}
		p, ok := pods[k]
		if !ok || len(addrs) != 1 || addrs[0] != p.IPs[0].Addr() {
			stale++
			t.Errorf("stale endpoint %s/%s: node %s, container %.12s, addresses %v; no live pod has them", w.Metadata.Namespace, w.Metadata.Name, w.Spec.Node, w.Spec.ContainerID, addrs)
			continue
		}
		seen[k] = true
	}
	for k, p := range pods {
		if !seen[k] {
			t.Errorf("pod %s on %s (%s) has no endpoint", p.Name, p.Node, p.IPs[0])
		}
	}
	for a, names := range epAddrs {
		if len(names) > 1 {
			dups++
			t.Errorf("endpoints %v share %s", names, a)
		}
	}

	rep, err := ipam.New(l.Store(), ipam.WithLeakGrace(0)).Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leaks = len(rep.Leaks)
	for _, lk := range rep.Leaks {
		t.Errorf("leaked address %s (handle %s, node %s, pod %s)", lk.Addr, lk.Handle, lk.Node, lk.Pod)
	}
	for _, in := range rep.Inconsistencies {
		if in.Kind == ipam.DuplicateAddress {
			dups++
		}
		t.Errorf("ipam check: %s %s: %s", in.Kind, in.Key, in.Detail)
	}
	if len(rep.OrphanHandles) > 0 {
		t.Errorf("ipam check: orphan handles %v", rep.OrphanHandles)
	}
	t.Logf("ipam check: %d blocks, %d affinities, %d handles, %d endpoints, %d allocated", rep.Blocks, rep.Affinities, rep.Handles, rep.Endpoints, rep.Allocated)

	// Each node's kernel: its pods' routes and links, nothing else.
	want := map[string][]string{}
	for _, p := range pods {
		want[p.Node] = append(want[p.Node], p.IPs[0].Addr().String())
	}
	for _, n := range st.Nodes {
		out, err := l.Exec(ctx, n.Name, "ip", "-4", "route", "show", "proto", "80")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[0] != "blackhole" {
				got = append(got, strings.TrimSuffix(f[0], "/32"))
			}
		}
		w := want[n.Name]
		slices.Sort(got)
		slices.Sort(w)
		if !slices.Equal(got, w) {
			t.Errorf("%s workload routes: %v, want %v", n.Name, got, w)
		}
		links, err := l.Exec(ctx, n.Name, "ip", "-o", "link", "show")
		if err != nil {
			t.Fatal(err)
		}
		if c := strings.Count(string(links), ": cali"); c != len(w) {
			t.Errorf("%s has %d cali links, want %d", n.Name, c, len(w))
		}
	}
	return dups, leaks, stale
}
