package main

import (
	"context"
	"strings"
	"testing"
)

// rotate-mesh-key replaces the stored key, with a random one or the one
// given, and refuses one the kernel would not take.
func TestBGPRotateMeshKey(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	old, _, err := h.store.EnsureBGPMeshKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if out := h.ok("bgp", "rotate-mesh-key"); !strings.Contains(out, "mesh key rotated") {
		t.Errorf("output %q", out)
	}
	k, _, err := h.store.EnsureBGPMeshKey(ctx)
	if err != nil || k == old {
		t.Fatalf("after rotation: %q, %v (old %q)", k.Key, err, old.Key)
	}
	h.ok("bgp", "rotate-mesh-key", "--key", "chosen-key")
	if k, _, _ = h.store.EnsureBGPMeshKey(ctx); k.Key != "chosen-key" {
		t.Errorf("key %q, want chosen-key", k.Key)
	}
	h.fail("bgp", "rotate-mesh-key", "--key", strings.Repeat("x", 81))
}
