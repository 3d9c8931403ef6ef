package datastore

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
)

// BGPMeshKeyKey holds the cluster's BGP mesh key: the TCP-MD5 password of
// every session between cluster nodes (the node-to-node mesh, route
// reflectors and their clients) unless BGPConfiguration's nodeMeshPassword
// or the BGPPeer sets one (docs/bgp.md, "Mesh authentication"). It is not a
// resource: no tabbyctl get prints it, and a BGPConfiguration applied from a
// file cannot drop it.
const BGPMeshKeyKey = "config/bgp-mesh-key"

// BGPMeshKey is the value of BGPMeshKeyKey.
type BGPMeshKey struct {
	// Key is the password: 32 random bytes, base64 (44 characters; Linux
	// takes TCP-MD5 keys of at most 80 bytes).
	Key string `json:"key"`
}

// MaxBGPMeshKeyLen is the longest key the kernel takes (TCP_MD5SIG_MAXKEYLEN).
const MaxBGPMeshKeyLen = 80

// DecodeBGPMeshKey parses a stored mesh key.
func DecodeBGPMeshKey(val []byte) (BGPMeshKey, error) {
	var k BGPMeshKey
	if err := json.Unmarshal(val, &k); err != nil {
		return BGPMeshKey{}, fmt.Errorf("%s: %w", BGPMeshKeyKey, err)
	}
	if err := k.validate(); err != nil {
		return BGPMeshKey{}, err
	}
	return k, nil
}

func (k BGPMeshKey) validate() error {
	if k.Key == "" || len(k.Key) > MaxBGPMeshKeyLen {
		return fmt.Errorf("%s: the key must have 1 to %d bytes, has %d", BGPMeshKeyKey, MaxBGPMeshKeyLen, len(k.Key))
	}
	return nil
}

// NewBGPMeshKey makes a random key.
func NewBGPMeshKey() (BGPMeshKey, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return BGPMeshKey{}, fmt.Errorf("making a mesh key: %w", err)
	}
	return BGPMeshKey{Key: base64.StdEncoding.EncodeToString(b)}, nil
}

// EnsureBGPMeshKey creates the cluster's mesh key if there is none, in a
// create-if-absent transaction, so that of agents starting at once exactly
// one key wins; created says whether this call made it. A stored key that
// does not decode is an error, not replaced: an operator must look.
func (s *Store) EnsureBGPMeshKey(ctx context.Context) (key BGPMeshKey, created bool, err error) {
	kv, err := s.GetKV(ctx, BGPMeshKeyKey)
	if err == nil {
		k, err := DecodeBGPMeshKey(kv.Value)
		return k, false, err
	}
	if !errors.Is(err, ErrNotFound) {
		return BGPMeshKey{}, false, err
	}
	k, err := NewBGPMeshKey()
	if err != nil {
		return BGPMeshKey{}, false, err
	}
	val, _ := json.Marshal(k)
	_, err = s.Txn(ctx, []Cmp{{Key: BGPMeshKeyKey, ModRevision: 0}}, []Op{{Key: BGPMeshKeyKey, Value: val}})
	switch {
	case err == nil:
		return k, true, nil
	case errors.Is(err, ErrConflict): // another agent was first
		kv, err := s.GetKV(ctx, BGPMeshKeyKey)
		if err != nil {
			return BGPMeshKey{}, false, err
		}
		k, err := DecodeBGPMeshKey(kv.Value)
		return k, false, err
	}
	return BGPMeshKey{}, false, fmt.Errorf("creating the mesh key: %w", err)
}

// SetBGPMeshKey replaces the cluster's mesh key (rotation, docs/bgp.md);
// an empty key makes a random one. It returns the key stored.
func (s *Store) SetBGPMeshKey(ctx context.Context, key string) (BGPMeshKey, error) {
	k := BGPMeshKey{Key: key}
	if key == "" {
		var err error
		if k, err = NewBGPMeshKey(); err != nil {
			return BGPMeshKey{}, err
		}
	}
	if err := k.validate(); err != nil {
		return BGPMeshKey{}, err
	}
	val, _ := json.Marshal(k)
	if _, err := s.PutKV(ctx, BGPMeshKeyKey, val, 0); err != nil {
		return BGPMeshKey{}, fmt.Errorf("storing the mesh key: %w", err)
	}
	return k, nil
}
