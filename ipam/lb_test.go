package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

func lbUse(p *api.IPPool) { p.Spec.AllowedUses = []api.IPPoolUse{api.UseLoadBalancer} }

func svc(name string) LBService { return LBService{Namespace: "default", Name: name} }

func lbAddrs(allocs []LBAllocation) []string {
	var out []string
	for _, a := range allocs {
		out = append(out, a.Addr.String())
	}
	return out
}

func mustAssignLB(t *testing.T, a *Allocator, req LBRequest) []string {
	t.Helper()
	got, err := a.AssignLB(testCtx(t), req)
	if err != nil {
		t.Fatalf("AssignLB %s: %v", req.Service, err)
	}
	return lbAddrs(got)
}

// Pods never get an address of a LoadBalancer pool, even when it is the
// only pool, or the one they ask for; a pool for tunnels only is not for
// pods either.
func TestPodsNeverUseLoadBalancerPools(t *testing.T) {
	a, _ := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "lb", "198.19.0.0/24", 0, lbUse)
	_, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "h1"})
	if !errors.Is(err, ErrNoPool) || !strings.Contains(err.Error(), "lb is a LoadBalancer pool") {
		t.Fatalf("assign with only a LoadBalancer pool: %v, want ErrNoPool naming why", err)
	}
	if _, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "h2", Addr: netip.MustParseAddr("198.19.0.5")}); !errors.Is(err, ErrNotInPool) {
		t.Errorf("pod asking for a LoadBalancer address: %v, want ErrNotInPool", err)
	}
	if b, err := a.EnsureBlock(ctx, "n1"); err != nil || b.IsValid() {
		t.Errorf("EnsureBlock with only a LoadBalancer pool = %v, %v; want no block", b, err)
	}
	mustCreatePool(t, a, "tunnels", "10.245.0.0/24", 26, func(p *api.IPPool) { p.Spec.AllowedUses = []api.IPPoolUse{api.UseTunnel} })
	mustCreatePool(t, a, "pods", "10.244.0.0/24", 26)
	for i := range 10 {
		got := mustAssign(t, a, "n1", fmt.Sprintf("p%d", i))
		if !netip.MustParsePrefix("10.244.0.0/24").Contains(got.Addr) {
			t.Fatalf("pod got %s, outside the Workload pool", got.Addr)
		}
	}
	_, err = a.Assign(ctx, AssignRequest{Node: "n1", Handle: "x", Pools: []string{"lb"}})
	if !errors.Is(err, ErrNoPool) {
		t.Errorf("pod requesting the LoadBalancer pool: %v, want ErrNoPool", err)
	}
	blocks, err := a.Blocks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks {
		if b.Pool != "pods" {
			t.Errorf("block %s in pool %s: only the Workload pool may have blocks", b.CIDR, b.Pool)
		}
	}
}

// LoadBalancer pools overlap nothing: no other LoadBalancer pool, no pod
// pool, in either order of creation.
func TestLoadBalancerPoolOverlap(t *testing.T) {
	a, _ := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "pods", "10.244.0.0/16", 26)
	mustCreatePool(t, a, "lb", "198.19.0.0/24", 0, lbUse)
	for _, tt := range []struct {
		name, cidr string
		lb         bool
		want       string
	}{
		{"lb2", "198.19.0.128/25", true, "spec.cidr: LoadBalancer pool lb2 (198.19.0.128/25) overlaps LoadBalancer pool lb (198.19.0.0/24)"},
		{"lb-in-pods", "10.244.7.0/24", true, "spec.cidr: LoadBalancer pool lb-in-pods (10.244.7.0/24) overlaps pool pods (10.244.0.0/16)"},
		{"pods-over-lb", "198.19.0.0/16", false, "spec.cidr: pool pods-over-lb (198.19.0.0/16) overlaps LoadBalancer pool lb (198.19.0.0/24)"},
	} {
		p := &api.IPPool{Metadata: api.ObjectMeta{Name: tt.name}, Spec: api.IPPoolSpec{CIDR: tt.cidr}}
		if tt.lb {
			lbUse(p)
		}
		_, err := a.CreatePool(ctx, p)
		if !errors.Is(err, ErrPoolOverlap) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v\nwant ErrPoolOverlap with %q", tt.name, err, tt.want)
		}
	}
}

