package ipam

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
)

// countingConn counts the bytes a connection received.
type countingConn struct {
	net.Conn
	read *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// summaryBenchBlocks is the cluster of BenchmarkSyncSummariesAtStart: one
// /26 per node, 30 pods in each, as the scale harness's nodes.
const (
	summaryBenchBlocks = 1000
	summaryBenchPods   = 30
)

// writeBenchBlocks writes n blocks as the allocator would: each with its
// summary in one transaction, then rewritten once for another pod (the
// block alone: its summary does not change). It returns the blocks' keys
// and values.
func writeBenchBlocks(b *testing.B, s *datastore.Store, n int) []datastore.KV {
	ctx := context.Background()
	var out []datastore.KV
	for i := range n {
		cidr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(64 + i>>10), byte(i >> 2), byte(i & 3 << 6)}), 26)
		node := fmt.Sprintf("node-%d", i)
		blk := newBlock(cidr, node, "bench")
		attr := func(k int) attrRecord {
			return attrRecord{Handle: fmt.Sprintf("k8s-pod-network.%064x", i*100+k), Node: node, Namespace: "default",
				Pod: fmt.Sprintf("sim-%d-%d", i, k), ContainerID: fmt.Sprintf("%064x", i*100+k), Time: time.Unix(1.8e9, 0).UTC()}
		}
		for k := range summaryBenchPods - 1 {
			blk.allocate(attr(k))
		}
		if _, err := s.Txn(ctx, nil, []datastore.Op{{Key: blockKey(cidr), Value: blk.encode()}, {Key: summaryKey(cidr), Value: encodeSummary(blk.summary())}}); err != nil {
			b.Fatal(err)
		}
		blk.allocate(attr(summaryBenchPods))
		if _, err := s.Txn(ctx, nil, []datastore.Op{{Key: blockKey(cidr), Value: blk.encode()}}); err != nil {
			b.Fatal(err)
		}
		out = append(out, datastore.KV{Key: blockKey(cidr), Value: blk.encode()})
	}
	return out
}

// BenchmarkSyncSummariesAtStart is what an agent's start costs etcd and the
// agent for the block summaries (Allocator.SyncSummaries) with 1,000
// blocks of 30 pods whose summaries are all current: one call per
// iteration, on a store of its own connected to an embedded etcd, after a
// first call (not measured) that found and left them so. changed=N
// rewrites N blocks before each start (not measured), as their nodes' pods
// do between two agents' starts in a rolling update: the block alone, its
// summary unchanged. It reports the bytes the store received per start
// (read-B/start, wire bytes through its connection), its list, get and
// txn requests per start, and ns/op.
func BenchmarkSyncSummariesAtStart(b *testing.B) {
	e := storetest.Etcd(b)
	blocks := writeBenchBlocks(b, storetest.Connect(b, e), summaryBenchBlocks)
	var read atomic.Int64
	s := storetest.Connect(b, e, func(c *datastore.Config) {
		c.Dialer = func(ctx context.Context, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			return countingConn{Conn: conn, read: &read}, nil
		}
	})
	ctx := context.Background()
	if n, err := New(s).SyncSummaries(ctx); n != 0 || err != nil {
		b.Fatalf("first SyncSummaries = %d, %v; want nothing to repair", n, err)
	}
	next := 0
	for _, changed := range []int{0, 20} {
		b.Run(fmt.Sprintf("changed=%d", changed), func(b *testing.B) {
			var reqs datastore.Requests
			var bytes int64
			for b.Loop() {
				b.StopTimer()
				for range changed {
					kv := blocks[next%len(blocks)]
					next++
					if _, err := s.PutKV(ctx, kv.Key, kv.Value, 0); err != nil {
						b.Fatal(err)
					}
				}
				r0, bytes0 := s.Requests(), read.Load()
				b.StartTimer()
				if n, err := New(s).SyncSummaries(ctx); n != 0 || err != nil {
					b.Fatalf("SyncSummaries = %d, %v; want nothing to repair", n, err)
				}
				b.StopTimer()
				r := s.Requests()
				bytes += read.Load() - bytes0
				reqs.List += r.List - r0.List
				reqs.Get += r.Get - r0.Get
				reqs.Txn += r.Txn - r0.Txn
				b.StartTimer()
			}
			per := func(v int64) float64 { return float64(v) / float64(b.N) }
			b.ReportMetric(per(bytes), "read-B/start")
			b.ReportMetric(per(reqs.List), "lists/start")
			b.ReportMetric(per(reqs.Get), "gets/start")
			b.ReportMetric(per(reqs.Txn), "txns/start")
		})
	}
}
