package ipam

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestBlockNames(t *testing.T) {
	tests := []struct {
		prefix string
		name   string
	}{
		{"10.244.0.0/26", "10.244.0.0-26"},
		{"10.244.255.252/30", "10.244.255.252-30"},
		{"10.0.0.7/32", "10.0.0.7-32"},
	}
	for _, tt := range tests {
		p := netip.MustParsePrefix(tt.prefix)
		if got := blockName(p); got != tt.name {
			t.Errorf("blockName(%s) = %q, want %q", p, got, tt.name)
		}
		back, err := parseBlockName(tt.name)
		if err != nil || back != p {
			t.Errorf("parseBlockName(%q) = %v, %v; want %s", tt.name, back, err, p)
		}
	}
	for _, bad := range []string{"10.244.0.0", "10.244.0.1-26", "x-26", "10.0.0.0-40"} {
		if _, err := parseBlockName(bad); err == nil {
			t.Errorf("parseBlockName(%q) succeeded, want error", bad)
		}
	}
	node, blk, err := parseAffinityKey(affinityKey("node/a b", netip.MustParsePrefix("10.1.0.0/26")))
	if err != nil || node != "node/a b" || blk != netip.MustParsePrefix("10.1.0.0/26") {
		t.Errorf("affinity key round trip = %q %s %v", node, blk, err)
	}
}

func TestOrdinalMath(t *testing.T) {
	blk := netip.MustParsePrefix("10.244.1.64/26")
	tests := []struct {
		addr string
		ord  int
		ok   bool
	}{
		{"10.244.1.64", 0, true},
		{"10.244.1.127", 63, true},
		{"10.244.1.100", 36, true},
		{"10.244.1.128", 0, false},
		{"10.244.1.63", 0, false},
		{"::1", 0, false},
	}
	for _, tt := range tests {
		ord, ok := ordinal(blk, netip.MustParseAddr(tt.addr))
		if ord != tt.ord || ok != tt.ok {
			t.Errorf("ordinal(%s, %s) = %d, %v; want %d, %v", blk, tt.addr, ord, ok, tt.ord, tt.ok)
		}
		if ok {
			if back := addrAt(blk, ord); back.String() != tt.addr {
				t.Errorf("addrAt(%s, %d) = %s, want %s", blk, ord, back, tt.addr)
			}
		}
	}
	if got := addrAt(netip.MustParsePrefix("10.244.255.240/28"), 15); got != netip.MustParseAddr("10.244.255.255") {
		t.Errorf("addrAt across octets = %s", got)
	}
	pool := netip.MustParsePrefix("10.244.0.0/16")
	if n := numBlocks(pool, 26); n != 1024 {
		t.Errorf("numBlocks(/16, 26) = %d", n)
	}
	if n := numBlocks(pool, 12); n != 0 {
		t.Errorf("numBlocks(/16, 12) = %d, want 0", n)
	}
	for n, want := range map[int]string{0: "10.244.0.0/26", 1: "10.244.0.64/26", 4: "10.244.1.0/26", 1023: "10.244.255.192/26"} {
		if got := nthBlock(pool, 26, n); got.String() != want {
			t.Errorf("nthBlock(/16, 26, %d) = %s, want %s", n, got, want)
		}
	}
	if got := blockFor(netip.MustParseAddr("10.244.3.77"), 26); got.String() != "10.244.3.64/26" {
		t.Errorf("blockFor = %s", got)
	}
}