func TestAssignLB(t *testing.T) {
	a, _ := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "lb-a", "198.19.0.0/30", 0, lbUse)
	mustCreatePool(t, a, "lb-b", "198.19.1.0/31", 0, lbUse)
	mustCreatePool(t, a, "lb6", "fd00:198:19::/126", 0, lbUse)
	mustCreatePool(t, a, "pods", "10.244.0.0/24", 26)
	v4 := []int{4}

	if got := mustAssignLB(t, a, LBRequest{Service: svc("s1"), Families: v4}); fmt.Sprint(got) != "[198.19.0.0]" {
		t.Errorf("first Service got %v, want the first address of the first pool", got)
	}
	// Idempotent.
	if got := mustAssignLB(t, a, LBRequest{Service: svc("s1"), Families: v4}); fmt.Sprint(got) != "[198.19.0.0]" {
		t.Errorf("again: %v", got)
	}
	// Specific address, and taken by another.
	if got := mustAssignLB(t, a, LBRequest{Service: svc("s2"), Families: v4, Addrs: []netip.Addr{netip.MustParseAddr("198.19.1.1")}}); fmt.Sprint(got) != "[198.19.1.1]" {
		t.Errorf("specific: %v", got)
	}
	_, err := a.AssignLB(ctx, LBRequest{Service: svc("s3"), Families: v4, Addrs: []netip.Addr{netip.MustParseAddr("198.19.1.1")}})
	var taken *LBTakenError
	if !errors.As(err, &taken) || taken.Holder != svc("s2") || !errors.Is(err, ErrInUse) {
		t.Errorf("address of another Service: %v, want *LBTakenError naming default/s2", err)
	}
	// Outside every pool; in a pod pool; of the wrong family.
	for addr, want := range map[string]string{
		"203.0.113.9":    "outside every LoadBalancer pool",
		"10.244.0.9":     "is in pool pods, which is not a LoadBalancer pool",
		"fd00:198:19::1": "is IPv6, but the Service asks for IPv4",
	} {
		_, err := a.AssignLB(ctx, LBRequest{Service: svc("s3"), Families: v4, Addrs: []netip.Addr{netip.MustParseAddr(addr)}})
		if !errors.Is(err, ErrNotInPool) || !strings.Contains(err.Error(), want) {
			t.Errorf("asking for %s: %v, want ErrNotInPool with %q", addr, err, want)
		}
	}
	// A requested pool.
	if got := mustAssignLB(t, a, LBRequest{Service: svc("s3"), Families: v4, Pools: map[int][]string{4: {"lb-b"}}}); fmt.Sprint(got) != "[198.19.1.0]" {
		t.Errorf("pool lb-b: %v", got)
	}
	if _, err := a.AssignLB(ctx, LBRequest{Service: svc("s4"), Families: v4, Pools: map[int][]string{4: {"pods"}}}); !errors.Is(err, ErrNoPool) || !strings.Contains(err.Error(), "not a LoadBalancer pool") {
		t.Errorf("requesting a pod pool: %v", err)
	}
	// lb-b exhausted now.
	_, err = a.AssignLB(ctx, LBRequest{Service: svc("s4"), Families: v4, Pools: map[int][]string{4: {"lb-b"}}})
	var ex *LBExhaustedError
	if !errors.As(err, &ex) || !errors.Is(err, ErrExhausted) || ex.InUse != 2 || !strings.Contains(err.Error(), "[lb-b] have no free IPv4 address") {
		t.Errorf("exhausted pool: %v", err)
	}
	// Moving to another pool releases the old address in the same step.
	if got := mustAssignLB(t, a, LBRequest{Service: svc("s3"), Families: v4, Pools: map[int][]string{4: {"lb-a"}}}); fmt.Sprint(got) != "[198.19.0.1]" {
		t.Errorf("s3 moved to lb-a: %v", got)
	}
	// Dual stack.
	if got := mustAssignLB(t, a, LBRequest{Service: svc("s5"), Families: []int{6, 4}}); fmt.Sprint(got) != "[fd00:198:19:: 198.19.0.2]" {
		t.Errorf("dual-stack: %v", got)
	}
	all, err := a.LBAllocations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := "[198.19.0.0 default/s1 lb-a] [198.19.0.1 default/s3 lb-a] [198.19.0.2 default/s5 lb-a] [198.19.1.1 default/s2 lb-b] [fd00:198:19:: default/s5 lb6]"
	var got []string
	for _, x := range all {
		got = append(got, fmt.Sprintf("[%s %s %s]", x.Addr, x.Service, x.Pool))
	}
	if strings.Join(got, " ") != want {
		t.Errorf("allocations\n%s\nwant\n%s", strings.Join(got, " "), want)
	}
	// The pool cannot be deleted while Services hold its addresses.
	var inUse *PoolInUseError
	if err := a.DeletePool(ctx, "lb-b"); !errors.As(err, &inUse) || inUse.Allocated != 1 {
		t.Errorf("deleting a LoadBalancer pool in use: %v", err)
	}
	if err := a.ReleaseLB(ctx, svc("s2")); err != nil {
		t.Fatal(err)
	}
	if err := a.ReleaseLB(ctx, svc("s2")); err != nil {
		t.Errorf("release again: %v", err)
	}
	if err := a.DeletePool(ctx, "lb-b"); err != nil {
		t.Errorf("deleting the emptied pool: %v", err)
	}
	// A Service's preferred (shown) address is taken when free.
	if got := mustAssignLB(t, a, LBRequest{Service: svc("s6"), Families: v4, Prefer: []netip.Addr{netip.MustParseAddr("198.19.0.3"), netip.MustParseAddr("198.19.0.0")}}); fmt.Sprint(got) != "[198.19.0.3]" {
		t.Errorf("preferred address: %v", got)
	}
	svcs, err := a.LBServices(ctx)
	if err != nil || len(svcs) != 4 {
		t.Errorf("LBServices = %v, %v; want s1 s3 s5 s6", svcs, err)
	}
}

