package datastore_test

import (
	"context"
	"testing"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
)

// A corrupt record written around Tabby must not hide the others from List.
func TestListSkipsCorruptRecords(t *testing.T) {
	ctx := context.Background()
	s := storetest.New(t)
	for _, name := range []string{"a", "c"} {
		if _, err := s.Create(ctx, &api.IPPool{Metadata: api.ObjectMeta{Name: name}, Spec: api.IPPoolSpec{CIDR: map[string]string{"a": "10.244.0.0/24", "c": "10.244.2.0/24"}[name]}}); err != nil {
			t.Fatal(err)
		}
	}
	key, err := datastore.ResourceKey(api.KindIPPool, "", "b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutKV(ctx, key, []byte("{not json"), 0); err != nil {
		t.Fatal(err)
	}
	objs, _, err := s.List(ctx, api.KindIPPool, "")
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(objs) != 2 || objs[0].GetMeta().Name != "a" || objs[1].GetMeta().Name != "c" {
		t.Errorf("List returned %d objects, want a and c", len(objs))
	}
	if _, err := s.Get(ctx, api.KindIPPool, "", "b"); err == nil {
		t.Error("Get of the corrupt record succeeded")
	}
}
