package datastore

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ListKeys returns the keys (relative to the store's prefix) that start
// with prefix, sorted, without their values: knowing which records exist
// costs their keys only (IPAM's block claim: ≈ 40 B a block against
// ≈ 8 KB a block record).
func (s *Store) ListKeys(ctx context.Context, prefix string) ([]string, error) {
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	s.count.list.Add(1)
	resp, err := s.client.Get(ctx, s.abs(prefix), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, s.etcdErr(fmt.Sprintf("listing keys of %s", prefix), err)
	}
	out := make([]string, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		out[i] = s.rel(kv.Key)
	}
	return out, nil
}
