package datastore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
)

// ListKeys lists the keys under a prefix of this store's prefix only,
// sorted, and nothing beside them.
func TestListKeys(t *testing.T) {
	ctx := context.Background()
	e := storetest.Etcd(t)
	s := storetest.Connect(t, e)
	other := storetest.Connect(t, e, func(c *datastore.Config) { c.Prefix = "/other" })
	if _, err := other.PutKV(ctx, "ipam/blocks/x", []byte("other"), 0); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ipam/blocks/b", "ipam/blocksX", "ipam/blocks/a", "ipam/block-summaries/a"} {
		if _, err := s.PutKV(ctx, k, []byte("a large value "+k), 0); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.ListKeys(ctx, "ipam/blocks/")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"ipam/blocks/a", "ipam/blocks/b"}, got); diff != "" {
		t.Errorf("ListKeys (-want +got):\n%s", diff)
	}
}

// ListRevisions lists the keys under a prefix with their revisions and
// no values, in pages at one revision.
func TestListRevisions(t *testing.T) {
	ctx := context.Background()
	e := storetest.Etcd(t)
	s := storetest.Connect(t, e)
	other := storetest.Connect(t, e, func(c *datastore.Config) { c.Prefix = "/other" })
	if _, err := other.PutKV(ctx, "ipam/blocks/x", []byte("other"), 0); err != nil {
		t.Fatal(err)
	}
	// More than one page (1,000 keys).
	var want []datastore.KV
	for i := range 1001 {
		key := fmt.Sprintf("ipam/blocks/%04d", i)
		rev, err := s.PutKV(ctx, key, []byte("a large value "+key), 0)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, datastore.KV{Key: key, ModRevision: rev})
	}
	if _, err := s.PutKV(ctx, "ipam/blocksX", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	// A key rewritten: its new revision.
	rev, err := s.PutKV(ctx, want[3].Key, []byte("again"), 0)
	if err != nil {
		t.Fatal(err)
	}
	want[3].ModRevision = rev
	before := s.Requests().List
	got, at, err := s.ListRevisions(ctx, "ipam/blocks/")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ListRevisions (-want +got):\n%s", diff)
	}
	if at < rev {
		t.Errorf("listed at revision %d, before the last write %d", at, rev)
	}
	if n := s.Requests().List - before; n != 2 {
		t.Errorf("%d list requests, want 2 pages", n)
	}
}
