package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tabbynet/tabby/agent/attach"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/syncer"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func testWEP(node, ns, pod, iface, ip string, labels map[string]string) *api.WorkloadEndpoint {
	w := &api.WorkloadEndpoint{
		Metadata: api.ObjectMeta{Name: node + "-k8s-" + pod + "-eth0", Namespace: ns, Labels: labels},
		Spec: api.WorkloadEndpointSpec{Node: node, Orchestrator: "k8s", Pod: pod, ContainerID: "c-" + pod,
			Endpoint: "eth0", InterfaceName: iface, IPNetworks: []string{ip + "/32"}},
	}
	w.SetDefaults()
	return w
}

func mustCreate(t *testing.T, s *datastore.Store, obj api.Object) {
	t.Helper()
	if _, err := s.Create(context.Background(), obj); err != nil {
		t.Fatalf("creating %T: %v", obj, err)
	}
}

func TestPolicyPass(t *testing.T) {
	ctx := context.Background()
	store := storetest.New(t)
	mustCreate(t, store, &api.IPPool{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16", NATOutgoing: true}})
	mustCreate(t, store, testWEP("node1", "prod", "web", "cali0000000001", "10.244.1.1", map[string]string{"app": "web"}))
	mustCreate(t, store, testWEP("node2", "prod", "client", "cali0000000002", "10.244.2.1", map[string]string{"app": "client"}))
	mustCreate(t, store, &api.NetworkPolicy{Metadata: api.ObjectMeta{Namespace: "prod", Name: "web"}, Spec: api.NetworkPolicySpec{
		PodSelector: api.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
		Ingress:     []api.NetworkPolicyIngressRule{{From: []api.NetworkPolicyPeer{{PodSelector: &api.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}}}},
	}})
	fw := &fake.Firewall{}
	p := newPolicyOwner("node1", startView(t, store), fw, quietLog())
	if err := p.sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	tw, ok := fw.Rules("filter", "tabby-tw-cali0000000001")
	if !ok || !slices.ContainsFunc(tw, func(r string) bool { return strings.Contains(r, "-j tabby-pi-") }) || !strings.HasSuffix(tw[len(tw)-1], "-j DROP") {
		t.Errorf("ingress chain of the local pod:\n%s", strings.Join(tw, "\n"))
	}
	if _, ok := fw.Rules("filter", "tabby-tw-cali0000000002"); ok {
		t.Error("chain for the other node's pod")
	}
	if m, _ := fw.Set(policySetHolding(t, fw, "10.244.2.1/32")); len(m) != 1 {
		t.Errorf("peer set members %v", m)
	}
	if m, ok := fw.Set("tabby-masq-pools"); !ok || !slices.Equal(m, []string{"10.244.0.0/16"}) {
		t.Errorf("masquerade pools %v", m)
	}
	// Nothing changed: the next pass leaves the kernel alone, and the
	// periodic (forced) one applies the same state, which the fake counts
	// as no change.
	if err := p.sync(ctx, false); err != nil || fw.Applies() != 1 {
		t.Errorf("second pass: %v, %d applies, want 1", err, fw.Applies())
	}
	if err := p.sync(ctx, true); err != nil || p.last.Changed() {
		t.Errorf("forced pass: %v, changed %+v", err, p.last)
	}
}

// TestPolicyPeriodicRelist: every periodic pass applies in full, but only
// one policyRelistAfter (5 min) of wall time after the last compiles from
// every endpoint, whatever the resync interval; the others compile the
// endpoint changes since the last pass, so that a change still reaches
// the firewall through them.
func TestPolicyPeriodicRelist(t *testing.T) {
	ctx := context.Background()
	store := storetest.New(t)
	mustCreate(t, store, &api.IPPool{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16"}})
	mustCreate(t, store, testWEP("node1", "prod", "web", "cali0000000001", "10.244.1.1", map[string]string{"app": "web"}))
	mustCreate(t, store, testWEP("node2", "prod", "client", "cali0000000002", "10.244.2.1", map[string]string{"app": "client"}))
	mustCreate(t, store, &api.NetworkPolicy{Metadata: api.ObjectMeta{Namespace: "prod", Name: "web"}, Spec: api.NetworkPolicySpec{
		PodSelector: api.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
		Ingress:     []api.NetworkPolicyIngressRule{{From: []api.NetworkPolicyPeer{{PodSelector: &api.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}}}},
	}})
	view := startView(t, store)
	clients := []string{"10.244.2.1/32"}
	for i, c := range []struct {
		name         string
		resync, tick time.Duration // tick: the time from one periodic pass to the next
		relists      []int         // the periodic passes, of 21, that compile from every endpoint
	}{
		{"default 30 s", 30 * time.Second, 30 * time.Second, []int{10, 20}},
		{"30 s ticks a millisecond early", 30 * time.Second, 30*time.Second - time.Millisecond, []int{10, 20}},
		{"30 s ticks a second late", 30 * time.Second, 31 * time.Second, []int{10, 20}},
		{"1 min", time.Minute, time.Minute, []int{5, 10, 15, 20}},
		{"10 min", 10 * time.Minute, 10 * time.Minute, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21}},
	} {
		t.Run(c.name, func(t *testing.T) {
			fw := &fake.Firewall{}
			p := newPolicyOwner("node1", view, fw, quietLog())
			now := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
			p.resync, p.now = c.resync, func() time.Time { return now }
			if err := p.sync(ctx, false); err != nil {
				t.Fatal(err)
			}
			if p.relists != 1 {
				t.Fatalf("the first pass: %d passes compiled from every endpoint, want 1", p.relists)
			}
			set := policySetHolding(t, fw, "10.244.2.1/32")
			var got []int
			for pass := 1; pass <= 21; pass++ {
				if pass == 3 {
					// A new client reaches the set through a periodic
					// pass whether or not it compiles every endpoint.
					ip := fmt.Sprintf("10.244.2.%d", 10+i)
					obj, err := store.Create(ctx, testWEP("node2", "prod", fmt.Sprintf("client%d", i), fmt.Sprintf("cali00000001%02d", i), ip, map[string]string{"app": "client"}))
					if err != nil {
						t.Fatal(err)
					}
					if err := view.WaitRevision(ctx, mustRev(t, obj)); err != nil {
						t.Fatal(err)
					}
					clients = append(clients, ip+"/32")
				}
				now = now.Add(c.tick)
				applies, relists := fw.Applies(), p.relists
				if err := p.sync(ctx, true); err != nil {
					t.Fatalf("periodic pass %d: %v", pass, err)
				}
				if fw.Applies() != applies+1 {
					t.Errorf("periodic pass %d: %d applies, want %d (a periodic pass applies in full)", pass, fw.Applies(), applies+1)
				}
				if p.relists > relists {
					got = append(got, pass)
				}
				if m, _ := fw.Set(set); !slices.Equal(m, clients) {
					t.Errorf("peer set after periodic pass %d: %v, want %v", pass, m, clients)
				}
			}
			if !slices.Equal(got, c.relists) {
				t.Errorf("periodic passes %v apart that compiled from every endpoint: %v, want %v", c.tick, got, c.relists)
			}
		})
	}
}

// policySetHolding returns the name of the selector set holding member.
func policySetHolding(t *testing.T, fw *fake.Firewall, member string) string {
	t.Helper()
	for _, l := range fw.Lines() {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "add" && f[2] == member && strings.HasPrefix(f[1], "tabby-s-") {
			return f[1]
		}
	}
	t.Fatalf("no selector set holds %s:\n%s", member, strings.Join(fw.Lines(), "\n"))
	return ""
}

// gatedFirewall blocks the first Apply until the gate opens.
type gatedFirewall struct {
	*fake.Firewall
	once    sync.Once
	entered chan struct{}
	gate    chan struct{}
}

func (g *gatedFirewall) Apply(ctx context.Context, s dataplane.FirewallState) (dataplane.ApplyStats, error) {
	g.once.Do(func() { close(g.entered); <-g.gate })
	return g.Firewall.Apply(ctx, s)
}

func TestPolicySyncCoalesces(t *testing.T) {
	store := storetest.New(t)
	fw := &gatedFirewall{Firewall: &fake.Firewall{}, entered: make(chan struct{}), gate: make(chan struct{})}
	p := newPolicyOwner("node1", startView(t, store), fw, quietLog())
	ctx := context.Background()
	errc := make(chan error, 11)
	go func() { errc <- p.sync(ctx, false) }()
	<-fw.entered // the first pass is running
	for range 10 {
		go func() { errc <- p.sync(ctx, false) }()
	}
	// Let the ten queue up behind the running pass, then release it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.requested.Lock()
		n := p.reqGen
		p.requested.Unlock()
		if n == 11 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d syncs asked", n)
		}
		time.Sleep(time.Millisecond)
	}
	close(fw.gate)
	for range 11 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	p.passMu.Lock()
	passes := p.passes
	p.passMu.Unlock()
	if passes != 2 {
		t.Errorf("%d passes for 11 syncs, want 2 (the running pass and one for all that waited)", passes)
	}
}

func TestCNIAddProgramsPolicy(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t)
	fw := &fake.Firewall{}
	e.h.policy = attach.PolicyFunc(newPolicyOwner("node1", e.view, fw, quietLog()).syncFor)

	req, conf, args := addReq("c1")
	if _, err := e.h.Add(ctx, req, conf, args); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	iface := e.endpoints(t)[0].Spec.InterfaceName
	if _, ok := fw.Rules("filter", "tabby-fw-"+iface); !ok {
		t.Errorf("no egress chain for %s after ADD:\n%s", iface, strings.Join(fw.Lines(), "\n"))
	}

	// Policy that cannot be programmed fails ADD, which rolls back.
	fw.SetFail("Apply", fake.ErrInjected)
	req2, conf2, args2 := addReq("c2")
	if _, err := e.h.Add(ctx, req2, conf2, args2); err == nil || !strings.Contains(err.Error(), "policy") {
		t.Fatalf("ADD with a failing firewall: %v", err)
	}
	if n := len(e.endpoints(t)); n != 1 {
		t.Errorf("%d endpoints after the failed ADD, want 1", n)
	}
}