// Many writers at once for one small pool: each address goes to exactly
// one Service, each Service gets at most one, the rest see exhaustion.
func TestAssignLBConcurrent(t *testing.T) {
	a, s := newTestAllocator(t)
	b := New(s) // a second process
	mustCreatePool(t, a, "lb", "198.19.0.0/28", 0, lbUse)
	const services = 24
	var wg sync.WaitGroup
	results := make([][]LBAllocation, services*2)
	errs := make([]error, services*2)
	for i := range services * 2 {
		al := a
		if i%2 == 1 {
			al = b
		}
		wg.Go(func() {
			results[i], errs[i] = al.AssignLB(testCtx(t), LBRequest{Service: svc(fmt.Sprintf("s%d", i/2)), Families: []int{4}})
		})
	}
	wg.Wait()
	bySvc := map[string]string{}
	exhausted := 0
	for i := range results {
		if errs[i] != nil {
			if !errors.Is(errs[i], ErrExhausted) {
				t.Errorf("writer %d: %v", i, errs[i])
			}
			exhausted++
			continue
		}
		name := fmt.Sprintf("s%d", i/2)
		addr := results[i][0].Addr.String()
		if prev, ok := bySvc[name]; ok && prev != addr {
			t.Errorf("%s got %s and %s", name, prev, addr)
		}
		bySvc[name] = addr
	}
	all, err := a.LBAllocations(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 16 || len(bySvc) != 16 {
		t.Errorf("%d addresses recorded for %d Services, want 16 and 16", len(all), len(bySvc))
	}
	for _, x := range all {
		if bySvc[x.Service.Name] != x.Addr.String() {
			t.Errorf("record %s → %s, but the Service was told %s", x.Addr, x.Service, bySvc[x.Service.Name])
		}
	}
	if exhausted < 16 {
		t.Errorf("%d writers saw exhaustion, want at least the 16 for the 8 Services left out", exhausted)
	}
}

// Check finds what would let a LoadBalancer address be given twice or a
// pod use a LoadBalancer pool; a healthy state is clean.
func TestCheckLoadBalancer(t *testing.T) {
	a, s := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "lb", "198.19.0.0/28", 0, lbUse)
	mustCreatePool(t, a, "pods", "10.244.0.0/24", 26)
	mustAssignLB(t, a, LBRequest{Service: svc("web"), Families: []int{4}})
	mustAssignLB(t, a, LBRequest{Service: svc("api"), Families: []int{4}})
	mustAssign(t, a, "n1", "pod-1")
	mustCheckClean(t, a)

	// An address record nobody's Service record lists, one in a pod pool,
	// and a pod pool turned into a LoadBalancer pool behind IPAM's back.
	for addr, rec := range map[string]string{
		"198.19.0.9":  `{"namespace":"default","name":"ghost","pool":"lb"}`,
		"10.244.0.77": `{"namespace":"default","name":"web","pool":"pods"}`,
		"203.0.113.5": `{"namespace":"default","name":"api","pool":"gone"}`,
	} {
		if _, err := s.PutKV(ctx, lbAddrsPrefix+addr, []byte(rec), 0); err != nil {
			t.Fatal(err)
		}
	}
	pods, err := datastore.GetAs[*api.IPPool](ctx, s, api.KindIPPool, "", "pods")
	if err != nil {
		t.Fatal(err)
	}
	pods.Spec.AllowedUses = []api.IPPoolUse{api.UseLoadBalancer}
	pods.Spec.NATOutgoing = false
	if _, err := s.Update(ctx, pods); err != nil {
		t.Fatal(err)
	}
	r, err := a.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, in := range r.Inconsistencies {
		got = append(got, in.Kind+" "+in.Key)
	}
	want := []string{
		"block-in-loadbalancer-pool 10.244.0.0-26",
		"lb-address-outside-pools ipam/lb/addresses/203.0.113.5",
		"lb-record-mismatch ipam/lb/addresses/10.244.0.77",
		"lb-record-mismatch ipam/lb/addresses/198.19.0.9",
		"lb-record-mismatch ipam/lb/addresses/203.0.113.5",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("inconsistencies:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A tunnel address comes only from a pool whose allowedUses has Tunnel:
// a pool for tunnels only serves it, one for pods only refuses it, and a
// LoadBalancer pool never does.
func TestTunnelAddressesFollowAllowedUses(t *testing.T) {
	a, _ := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "pods-only", "10.244.0.0/24", 26, func(p *api.IPPool) { p.Spec.AllowedUses = []api.IPPoolUse{api.UseWorkload} })
	mustCreatePool(t, a, "lb", "198.19.0.0/24", 0, lbUse)
	for _, pool := range []string{"pods-only", "lb"} {
		_, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: TunnelHandle("n1"), Pools: []string{pool}, Use: api.UseTunnel})
		if !errors.Is(err, ErrNoPool) {
			t.Errorf("tunnel address from %s: %v, want ErrNoPool", pool, err)
		}
	}
	mustCreatePool(t, a, "tunnels", "10.245.0.0/24", 26, func(p *api.IPPool) { p.Spec.AllowedUses = []api.IPPoolUse{api.UseTunnel} })
	got, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: TunnelHandle("n1"), Use: api.UseTunnel})
	if err != nil || !netip.MustParsePrefix("10.245.0.0/24").Contains(got.Addr) {
		t.Fatalf("tunnel address = %v, %v; want one of the Tunnel pool", got.Addr, err)
	}
	if got := mustAssign(t, a, "n1", "pod"); !netip.MustParsePrefix("10.244.0.0/24").Contains(got.Addr) {
		t.Errorf("pod got %s, want the Workload pool's", got.Addr)
	}
}
