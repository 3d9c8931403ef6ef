package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tabbynet/tabby/datastore/storetest"
)

func TestBlockMathBothFamilies(t *testing.T) {
	for _, tt := range []struct {
		pool      string
		blockBits int
		n         int
		want      string
		count     int
	}{
		{"10.244.0.0/16", 26, 0, "10.244.0.0/26", 1024},
		{"10.244.0.0/16", 26, 1023, "10.244.255.192/26", 1024},
		{"fd00:10:244::/48", 122, 0, "fd00:10:244::/122", maxBlocksScanned},
		{"fd00:10:244::/48", 122, 1, "fd00:10:244::40/122", maxBlocksScanned},
		// The 2^58-th block carries into the high half: 2^58 << 6 = 2^64.
		{"fd00:10:244::/48", 122, 1 << 58, "fd00:10:244:1::/122", maxBlocksScanned},
		{"fd00:10:244::/112", 122, 1023, "fd00:10:244::ffc0/122", 1024},
		{"fd00::/120", 124, 15, "fd00::f0/124", 16},
	} {
		pool := netip.MustParsePrefix(tt.pool)
		if got := nthBlock(pool, tt.blockBits, tt.n); got.String() != tt.want {
			t.Errorf("nthBlock(%s, %d, %d) = %s, want %s", pool, tt.blockBits, tt.n, got, tt.want)
		}
		if got := numBlocks(pool, tt.blockBits); got != tt.count {
			t.Errorf("numBlocks(%s, %d) = %d, want %d", pool, tt.blockBits, got, tt.count)
		}
	}
	b := netip.MustParsePrefix("fd00:10:244::ffc0/122")
	if blockSizeOf(b) != 64 {
		t.Errorf("blockSizeOf(%s) = %d", b, blockSizeOf(b))
	}
	for ord := range 64 {
		addr := addrAt(b, ord)
		if got, ok := ordinal(b, addr); !ok || got != ord {
			t.Fatalf("ordinal(addrAt(%d) = %s) = %d, %v", ord, addr, got, ok)
		}
	}
	if addrAt(b, 63).String() != "fd00:10:244::ffff" {
		t.Errorf("last address of %s = %s", b, addrAt(b, 63))
	}
	for _, out := range []string{"fd00:10:244::1:0", "10.244.0.1", "::ffff:10.244.0.1"} {
		if _, ok := ordinal(b, netip.MustParseAddr(out)); ok {
			t.Errorf("ordinal(%s, %s) found an ordinal", b, out)
		}
	}
	for _, bad := range []string{"fd00::/64", "fd00::/115", "10.0.0.0/19", "::ffff:10.0.0.0/120"} {
		if validBlockPrefix(netip.MustParsePrefix(bad)) {
			t.Errorf("validBlockPrefix(%s) = true", bad)
		}
	}
}

