package ipam

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

func blockExists(t *testing.T, a *Allocator, cidr netip.Prefix) bool {
	t.Helper()
	_, err := a.store.GetKV(testCtx(t), blockKey(cidr))
	if errors.Is(err, datastore.ErrNotFound) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

func TestReleaseHandleAndAddr(t *testing.T) {
	a, _ := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "default-pool", "10.244.0.0/24", 30)
	r1 := mustAssign(t, a, "n1", "h1")
	r2 := mustAssign(t, a, "n1", "h2")
	if err := a.ReleaseHandle(ctx, "h1"); err != nil {
		t.Fatal(err)
	}
	if err := a.ReleaseHandle(ctx, "h1"); err != nil {
		t.Errorf("releasing a released handle: %v", err)
	}
	if err := a.ReleaseHandle(ctx, "never-existed"); err != nil {
		t.Errorf("releasing an unknown handle: %v", err)
	}
	if addrs, _ := a.AddressesByHandle(ctx, "h1"); len(addrs) != 0 {
		t.Errorf("h1 still holds %v", addrs)
	}
	if err := a.ReleaseAddr(ctx, r2.Addr); err != nil {
		t.Fatal(err)
	}
	if err := a.ReleaseAddr(ctx, r2.Addr); err != nil {
		t.Errorf("releasing a free address: %v", err)
	}
	if err := a.ReleaseAddr(ctx, netip.MustParseAddr("10.9.9.9")); err != nil {
		t.Errorf("releasing an address outside every pool: %v", err)
	}
	if h, _ := a.getHandle(ctx, "h2"); h != nil {
		t.Errorf("h2's record survived ReleaseAddr: %+v", h)
	}
	// The affine block is empty but stays, ready for the node's next pod.
	if !blockExists(t, a, r1.Block) {
		t.Errorf("empty affine block %s was deleted", r1.Block)
	}
	if got := allocated(t, a); len(got) != 0 {
		t.Errorf("still allocated: %v", got)
	}
	n, err := a.ReleaseEmptyBlocks(ctx, "n1")
	if err != nil || n != 1 {
		t.Fatalf("ReleaseEmptyBlocks = %d, %v; want 1", n, err)
	}
	if blockExists(t, a, r1.Block) {
		t.Errorf("block %s survived ReleaseEmptyBlocks", r1.Block)
	}
	mustCheckClean(t, a)
}

func TestReleaseLastBorrowedDeletesUnownedBlock(t *testing.T) {
	a, _ := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "tiny", "10.244.0.0/30", 30)
	// n1 claims the only block, n2 borrows from it, then n1 leaves.
	mustAssign(t, a, "n1", "h1")
	r2 := mustAssign(t, a, "n2", "h2")
	if !r2.Borrowed {
		t.Fatalf("n2 did not borrow: %+v", r2)
	}
	if err := a.ReleaseNode(ctx, "n1", true); err != nil {
		t.Fatal(err)
	}
	blocks, err := a.Blocks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 1 || blocks[0].Affinity != "" {
		t.Fatalf("after releasing n1: blocks %+v, want one block without affinity", blocks)
	}
	// n2's address is now borrowed from an unowned block.
	if b, _ := a.Borrowed(ctx); len(b) != 1 || b[0].Node != "n2" || b[0].BlockNode != "" {
		t.Errorf("Borrowed() = %+v", b)
	}
	if err := a.ReleaseHandle(ctx, "h2"); err != nil {
		t.Fatal(err)
	}
	if blockExists(t, a, r2.Block) {
		t.Errorf("empty unowned block %s survived its last release", r2.Block)
	}
	mustCheckClean(t, a)
}

func TestReleaseNode(t *testing.T) {
	a, _ := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "default-pool", "10.244.0.0/24", 30)
	var n1 []Assignment
	for _, h := range []string{"a1", "a2", "a3", "a4", "a5"} {
		n1 = append(n1, mustAssign(t, a, "n1", h))
	}
	// Empty the second block.
	if err := a.ReleaseHandle(ctx, "a5"); err != nil {
		t.Fatal(err)
	}
	mustAssign(t, a, "n2", "b1")
	if err := a.ReleaseNode(ctx, "n1", false); err != nil {
		t.Fatal(err)
	}
	if blockExists(t, a, n1[4].Block) {
		t.Errorf("n1's empty block %s survived ReleaseNode", n1[4].Block)
	}
	affs, err := a.listAffinities(ctx, affinityNodePrefix("n1"))
	if err != nil || len(affs) != 0 {
		t.Errorf("n1's affinities after ReleaseNode: %+v, %v", affs, err)
	}
	blocks, _ := a.Blocks(ctx)
	for _, b := range blocks {
		if b.CIDR == n1[0].Block && b.Affinity != "" {
			t.Errorf("n1's used block kept affinity %q", b.Affinity)
		}
	}
	if got := allocated(t, a); len(got) != 5 {
		t.Errorf("ReleaseNode without releaseAddrs freed addresses: %d left, want 5", len(got))
	}
	mustCheckClean(t, a)
	// Idempotent, and with releaseAddrs the addresses go too; the now empty
	// unowned block is deleted.
	if err := a.ReleaseNode(ctx, "n1", true); err != nil {
		t.Fatal(err)
	}
	if got := allocated(t, a); len(got) != 1 {
		t.Errorf("after releasing n1's addresses: %v, want only n2's", got)
	}
	if blockExists(t, a, n1[0].Block) {
		t.Errorf("n1's emptied unowned block %s survived", n1[0].Block)
	}
	for _, h := range []string{"a1", "a2", "a3", "a4"} {
		if rec, _ := a.getHandle(ctx, h); rec != nil {
			t.Errorf("handle %s survived", h)
		}
	}
	mustCheckClean(t, a)
	// The node comes back and gets addresses again.
	mustAssign(t, a, "n1", "again")
}

