package agent

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/agent/attach"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/cni"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/policy"
)

// heldAssign holds the assignment that creates an endpoint after the
// endpoint was built (With called) and before its transaction; when decoy
// is valid, the endpoint is built with it first, as for a transaction
// tried again with another address.
type heldAssign struct {
	attach.Addresses
	decoy  netip.Addr
	chosen chan struct{}
	hold   chan struct{}
	once   sync.Once
}

func (h *heldAssign) Assign(ctx context.Context, req ipam.AssignRequest) (ipam.Assignment, error) {
	if with := req.With; with != nil {
		req.With = func(addr netip.Addr) ([]datastore.Cmp, []datastore.Op, error) {
			if h.decoy.IsValid() {
				if _, _, err := with(h.decoy); err != nil {
					return nil, nil, err
				}
			}
			cmps, ops, err := with(addr)
			h.once.Do(func() { close(h.chosen) })
			<-h.hold
			return cmps, ops, err
		}
	}
	return h.Addresses.Assign(ctx, req)
}

// addHeld starts an ADD of pod id whose endpoint-creating assignment is
// held (heldAssign, with decoy) and returns once the endpoint is built:
// the hold, the pod's host interface and where ADD's error comes.
func (e *handlerEnv) addHeld(ctx context.Context, id string, decoy netip.Addr) (*heldAssign, string, <-chan error) {
	held := &heldAssign{Addresses: e.h.ipam, decoy: decoy, chosen: make(chan struct{}), hold: make(chan struct{})}
	e.h.ipam = held
	req, conf, args := addReq(id)
	errc := make(chan error, 1)
	go func() { _, err := e.h.Add(ctx, req, conf, args); errc <- err }()
	<-held.chosen
	return held, newWorkloadID(req, args).hostIfName(), errc
}

// specOf returns the fake dataplane's spec of the host interface.
func (e *handlerEnv) specOf(hostIf string) (dataplane.WorkloadSpec, bool) {
	i := slices.IndexFunc(e.wl.Specs(), func(s dataplane.WorkloadSpec) bool { return s.HostIfName == hostIf })
	if i < 0 {
		return dataplane.WorkloadSpec{}, false
	}
	return e.wl.Specs()[i], true
}

