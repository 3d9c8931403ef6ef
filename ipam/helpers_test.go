package ipam

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
)

// countingStore counts etcd round trips.
type countingStore struct {
	*datastore.Store
	n atomic.Int64
}

func (c *countingStore) GetKV(ctx context.Context, key string) (datastore.KV, error) {
	c.n.Add(1)
	return c.Store.GetKV(ctx, key)
}

func (c *countingStore) ListKeys(ctx context.Context, prefix string) ([]string, error) {
	c.n.Add(1)
	return c.Store.ListKeys(ctx, prefix)
}

func (c *countingStore) ListKV(ctx context.Context, prefix string) ([]datastore.KV, int64, error) {
	c.n.Add(1)
	return c.Store.ListKV(ctx, prefix)
}

func (c *countingStore) Txn(ctx context.Context, cmps []datastore.Cmp, ops []datastore.Op) (int64, error) {
	c.n.Add(1)
	return c.Store.Txn(ctx, cmps, ops)
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustCreatePool(t testing.TB, a *Allocator, name, cidr string, blockSize int, mutate ...func(*api.IPPool)) {
	t.Helper()
	p := &api.IPPool{Metadata: api.ObjectMeta{Name: name}, Spec: api.IPPoolSpec{CIDR: cidr, BlockSize: blockSize}}
	for _, m := range mutate {
		m(p)
	}
	if _, err := a.CreatePool(testCtx(t), p); err != nil {
		t.Fatalf("creating pool %s: %v", name, err)
	}
}

func mustConfig(t testing.TB, s *datastore.Store, spec api.IPAMConfigSpec) {
	t.Helper()
	c := &api.IPAMConfig{Metadata: api.ObjectMeta{Name: api.SingletonName}, Spec: spec}
	if _, err := s.Apply(testCtx(t), c); err != nil {
		t.Fatalf("writing ipam config: %v", err)
	}
}

func mustAssign(t testing.TB, a *Allocator, node, h string) Assignment {
	t.Helper()
	res, err := a.Assign(testCtx(t), AssignRequest{Node: node, Handle: h})
	if err != nil {
		t.Fatalf("assign %s on %s: %v", h, node, err)
	}
	return res
}

// mustCheck runs Check and fails on anything but the allowed leaks.
func mustCheckClean(t testing.TB, a *Allocator) Report {
	t.Helper()
	r, err := a.Check(testCtx(t))
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	if len(r.OrphanHandles) > 0 || len(r.Inconsistencies) > 0 {
		t.Fatalf("check found problems:\norphans: %+v\ninconsistencies: %+v", r.OrphanHandles, r.Inconsistencies)
	}
	return r
}

// allocated returns every allocated address with its handle, failing on a
// duplicate.
func allocated(t testing.TB, a *Allocator) map[netip.Addr]string {
	t.Helper()
	blocks, _, err := a.listBlocks(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	out := map[netip.Addr]string{}
	for _, b := range blocks {
		b.allocated(func(addr netip.Addr, attr attrRecord) {
			if prev, dup := out[addr]; dup {
				t.Errorf("duplicate address %s: handles %s and %s", addr, prev, attr.Handle)
			}
			out[addr] = attr.Handle
		})
	}
	return out
}

func newTestAllocator(t testing.TB, opts ...Option) (*Allocator, *datastore.Store) {
	s := storetest.New(t)
	return New(s, opts...), s
}

// failOnce returns a fault hook that fails the first time step is reached
// and records every step it sees.
func failOnce(step string, seen *[]string) func(string) error {
	fired := false
	return func(s string) error {
		*seen = append(*seen, s)
		if s == step && !fired {
			fired = true
			return fmt.Errorf("injected crash after %s", s)
		}
		return nil
	}
}

// netipOpts lets go-cmp compare netip values.
var netipOpts = cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})