func attrFor(h string) attrRecord {
	return attrRecord{Handle: h, Node: "n1", Time: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func TestBlockAllocateRelease(t *testing.T) {
	b := newBlock(netip.MustParsePrefix("10.0.0.0/30"), "n1", "p")
	var got []string
	for _, h := range []string{"a", "b", "c", "d"} {
		addr, ok := b.allocate(attrFor(h))
		if !ok {
			t.Fatalf("allocate %s: block full too early", h)
		}
		got = append(got, addr.String())
	}
	if diff := cmp.Diff([]string{"10.0.0.0", "10.0.0.1", "10.0.0.2", "10.0.0.3"}, got); diff != "" {
		t.Errorf("allocation order (-want +got):\n%s", diff)
	}
	if _, ok := b.allocate(attrFor("e")); ok {
		t.Fatal("allocate in a full block succeeded")
	}
	// Release from the middle: the attributes of the others must follow.
	attr, ok := b.release(netip.MustParseAddr("10.0.0.1"))
	if !ok || attr.Handle != "b" {
		t.Fatalf("release .1 = %+v, %v", attr, ok)
	}
	if _, ok := b.release(netip.MustParseAddr("10.0.0.1")); ok {
		t.Error("second release of .1 reported it held")
	}
	if err := b.validate(); err != nil {
		t.Fatalf("after release: %v", err)
	}
	holders := map[string]string{}
	b.allocated(func(addr netip.Addr, a attrRecord) { holders[addr.String()] = a.Handle })
	if diff := cmp.Diff(map[string]string{"10.0.0.0": "a", "10.0.0.2": "c", "10.0.0.3": "d"}, holders); diff != "" {
		t.Errorf("holders after release (-want +got):\n%s", diff)
	}
	// The freed ordinal is reused (it is the only free one).
	if addr, _ := b.allocate(attrFor("e")); addr.String() != "10.0.0.1" {
		t.Errorf("reallocated %s, want 10.0.0.1", addr)
	}
	if got := b.addrsOf("e"); len(got) != 1 || got[0].String() != "10.0.0.1" {
		t.Errorf("addrsOf(e) = %v", got)
	}
}

func TestBlockReleasedAddressReusedLast(t *testing.T) {
	b := newBlock(netip.MustParsePrefix("10.0.0.0/29"), "n1", "p")
	first, _ := b.allocate(attrFor("a"))
	b.release(first)
	next, _ := b.allocate(attrFor("b"))
	if next == first {
		t.Errorf("freed %s was handed out again immediately", first)
	}
}

func TestBlockAllocateAddr(t *testing.T) {
	b := newBlock(netip.MustParsePrefix("10.0.0.0/29"), "n1", "p")
	want := netip.MustParseAddr("10.0.0.5")
	if err := b.allocateAddr(want, attrFor("a")); err != nil {
		t.Fatal(err)
	}
	err := b.allocateAddr(want, attrFor("b"))
	var inUse *InUseError
	if !errors.As(err, &inUse) || inUse.Handle != "a" || !errors.Is(err, ErrInUse) {
		t.Fatalf("second allocateAddr = %v, want InUseError naming handle a", err)
	}
	if err := b.allocateAddr(netip.MustParseAddr("10.0.0.9"), attrFor("c")); err == nil {
		t.Error("allocateAddr outside the block succeeded")
	}
	if err := b.validate(); err != nil {
		t.Fatal(err)
	}
	// Automatic allocation skips the taken ordinal.
	seen := map[netip.Addr]bool{}
	for range 7 {
		addr, ok := b.allocate(attrFor("x"))
		if !ok || addr == want || seen[addr] {
			t.Fatalf("allocate = %s, %v (taken: %s, seen %v)", addr, ok, want, seen)
		}
		seen[addr] = true
	}
}

func TestBlockEncodeDecode(t *testing.T) {
	b := newBlock(netip.MustParsePrefix("10.0.0.0/30"), "n1", "pool-a")
	b.allocate(attrFor("a"))
	b.allocate(attrFor("b"))
	b.release(netip.MustParseAddr("10.0.0.0"))
	got, err := decodeBlock(b.encode(), 7)
	if err != nil {
		t.Fatal(err)
	}
	b.rev = 7
	if diff := cmp.Diff(b, got, cmp.AllowUnexported(block{}), netipOpts); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	// A clone is independent.
	c := got.clone()
	c.allocate(attrFor("c"))
	if got.inUse() != 1 {
		t.Errorf("modifying a clone changed the original: %d in use", got.inUse())
	}
}

func TestDecodeBlockRejectsInconsistent(t *testing.T) {
	tests := map[string]string{
		"bad json":         `{`,
		"bad cidr":         `{"cidr":"x","allocations":[],"unallocated":[],"attributes":[]}`,
		"host bits":        `{"cidr":"10.0.0.1/30","allocations":[null,null,null,null],"unallocated":[0,1,2,3],"attributes":[]}`,
		"slots":            `{"cidr":"10.0.0.0/30","allocations":[null],"unallocated":[0],"attributes":[]}`,
		"dangling index":   `{"cidr":"10.0.0.0/30","allocations":[5,null,null,null],"unallocated":[1,2,3],"attributes":[]}`,
		"unreferenced":     `{"cidr":"10.0.0.0/30","allocations":[null,null,null,null],"unallocated":[0,1,2,3],"attributes":[{"handle":"a","time":"2025-01-01T00:00:00Z"}]}`,
		"both":             `{"cidr":"10.0.0.0/30","allocations":[0,null,null,null],"unallocated":[0,1,2,3],"attributes":[{"handle":"a","time":"2025-01-01T00:00:00Z"}]}`,
		"missing free":     `{"cidr":"10.0.0.0/30","allocations":[null,null,null,null],"unallocated":[0,1],"attributes":[]}`,
		"shared attribute": `{"cidr":"10.0.0.0/30","allocations":[0,0,null,null],"unallocated":[2,3],"attributes":[{"handle":"a","time":"2025-01-01T00:00:00Z"}]}`,
		"bad affinity":     `{"cidr":"10.0.0.0/30","affinity":"n1","allocations":[null,null,null,null],"unallocated":[0,1,2,3],"attributes":[]}`,
	}
	for name, val := range tests {
		if _, err := decodeBlock([]byte(val), 1); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}