// A dual-stack pod: one handle, one address of each family, each from its
// own family's pool and affine block; repeats return the same addresses;
// releasing the handle frees both; check stays clean.
func TestAssignDualStackUnderOneHandle(t *testing.T) {
	a, _ := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "v4", "10.244.0.0/24", 28)
	mustCreatePool(t, a, "v6", "fd00:10:244::/64", 0)

	v4, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "pod1"})
	if err != nil {
		t.Fatal(err)
	}
	v6, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "pod1", Family: 6})
	if err != nil {
		t.Fatal(err)
	}
	if !v4.Addr.Is4() || v4.Pool != "v4" || !v6.Addr.Is6() || v6.Pool != "v6" || v6.Block.Bits() != 122 || !v6.NewBlock || v6.Borrowed {
		t.Fatalf("assignments %+v and %+v: want one IPv4 address from v4 and one IPv6 from a new /122 of v6", v4, v6)
	}
	for fam, want := range map[int]netip.Addr{4: v4.Addr, 6: v6.Addr} {
		again, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "pod1", Family: fam})
		if err != nil || !again.Existing || again.Addr != want {
			t.Errorf("repeat for IPv%d = %+v, %v; want existing %s", fam, again, err, want)
		}
	}
	addrs, err := a.AddressesByHandle(ctx, "pod1")
	if err != nil || len(addrs) != 2 {
		t.Fatalf("AddressesByHandle = %v, %v; want both", addrs, err)
	}
	// A second pod gets the next IPv6 address of the same block (the fast
	// path through the cache).
	v6b, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "pod2", Family: 6})
	if err != nil || v6b.Block != v6.Block || v6b.Addr == v6.Addr {
		t.Fatalf("second IPv6 assign = %+v, %v; want another address of %s", v6b, err, v6.Block)
	}
	if al, ok, err := a.Lookup(ctx, v6.Addr); err != nil || !ok || al.Handle != "pod1" {
		t.Errorf("Lookup(%s) = %+v, %v, %v", v6.Addr, al, ok, err)
	}
	if r := mustCheckClean(t, a); r.Allocated != 3 || r.Blocks != 2 {
		t.Errorf("check counts %d addresses in %d blocks, want 3 in 2", r.Allocated, r.Blocks)
	}
	use, err := a.Usage(ctx)
	if err != nil || len(use) != 2 || use[1].Name != "v6" || use[1].Total != maxBlocksScanned || use[1].SizeBits != 64 || use[1].InUse != 2 || use[0].Total != 256 {
		t.Errorf("Usage() = %+v, %v; want v4 (256 addresses) and v6 (capped at 2^62, 2 in use)", use, err)
	}
	if err := a.ReleaseHandle(ctx, "pod1"); err != nil {
		t.Fatal(err)
	}
	got := allocated(t, a)
	if _, held := got[v4.Addr]; held || len(got) != 1 {
		t.Errorf("after releasing pod1: allocated %v, want only pod2's", got)
	}
	// Releasing one address of a dual-stack handle keeps the other.
	if _, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "pod2"}); err != nil {
		t.Fatal(err)
	}
	if err := a.ReleaseAddr(ctx, v6b.Addr); err != nil {
		t.Fatal(err)
	}
	if addrs, err := a.AddressesByHandle(ctx, "pod2"); err != nil || len(addrs) != 1 || !addrs[0].Is4() {
		t.Errorf("pod2 after releasing its IPv6 address holds %v, %v; want its IPv4 address", addrs, err)
	}
	mustCheckClean(t, a)
}

func TestAssignIPv6Errors(t *testing.T) {
	a, _ := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "v4", "10.244.0.0/24", 28)
	_, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "h", Family: 6})
	if !errors.Is(err, ErrNoPool) || !strings.Contains(err.Error(), "no IPv6 pools exist") {
		t.Errorf("IPv6 assign without an IPv6 pool: %v", err)
	}
	mustCreatePool(t, a, "v6", "fd00:10:244::/120", 124)
	_, err = a.Assign(ctx, AssignRequest{Node: "n1", Handle: "h", Family: 6, Pools: []string{"v4"}})
	if !errors.Is(err, ErrNoPool) || !strings.Contains(err.Error(), `"v4" is an IPv4 pool, asked for an IPv6 address`) {
		t.Errorf("IPv6 assign from an IPv4 pool: %v", err)
	}
	_, err = a.Assign(ctx, AssignRequest{Node: "n1", Handle: "h", Family: 4, Addr: netip.MustParseAddr("fd00:10:244::5")})
	if err == nil || !strings.Contains(err.Error(), "is not an IPv4 address") {
		t.Errorf("family 4 with an IPv6 address: %v", err)
	}
	_, err = a.Assign(ctx, AssignRequest{Node: "n1", Handle: "h", Family: 5})
	if err == nil {
		t.Error("family 5 accepted")
	}
	// A specific IPv6 address, by pool CIDR.
	res, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "h", Addr: netip.MustParseAddr("fd00:10:244::15"), Pools: []string{"fd00:10:244::/120"}})
	if err != nil || res.Block.String() != "fd00:10:244::10/124" {
		t.Fatalf("specific IPv6 address: %+v, %v", res, err)
	}
	// The /120 pool holds 16 /124 blocks of 16: 256 addresses, then
	// exhaustion (one is taken already).
	for i := range 255 {
		if _, err := a.Assign(ctx, AssignRequest{Node: fmt.Sprintf("n%d", i%3), Handle: fmt.Sprintf("x%d", i), Family: 6}); err != nil {
			t.Fatalf("assign %d: %v", i, err)
		}
	}
	if _, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "one-too-many", Family: 6}); !errors.Is(err, ErrExhausted) {
		t.Errorf("assign in a full IPv6 pool: %v, want ErrExhausted", err)
	}
	if got := len(allocated(t, a)); got != 256 {
		t.Errorf("%d addresses allocated, want 256", got)
	}
	mustCheckClean(t, a)
}

