package datastore_test

import (
	"context"
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