// A Kubernetes pod's ADD hands the policy gate the revision of its
// records' read, which is at or above every write made before the ADD
// began and below the endpoint's own: the gate waits for the view to hold
// those (syncer.WaitHeld), and a policy written before the ADD is in the
// firewall when ADD returns.
func TestCNIAddGatesOnTheRecordsRead(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t)
	fw := &fake.Firewall{}
	owner := newPolicyOwner("node1", e.view, fw, quietLog())
	var gotRev, gotSince int64
	e.h.policy = attach.PolicyFunc(func(ctx context.Context, wep *api.WorkloadEndpoint, rev, since int64) error {
		gotRev, gotSince = rev, since
		return owner.syncFor(ctx, wep, rev, since)
	})
	pol, err := e.store.Create(ctx, &api.NetworkPolicy{Metadata: api.ObjectMeta{Namespace: "ns1", Name: "deny"},
		Spec: api.NetworkPolicySpec{PolicyTypes: []api.PolicyType{api.PolicyTypeIngress}}})
	if err != nil {
		t.Fatal(err)
	}
	polRev, _ := strconv.ParseInt(pol.GetMeta().ResourceVersion, 10, 64)
	req, conf, args := addReq("c1")
	if _, err := e.h.Add(ctx, req, conf, args); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if gotSince < polRev || gotSince >= gotRev {
		t.Errorf("the gate got since %d, rev %d; want the policy's %d <= since < rev", gotSince, gotRev, polRev)
	}
	iface := e.endpoints(t)[0].Spec.InterfaceName
	if r, _ := fw.Rules("filter", "tabby-tw-"+iface); len(r) == 0 || !strings.HasSuffix(r[len(r)-1], "-j DROP") {
		t.Errorf("the policy written before ADD is not in the firewall when ADD returns:\n%s", strings.Join(fw.Lines(), "\n"))
	}
}