// Nodes assigning IPv6 addresses at once from a large pool get distinct
// addresses and blocks of their own.
func TestAssignIPv6Concurrent(t *testing.T) {
	a, _ := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "v6", "fd00:10:244::/48", 0)
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for n := range 4 {
		for i := range 10 {
			wg.Go(func() {
				_, err := a.Assign(ctx, AssignRequest{Node: fmt.Sprintf("n%d", n), Handle: fmt.Sprintf("h%d-%d", n, i), Family: 6})
				errs <- err
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := len(allocated(t, a)); got != 40 {
		t.Fatalf("%d addresses allocated, want 40", got)
	}
	blocks, err := a.Blocks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	owners := map[string]int{}
	for _, b := range blocks {
		owners[b.Affinity]++
	}
	if len(blocks) != 4 || len(owners) != 4 {
		t.Errorf("blocks %+v: want one /122 per node", blocks)
	}
	mustCheckClean(t, a)
}

// A dual-stack pod's second assign (the other family, same handle) takes
// the fast path: one transaction, like a single-stack assign, once the
// node's blocks are cached.
func TestDualStackAssignRoundTrips(t *testing.T) {
	cs := &countingStore{Store: storetest.New(t)}
	a := newAllocator(cs)
	ctx := testCtx(t)
	mustCreatePool(t, a, "v4", "10.244.0.0/24", 28)
	mustCreatePool(t, a, "v6", "fd00:10:244::/64", 0)
	for _, fam := range []int{4, 6} { // warm the cache with each family's block
		if _, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: fmt.Sprintf("warm%d", fam), Family: fam}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		h := fmt.Sprintf("pod%d", i)
		cs.n.Store(0)
		if _, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: h, Family: 4}); err != nil {
			t.Fatal(err)
		}
		v6, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: h, Family: 6})
		if err != nil {
			t.Fatal(err)
		}
		if n := cs.n.Load(); n != 2 {
			t.Errorf("pod %d: %d etcd round trips for both families, want 2", i, n)
		}
		if addrs, err := a.AddressesByHandle(ctx, h); err != nil || len(addrs) != 2 || !slices.Contains(addrs, v6.Addr) {
			t.Errorf("handle %s holds %v, %v", h, addrs, err)
		}
	}
	mustCheckClean(t, a)
}

// EnsureFreeBlock claims a block only when every affine block of the node
// is full, in the family asked for, and costs no etcd request while one
// has room (the node's blocks cached).
func TestEnsureFreeBlock(t *testing.T) {
	cs := &countingStore{Store: storetest.New(t)}
	a := newAllocator(cs)
	ctx := testCtx(t)
	mustCreatePool(t, a, "v4", "10.244.0.0/26", 30)
	mustCreatePool(t, a, "v6", "fd00:10:244::/120", 124)
	first, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "h0"})
	if err != nil {
		t.Fatal(err)
	}
	cs.n.Store(0)
	if blk, err := a.EnsureFreeBlock(ctx, "n1", 4); err != nil || blk.IsValid() || cs.n.Load() != 0 {
		t.Fatalf("with room left: claimed %v, %v, %d etcd requests; want nothing, none", blk, err, cs.n.Load())
	}
	for i := 1; i < 4; i++ { // fill the /30
		if _, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: fmt.Sprintf("h%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	blk, err := a.EnsureFreeBlock(ctx, "n1", 4)
	if err != nil || !blk.IsValid() || blk == first.Block || !blk.Addr().Is4() {
		t.Fatalf("full block: claimed %v, %v; want a second IPv4 block", blk, err)
	}
	next, err := a.Assign(ctx, AssignRequest{Node: "n1", Handle: "h4"})
	if err != nil || next.Block != blk || next.NewBlock {
		t.Errorf("the next pod: %+v, %v; want an address of the spare block %s, not a new block", next, err, blk)
	}
	// IPv6: the node has no IPv6 block yet, so one is claimed.
	if blk6, err := a.EnsureFreeBlock(ctx, "n1", 6); err != nil || !blk6.Addr().Is6() || blk6.Bits() != 124 {
		t.Errorf("IPv6: claimed %v, %v; want a /124", blk6, err)
	}
	mustCheckClean(t, a)
}
