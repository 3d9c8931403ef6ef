package storetest_test

import (
	"context"
	"testing"

	"github.com/tabbynet/tabby/datastore/storetest"
)

func TestNewStoresAreIsolated(t *testing.T) {
	ctx := context.Background()
	a := storetest.New(t)
	b := storetest.New(t)
	if _, err := a.PutKV(ctx, "k", []byte("a"), 0); err != nil {
		t.Fatalf("put: %v", err)
	}
	kvs, _, err := b.ListKV(ctx, "")
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	if len(kvs) != 0 {
		t.Errorf("second store sees %d keys of the first, want 0", len(kvs))
	}
	got, err := a.GetKV(ctx, "k")
	if err != nil || string(got.Value) != "a" {
		t.Errorf("GetKV = %q, %v; want \"a\"", got.Value, err)
	}
}