func TestPolicyLoopFollowsDatastore(t *testing.T) {
	store := storetest.New(t)
	fw := &fake.Firewall{}
	p := newPolicyOwner("node1", startView(t, store), fw, quietLog())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.loop(time.Hour, newMetrics()).run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s; firewall:\n%s", what, strings.Join(fw.Lines(), "\n"))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("the first pass", func() bool { _, ok := fw.Rules("filter", "tabby-FORWARD"); return ok })
	mustCreate(t, store, testWEP("node1", "default", "a", "cali00000000aa", "10.244.0.5", nil))
	waitFor("the new endpoint's chain", func() bool { _, ok := fw.Rules("filter", "tabby-tw-cali00000000aa"); return ok })
	mustCreate(t, store, &api.NetworkPolicy{Metadata: api.ObjectMeta{Namespace: "default", Name: "deny"},
		Spec: api.NetworkPolicySpec{PolicyTypes: []api.PolicyType{api.PolicyTypeIngress}}})
	waitFor("default deny", func() bool {
		r, _ := fw.Rules("filter", "tabby-tw-cali00000000aa")
		return len(r) > 0 && strings.HasSuffix(r[len(r)-1], "-j DROP")
	})
	if err := store.Delete(context.Background(), api.KindWorkloadEndpoint, "default", "node1-k8s-a-eth0", ""); err != nil {
		t.Fatal(err)
	}
	waitFor("the endpoint's chains to go", func() bool { _, ok := fw.Rules("filter", "tabby-tw-cali00000000aa"); return !ok })
}

