// Package ipam owns Tabby's pod address management: Calico-style block
// allocation on etcd. Pools (api.IPPool) are carved into blocks (blockSize,
// /26 by default); a node claims blocks and hands out their addresses, so
// that BGP can advertise one aggregate per block; when no block can be
// claimed a node borrows single addresses from other blocks (advertised as
// /32s), unless IPAMConfig strictAffinity forbids it.
//
// # Records
//
// Keys are relative to the datastore prefix:
//
//	ipam/blocks/<a.b.c.d-len>        block: cidr, affinity "host:<node>" or "", pool,
//	                                 allocations (per ordinal: null or an index into
//	                                 attributes), unallocated (free ordinals, in the
//	                                 order they are handed out), attributes
//	                                 [{handle, node, namespace, pod, containerID, time}]
//	ipam/block-summaries/<block>     what other nodes read of a block: cidr, affinity,
//	                                 pool, borrowed [{addr, node}]; written in the
//	                                 block's transaction when one of them changes
//	                                 (summary.go)
//	ipam/affinities/<node>/<block>   {"state": "confirmed"} (pending and pendingDeletion
//	                                 are understood, never written)
//	ipam/handles/<handle>            {handle, node, addrs: [{addr, block}]}
//
// The block is the source of truth. A handle record is written in the same
// etcd transaction as the block allocation it describes, and a block is
// created in the same transaction as its affinity record, so no crash can
// leave them disagreeing. (Calico writes a pending affinity, the block, then
// confirms the affinity, because its Kubernetes backend has no multi-key
// transactions; etcd has them.)
//
// # Writes
//
// Every write is a compare-and-swap on the etcd revisions it read, retried
// with jittered backoff (WithMaxRetries, default 20); there is no global
// lock. An allocation transaction also compares the pool's revision (and
// the Node's, when the pool has a nodeSelector), so disabling or editing a
// pool, or relabelling a node, fails every allocation that read the old
// state. Within one process, operations for one node are serialised, which
// removes conflicts an agent would otherwise have with itself.
//
// # Assign
//
// Assign is idempotent per handle: a handle that holds an address gets it
// back. Otherwise the node's confirmed affine blocks are tried, then a new
// block is claimed (a free block of a usable pool — enabled, selecting the
// node's labels, among req.Pools — scanning from a node-dependent start so
// that nodes rarely race for the same block; honouring autoAllocateBlocks
// and maxBlocksPerHost), then an address is borrowed; else the error wraps
// ErrExhausted ("ipam: pools [p] exhausted for node n1").
//
// The common case costs one etcd round trip: the allocator caches, per
// node, what its last full read found (pools, the Node, the affine blocks)
// and allocates with one transaction that compares all of it and that the
// handle does not exist. A stale cache costs a failed transaction and a full
// read, never a wrong allocation.
//
// The next Assign on a node repairs what a crashed multi-step writer could
// leave: a pending affinity whose block is the node's is confirmed, an
// affinity whose block is gone or someone else's is deleted, and a block
// affine to the node without affinity record is adopted. Check reports all
// of them.
//
// # Release
//
// ReleaseHandle and ReleaseAddr free addresses (a free address or unknown
// handle is success) and update the handle record in the same transaction.
// A block left empty is deleted when no node has affinity to it; an empty
// affine block stays for the node's next pods until ReleaseEmptyBlocks or
// ReleaseNode. ReleaseNode deletes a node's affinities and empty blocks,
// takes the affinity from its blocks that still hold addresses (whose last
// release then deletes them) and, with releaseAddrs, first frees every
// address allocated for the node. GCNodes does that for every node missing
// from a list of live nodes.
//
// # Checks
//
// Check cross-checks blocks, affinities, handles and workload endpoints
// (leaked addresses older than WithLeakGrace, orphan handles, inconsistent
// blocks and affinities, duplicate addresses); Usage reports per pool and
// per block usage; Blocks and Borrowed feed BGP. CreatePool rejects
// overlapping pools; DeletePool refuses while a pool has allocations.
//
// WithFaultHook lets tests crash the allocator right after any write.
package ipam