// A new pair gets the address the assignment is committing while its
// transaction is in flight, and the policy owner compiles the endpoint
// meanwhile (primed); once the transaction commits with another address
// (tried again), the pair gets that one, and the primed endpoint goes.
func TestCNIAddCompletesAheadOfTheCommit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		decoy netip.Addr
	}{
		{"same address", netip.Addr{}},
		{"another address committed", netip.MustParseAddr("10.244.0.250")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			e := newHandlerEnv(t)
			pr := &recordingPrimer{}
			e.h.primer = pr
			held, hostIf, errc := e.addHeld(ctx, "ah1", tc.decoy)
			var ahead netip.Addr
			testkit.Eventually(t, 10*time.Second, "the pod's address configured before the commit", testkit.Cond(func() bool {
				s, ok := e.specOf(hostIf)
				if ok && len(s.Addrs) == 1 {
					ahead = s.Addrs[0].Addr()
				}
				return ahead.IsValid()
			}))
			if len(e.endpoints(t)) != 0 {
				t.Fatal("an endpoint was committed while the assignment was held")
			}
			if tc.decoy.IsValid() && ahead != tc.decoy {
				t.Fatalf("configured %v ahead of the commit, want the first address built, %v", ahead, tc.decoy)
			}
			close(held.hold)
			if err := <-errc; err != nil {
				t.Fatalf("ADD: %v", err)
			}
			eps := e.endpoints(t)
			if len(eps) != 1 || len(eps[0].Spec.IPNetworks) != 1 {
				t.Fatalf("endpoints after ADD: %v", eps)
			}
			want := netip.MustParsePrefix(eps[0].Spec.IPNetworks[0])
			s, _ := e.specOf(hostIf)
			if !slices.Equal(s.Addrs, []netip.Prefix{want}) {
				t.Errorf("pod's addresses %v, want the committed %v", s.Addrs, want)
			}
			primed, unprimed := pr.counts()
			if !pr.programmed {
				t.Error("no pass ahead of the commit")
			}
			if want := 1 + btoi(tc.decoy.IsValid()); primed != want || unprimed != 0 {
				t.Errorf("primed %d, unprimed %d; want %d and 0 (the committed endpoint replaces the primed one)", primed, unprimed, want)
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// recordingPrimer counts Prime and Unprime calls.
type recordingPrimer struct {
	mu               sync.Mutex
	primed, unprimed int
	programmed       bool
}

func (r *recordingPrimer) Prime(*api.WorkloadEndpoint) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.primed++
	return true
}

func (r *recordingPrimer) Unprime(*api.WorkloadEndpoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unprimed++
}

func (r *recordingPrimer) Program(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.programmed = true
	return nil
}

func (r *recordingPrimer) counts() (primed, unprimed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.primed, r.unprimed
}

// With the policy owner as the primer, the endpoint's chains are in the
// firewall while its creation is held, and the gate's pass after the
// commit finds nothing to change (one Apply for the ADD, not two).
func TestCNIAddPrimesPolicy(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t)
	fw := &fake.Firewall{}
	owner := newPolicyOwner("node1", e.view, fw, quietLog())
	e.h.policy, e.h.primer = attach.PolicyFunc(owner.syncFor), owner
	if err := owner.Program(ctx); err != nil { // the first pass: every endpoint
		t.Fatal(err)
	}
	// The node's first block, claimed as the agent does at start: an
	// address of a block the transaction itself claims is not primed.
	block, err := e.alloc.EnsureBlock(ctx, "node1")
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the node's block in the view", testkit.Cond(func() bool { return len(e.view.BlocksOf("node1")) == 1 }))
	held, hostIf, errc := e.addHeld(ctx, "pp1", netip.Addr{})
	testkit.Eventually(t, 10*time.Second, "the endpoint's chain programmed before its commit", testkit.Cond(func() bool {
		_, ok := fw.Rules("filter", "tabby-fw-"+hostIf)
		return ok
	}))
	applies := fw.Applies()
	close(held.hold)
	if err := <-errc; err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if n := fw.Applies(); n != applies {
		t.Errorf("%d Applies after the commit, want none (the primed endpoint compiled the same)", n-applies)
	}
	if _, ok := fw.Rules("filter", "tabby-fw-"+hostIf); !ok {
		t.Errorf("no chain for %s after ADD", hostIf)
	}
	if a := netip.MustParsePrefix(e.endpoints(t)[0].Spec.IPNetworks[0]).Addr(); !block.Contains(a) {
		t.Errorf("address %v outside the node's block %v", a, block)
	}

	// Not primed: an address outside the node's blocks (borrowed, or of a
	// block being claimed), an endpoint whose name the view holds.
	other := &api.WorkloadEndpoint{Metadata: api.ObjectMeta{Namespace: "ns1", Name: "elsewhere"},
		Spec: api.WorkloadEndpointSpec{Node: "node1", IPNetworks: []string{"10.244.0.200/32"}}}
	if block.Contains(netip.MustParseAddr("10.244.0.200")) {
		t.Fatalf("test address inside the node's block %v", block)
	}
	if owner.Prime(other) {
		t.Error("primed an address outside the node's blocks")
	}
	if owner.Prime(e.endpoints(t)[0]) {
		t.Error("primed an endpoint the view holds")
	}
}

// The endpoint log's primed endpoints: the view's creation replaces one
// (a change from it to the committed one), Unprime takes back one not
// replaced, and only that.
func TestEndpointLogPrime(t *testing.T) {
	wep := func(name, rv string) *api.WorkloadEndpoint {
		return &api.WorkloadEndpoint{Metadata: api.ObjectMeta{Namespace: "ns1", Name: name, ResourceVersion: rv}, Spec: api.WorkloadEndpointSpec{Node: "node1"}}
	}
	var l endpointLog
	l.node = "node1"
	p1, r1 := wep("a", ""), wep("a", "7")
	l.prime(p1)
	if !l.record(nil, r1) {
		t.Error("the creation of a primed endpoint woke nobody")
	}
	if l.unprime(p1) {
		t.Error("Unprime took back an endpoint its creation replaced")
	}
	changes, _ := l.take()
	want := []policy.EndpointChange{{New: p1}, {Old: p1, New: r1}}
	if !slices.Equal(changes, want) {
		t.Errorf("changes %+v, want %+v", changes, want)
	}

	p2, p3 := wep("b", ""), wep("b", "")
	l.prime(p2)
	l.prime(p3) // built again (a transaction tried again)
	if !l.unprime(p3) {
		t.Error("Unprime did not take back a primed endpoint")
	}
	changes, _ = l.take()
	want = []policy.EndpointChange{{New: p2}, {Old: p2, New: p3}, {Old: p3}}
	if !slices.Equal(changes, want) {
		t.Errorf("changes %+v, want %+v", changes, want)
	}
	l.record(nil, wep("b", "9"))
	if changes, _ = l.take(); len(changes) != 1 || changes[0].Old != nil {
		t.Errorf("a creation after Unprime: changes %+v, want one from nothing", changes)
	}
}

// The "workload added" record carries the time of each step in
// cni.AddSteps (tabby-lab bench cni reads them by name): every step of the
// plan but the two that are not timed on ADD's path (prior, a read inside
// the endpoint's write; advertise, detached).
func TestAddStepsLogged(t *testing.T) {
	p := &addPlan{h: &cniHandler{}, a: &attachment{req: &cni.Request{}}}
	var names []string
	for _, s := range p.steps() {
		if s.Name != "prior" && s.Name != "advertise" {
			names = append(names, s.Name)
		}
	}
	if d := cmp.Diff(slices.Sorted(slices.Values(cni.AddSteps)), slices.Sorted(slices.Values(names))); d != "" {
		t.Errorf("cni.AddSteps (-) and the ADD plan's steps (+) differ:\n%s", d)
	}
}