func TestOnlyStaleCleanup(t *testing.T) {
	stale := func(s string) error {
		return fmt.Errorf("%w: %s: %w", dataplane.ErrStaleCleanup, s, errors.New("busy"))
	}
	other := errors.New("restore failed")
	tests := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{other, false},
		{stale("set"), true},
		{errors.Join(stale("a"), stale("b")), true},
		{fmt.Errorf("applying: %w", errors.Join(stale("a"), fmt.Errorf("table nat: %w", stale("b")))), true},
		{fmt.Errorf("applying: %w", errors.Join(stale("a"), other)), false},
		{fmt.Errorf("table filter: %w", errors.Join(other)), false},
	}
	for i, tt := range tests {
		if got := onlyStaleCleanup(tt.err); got != tt.want {
			t.Errorf("%d: onlyStaleCleanup(%v) = %v, want %v", i, tt.err, got, tt.want)
		}
	}
}

// Another node's pod wakes the policy owner only when a set of the last
// pass may take it: without policies, never (TestPolicyOwnerWakesForWhatItsSetsTake
// has the cases with policies).
func TestPolicyOwnerIgnoresRemotePodsWithoutPolicies(t *testing.T) {
	store := storetest.New(t)
	p := newPolicyOwner("node1", startView(t, store), &fake.Firewall{}, quietLog())
	local := testWEP("node1", "default", "a", "cali00000000aa", "10.244.0.5", nil)
	remote := testWEP("node2", "default", "b", "cali00000000bb", "10.244.1.5", nil)
	up := func(w *api.WorkloadEndpoint) syncer.Update[api.WorkloadEndpoint] {
		return syncer.Update[api.WorkloadEndpoint]{New: w}
	}
	if p.affectsEndpoint(up(remote)) {
		t.Error("before the first pass, which reads every endpoint, another node's pod woke the policy owner")
	}
	if err := p.sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if !p.affectsEndpoint(up(local)) {
		t.Error("this node's pod did not wake the policy owner")
	}
	if p.affectsEndpoint(up(remote)) {
		t.Error("another node's pod woke the policy owner although no policy exists")
	}
}
