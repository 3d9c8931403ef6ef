package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/lab"
)

// TestEtcdMemberLoss runs the lab on a 3-member etcd cluster, as users
// run etcd, and kills (SIGKILL) one member during pod churn: the member
// that is the leader and the first endpoint in every agent's list, the
// worst case. It restarts the member 20 s later. No ADD or DEL fails,
// nothing is lost (no leaked address, the restarted member serves every
// IPAM and resource key the others do), and the ADD latency with the
// member down is measured against all members up in the same run, as the
// runtime sees it (the lab's CNI call) and as the agent logs it.
func TestEtcdMemberLoss(t *testing.T) {
	l := upLab(t, lab.Options{Name: "e2eetcd", Nodes: 3, PodsPerNode: 1, EtcdMembers: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	st := l.State()
	endpoints := strings.Join(st.EtcdEndpoints(), ",")
	for _, n := range st.Nodes {
		if i := slices.Index(n.Agent.Argv, "--etcd-endpoints"); i < 0 || n.Agent.Argv[i+1] != endpoints {
			t.Fatalf("%s's agent does not get every member's endpoint (%s): %q", n.Name, endpoints, n.Agent.Argv)
		}
	}
	victim := st.Etcd[0].Name // first in every agent's list
	moveLeader(ctx, t, l, victim)

	// Churn: two workers add and delete pods on every node until told
	// to stop, recording each ADD.
	var (
		mu       sync.Mutex
		adds     []addSample
		errs     []string
		stopCh   = make(chan struct{})
		stopOnce sync.Once
		wg       sync.WaitGroup
		seq      int
	)
	nodes := []string{"node1", "node2", "node3"}
	for w := range 2 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stopCh:
					return
				default:
				}
				mu.Lock()
				seq++
				name := fmt.Sprintf("w20c%d", seq)
				mu.Unlock()
				start := time.Now()
				_, err := l.AddPod(ctx, nodes[(w+i)%len(nodes)], name, lab.PodOptions{Namespace: "churn"})
				took := time.Since(start)
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Sprintf("%s add %s: %v", start.Format("15:04:05.000"), name, err))
				} else {
					adds = append(adds, addSample{start, took})
				}
				mu.Unlock()
				if err != nil {
					continue
				}
				if err := l.DelPod(ctx, name); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Sprintf("%s del %s: %v", time.Now().Format("15:04:05.000"), name, err))
					mu.Unlock()
				}
			}
		})
	}
	stopChurn := func() {
		stopOnce.Do(func() { close(stopCh) })
		wg.Wait()
	}
	defer stopChurn()

	// A phase lasts its time, and longer until it holds enough ADDs to
	// compare (a loaded machine adds a pod every second or two).
	waitAdds := func(from time.Time, least time.Duration) {
		deadline := time.Now().Add(3 * time.Minute)
		for time.Since(from) < least || time.Now().Before(deadline) {
			mu.Lock()
			n := 0
			for _, a := range adds {
				if !a.start.Before(from) {
					n++
				}
			}
			mu.Unlock()
			if n >= minPhaseAdds && time.Since(from) >= least {
				return
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	t0 := time.Now()
	waitAdds(t0, 15*time.Second)
	tKill := time.Now()
	if err := l.StopEtcdMember(ctx, victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The phase compared starts 5 s after the kill.
	waitAdds(tKill.Add(5*time.Second), 15*time.Second)
	tRestart := time.Now()
	if err := l.StartEtcdMember(ctx, victim); err != nil {
		t.Fatal(err)
	}
	tBack := time.Now()
	t.Logf("etcd member %s killed at +%v, restarted at +%v, serving again at +%v",
		victim, tKill.Sub(t0).Round(time.Millisecond), tRestart.Sub(t0).Round(time.Millisecond), tBack.Sub(t0).Round(time.Millisecond))
	time.Sleep(10 * time.Second)
	stopChurn()
	tEnd := time.Now()

	if len(errs) > 0 {
		t.Errorf("%d churn errors with one etcd member lost:\n%s", len(errs), strings.Join(errs, "\n"))
	}
	phases := []phase{
		{"all members up", t0, tKill},
		{"leader killed, first 5 s", tKill, tKill.Add(5 * time.Second)},
		{"one member down", tKill.Add(5 * time.Second), tRestart},
		{"member rejoining", tRestart, tBack},
		{"all up again", tBack, tEnd},
	}
	agent := agentAddSamples(t, l)
	t.Logf("ADD latency by phase (runtime: the lab's CNI call, 2 workers; agent: its CNI request duration):")
	var upRuntime, downRuntime, upAgent, downAgent []time.Duration
	for _, ph := range phases {
		r, a := ph.of(adds), ph.of(agent)
		t.Logf("  %-26s runtime %s | agent %s", ph.name, summary(r), summary(a))
		switch ph.name {
		case "all members up":
			upRuntime, upAgent = r, a
		case "one member down":
			downRuntime, downAgent = r, a
		}
	}
	if len(upRuntime) < minPhaseAdds || len(downRuntime) < minPhaseAdds {
		t.Errorf("too few ADDs to compare: %d with all members up, %d with one down", len(upRuntime), len(downRuntime))
	} else {
		// A dead first endpoint must not cost an ADD a dial timeout: the
		// client balances over the live members. Generous, for a loaded
		// machine; BENCHMARKS.md has the figures.
		up, down := testkit.Quantile(upAgent, 0.5), testkit.Quantile(downAgent, 0.5)
		if down > 2*up+50*time.Millisecond {
			t.Errorf("median agent ADD with one etcd member down %v, with all up %v: a dead endpoint slows ADDs", down, up)
		}
	}

	// Nothing lost: no leaked address, and the restarted member serves
	// what the others do.
	rep, err := ipam.New(l.Store(), ipam.WithLeakGrace(0)).Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Errorf("ipam check after the churn: leaks %v, orphan handles %v, inconsistencies %v", rep.Leaks, rep.OrphanHandles, rep.Inconsistencies)
	}
	for _, prefix := range []string{"ipam/", "resources/"} {
		restarted := listFrom(ctx, t, l, victim, prefix)
		other := listFrom(ctx, t, l, st.Etcd[1].Name, prefix)
		if diff := cmp.Diff(other, restarted); diff != "" {
			t.Errorf("%s keys on the restarted member %s differ from %s's (-%s +%s):\n%s", prefix, victim, st.Etcd[1].Name, st.Etcd[1].Name, victim, diff)
		}
	}
	pingMatrix(t, l)
}

// minPhaseAdds is how many ADDs a phase of TestEtcdMemberLoss needs for
// its medians to be compared.
const minPhaseAdds = 10

// moveLeader makes member the etcd cluster's leader.
func moveLeader(ctx context.Context, t *testing.T, l *lab.Lab, member string) {
	t.Helper()
	clients := map[string]*clientv3.Client{}
	ids := map[string]uint64{}
	var leader uint64
	for _, m := range l.State().Etcd {
		ep := "unix://" + l.EtcdSocket(m.Name)
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := c.Status(ctx, ep)
		if err != nil {
			t.Fatalf("status of etcd member %s: %v", m.Name, err)
		}
		clients[m.Name], ids[m.Name], leader = c, s.Header.MemberId, s.Leader
	}
	if leader == ids[member] {
		t.Logf("etcd member %s is the leader", member)
		return
	}
	for name, id := range ids {
		if id == leader {
			if _, err := clients[name].MoveLeader(ctx, ids[member]); err != nil {
				t.Fatalf("moving etcd leadership from %s to %s: %v", name, member, err)
			}
			t.Logf("etcd leadership moved from %s to %s", name, member)
			return
		}
	}
	t.Fatalf("no etcd member is the leader (%x)", leader)
}

// listFrom lists prefix through one etcd member only.
func listFrom(ctx context.Context, t *testing.T, l *lab.Lab, member, prefix string) map[string]string {
	t.Helper()
	s, err := datastore.New(ctx, datastore.Config{Endpoints: []string{"unix://" + l.EtcdSocket(member)}})
	if err != nil {
		t.Fatalf("connecting to etcd member %s alone: %v", member, err)
	}
	defer s.Close()
	kvs, _, err := s.ListKV(ctx, prefix)
	if err != nil {
		t.Fatalf("listing %s on etcd member %s: %v", prefix, member, err)
	}
	out := map[string]string{}
	for _, kv := range kvs {
		out[kv.Key] = string(kv.Value)
	}
	return out
}

// addSample is one ADD: when it started and how long it took.
type addSample struct {
	start time.Time
	took  time.Duration
}

type phase struct {
	name       string
	start, end time.Time
}

// of returns the durations of the samples that started in the phase.
func (p phase) of(samples []addSample) []time.Duration {
	var out []time.Duration
	for _, s := range samples {
		if !s.start.Before(p.start) && s.start.Before(p.end) {
			out = append(out, s.took)
		}
	}
	return out
}

var cniDone = regexp.MustCompile(`^time=(\S+) .*msg="CNI request done" .*cmd=ADD .*dur=(\S+)`)

// agentAddSamples reads every agent's log for its CNI ADDs.
func agentAddSamples(t *testing.T, l *lab.Lab) []addSample {
	t.Helper()
	var out []addSample
	for _, n := range l.State().Nodes {
		f, err := os.Open(n.Agent.Log)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			m := cniDone.FindStringSubmatch(sc.Text())
			if m == nil {
				continue
			}
			end, err1 := time.Parse(time.RFC3339Nano, m[1])
			d, err2 := time.ParseDuration(m[2])
			if err1 == nil && err2 == nil {
				out = append(out, addSample{end.Add(-d), d})
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// summary is "n=…, p50 …, p90 …, max …" of ds.
func summary(ds []time.Duration) string {
	if len(ds) == 0 {
		return "n=0"
	}
	return fmt.Sprintf("n=%d p50 %v p90 %v max %v", len(ds), testkit.Quantile(ds, 0.5).Round(100*time.Microsecond),
		testkit.Quantile(ds, 0.9).Round(100*time.Microsecond), slices.Max(ds).Round(100*time.Microsecond))
}