func TestGCNodes(t *testing.T) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	a, _ := newTestAllocator(t, WithClock(clock))
	ctx := testCtx(t)
	mustCreatePool(t, a, "default-pool", "10.244.0.0/24", 30)
	mustAssign(t, a, "live", "l1")
	mustAssign(t, a, "gone", "g1")
	now = now.Add(time.Minute)
	mustAssign(t, a, "young", "y1")
	released, err := a.GCNodes(ctx, []string{"live"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(released) != 1 || released[0] != "gone" {
		t.Errorf("GCNodes released %v, want [gone]", released)
	}
	got := allocated(t, a)
	if len(got) != 2 {
		t.Errorf("left allocated: %v, want live's and young's", got)
	}
	mustCheckClean(t, a)
}

func TestPoolLifecycle(t *testing.T) {
	a, s := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "default-pool", "10.244.0.0/16", 26)
	_, err := a.CreatePool(ctx, &api.IPPool{Metadata: api.ObjectMeta{Name: "other"}, Spec: api.IPPoolSpec{CIDR: "10.244.128.0/20"}})
	if !errors.Is(err, ErrPoolOverlap) || !strings.Contains(err.Error(), "default-pool") {
		t.Fatalf("overlapping pool: %v, want ErrPoolOverlap naming default-pool", err)
	}
	if _, err := s.Get(ctx, api.KindIPPool, "", "other"); !errors.Is(err, datastore.ErrNotFound) {
		t.Errorf("rejected pool was stored: %v", err)
	}
	if _, err := a.CreatePool(ctx, &api.IPPool{Metadata: api.ObjectMeta{Name: "v6"}, Spec: api.IPPoolSpec{CIDR: "fd00::/64"}}); err != nil {
		t.Errorf("an IPv6 pool next to an IPv4 one: %v", err)
	}
	if _, err := a.CreatePool(ctx, &api.IPPool{Metadata: api.ObjectMeta{Name: "v6b"}, Spec: api.IPPoolSpec{CIDR: "fd00::/56"}}); !errors.Is(err, ErrPoolOverlap) {
		t.Errorf("overlapping IPv6 pool: %v, want ErrPoolOverlap", err)
	}
	for _, h := range []string{"h1", "h2", "h3"} {
		mustAssign(t, a, "n1", h)
	}
	err = a.DeletePool(ctx, "default-pool")
	if !errors.Is(err, ErrInUse) || err.Error() != "pool default-pool is in use: 3 addresses allocated" {
		t.Fatalf("DeletePool in use: %v", err)
	}
	obj, err := s.Get(ctx, api.KindIPPool, "", "default-pool")
	if err != nil || obj.(*api.IPPool).Spec.Disabled {
		t.Fatalf("refused DeletePool changed the pool: %+v, %v", obj, err)
	}
	for _, h := range []string{"h1", "h2", "h3"} {
		if err := a.ReleaseHandle(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.DeletePool(ctx, "default-pool"); err != nil {
		t.Fatal(err)
	}
	if kvs, _, _ := s.ListKV(ctx, "ipam/"); len(kvs) != 0 {
		t.Errorf("ipam records left after DeletePool: %d", len(kvs))
	}
	if err := a.DeletePool(ctx, "default-pool"); !errors.Is(err, datastore.ErrNotFound) {
		t.Errorf("deleting a deleted pool: %v", err)
	}
	// The range is free for a new pool.
	mustCreatePool(t, a, "other", "10.244.128.0/20", 26)
}

// ReleaseAddrHeldBy frees an address only while the named handle holds it,
// also when another handle got it between the caller's look and the
// release (a second allocator, like another agent, races it).
func TestReleaseAddrHeldBy(t *testing.T) {
	a, store := newTestAllocator(t)
	ctx := testCtx(t)
	mustCreatePool(t, a, "default-pool", "10.244.0.0/24", 30)
	r1 := mustAssign(t, a, "n1", "h1")
	var held *HeldByError
	if err := a.ReleaseAddrHeldBy(ctx, r1.Addr, "h-other"); !errors.As(err, &held) || held.Handle != "h1" {
		t.Fatalf("release by the wrong handle: %v", err)
	}
	if addrs, _ := a.AddressesByHandle(ctx, "h1"); len(addrs) != 1 {
		t.Fatalf("h1 lost its address to a release by another handle")
	}
	// The caller looked while h1 held the address; h1 goes, h2 gets it.
	other := New(store)
	if err := other.ReleaseHandle(ctx, "h1"); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Assign(ctx, AssignRequest{Node: "n1", Handle: "h2", Addr: r1.Addr}); err != nil {
		t.Fatal(err)
	}
	if err := a.ReleaseAddrHeldBy(ctx, r1.Addr, "h1"); !errors.As(err, &held) || held.Handle != "h2" {
		t.Fatalf("release by the old holder after the address moved: %v", err)
	}
	if addrs, _ := a.AddressesByHandle(ctx, "h2"); len(addrs) != 1 {
		t.Fatalf("h2 lost its address")
	}
	if err := a.ReleaseAddrHeldBy(ctx, r1.Addr, "h2"); err != nil {
		t.Fatal(err)
	}
	if err := a.ReleaseAddrHeldBy(ctx, r1.Addr, "h2"); err != nil {
		t.Errorf("releasing a free address: %v", err)
	}
	mustCheckClean(t, a)
}
