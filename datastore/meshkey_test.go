package datastore_test

import (
	"context"
	"sync"
	"testing"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
)

// Agents starting at once agree on one mesh key, made by exactly one of
// them; a restart reads it back; SetBGPMeshKey rotates it and refuses a key
// the kernel would not take; a stored key that does not decode is an
// error, not silently replaced.
func TestEnsureBGPMeshKey(t *testing.T) {
	s := storetest.New(t)
	ctx := context.Background()
	const agents = 8
	keys := make([]datastore.BGPMeshKey, agents)
	created := make([]bool, agents)
	errs := make([]error, agents)
	var wg sync.WaitGroup
	for i := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			keys[i], created[i], errs[i] = s.EnsureBGPMeshKey(ctx)
		}()
	}
	wg.Wait()
	makers := 0
	for i := range agents {
		if errs[i] != nil {
			t.Fatalf("agent %d: %v", i, errs[i])
		}
		if keys[i] != keys[0] {
			t.Errorf("agent %d got key %q, agent 0 %q", i, keys[i].Key, keys[0].Key)
		}
		if created[i] {
			makers++
		}
	}
	if makers != 1 {
		t.Errorf("%d agents created the key, want 1", makers)
	}
	if n := len(keys[0].Key); n != 44 {
		t.Errorf("key of %d characters, want 44 (32 random bytes, base64)", n)
	}
	again, made, err := s.EnsureBGPMeshKey(ctx)
	if err != nil || made || again != keys[0] {
		t.Errorf("after a restart: %q, created %v, %v; want %q", again.Key, made, err, keys[0].Key)
	}

	rotated, err := s.SetBGPMeshKey(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if rotated == keys[0] {
		t.Error("rotation kept the old key")
	}
	if got, _, err := s.EnsureBGPMeshKey(ctx); err != nil || got != rotated {
		t.Errorf("after rotation: %q, %v; want %q", got.Key, err, rotated.Key)
	}
	if _, err := s.SetBGPMeshKey(ctx, string(make([]byte, 81))); err == nil {
		t.Error("a key of 81 bytes was stored")
	}
	if _, err := s.PutKV(ctx, datastore.BGPMeshKeyKey, []byte("not json"), 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.EnsureBGPMeshKey(ctx); err == nil {
		t.Error("an undecodable key was accepted")
	}
}
