package syncer

import (
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// item is one decoded key of the view. val is a pointer: an api object
// as decoded, or a *ipam.BlockSummary, *ipam.Affinity or *datastore.KV,
// never modified once stored (changes hand it out).
type item struct {
	kind string
	val  any
	rev  int64
}

// state holds the decoded keys and the indexes over them. The Syncer's
// mutex guards it.
type state struct {
	items map[string]item
	// bad holds keys whose record does not decode: they are absent from
	// the view, but their key exists (node GC must not take a node whose
	// record is merely unreadable for a deleted one).
	bad map[string]error

	// ordered holds each kind's api objects ordered by key, kept in order
	// as they come and go, so that objects (every owner pass's Endpoints,
	// Nodes, NetworkPolicies) copies a slice instead of sorting every key:
	// at 30,000 endpoints the sort was a third of a policy pass
	// (docs/scale.md). An object by key is items' (no index by kind and
	// key: ≈ 90 bytes per endpoint for lookups items answers).
	ordered      map[string]*orderedObjects                    // api kind → objects by key
	epByNode     map[string]map[string]*api.WorkloadEndpoint   // node → key → whole endpoint
	remoteByNode map[string]int                                // node → how many compact endpoints (CompactRemote)
	blocks       map[netip.Prefix]ipam.BlockSummary            // by CIDR
	blocksByNode map[string]map[netip.Prefix]ipam.BlockSummary // affine node → CIDR → block
	borrowedBy   map[string]map[netip.Addr]ipam.BorrowedAddr   // using node → address
	affinities   map[string]map[netip.Prefix]ipam.Affinity     // node → block → claim
	nodeGC       map[string]datastore.KV                       // key → node GC record
	meshKey      string                                        // the cluster's BGP mesh key, "" without one
	bgpSecrets   datastore.BGPSecrets                          // the copied Secret keys of BGP passwords
	labels       labelSets                                     // the endpoints' maps, shared
	localNode    string                                        // other nodes' endpoints are kept compact (CompactRemote); "" keeps all whole
}

func newState() *state {
	return &state{
		items:        map[string]item{},
		bad:          map[string]error{},
		ordered:      map[string]*orderedObjects{},
		epByNode:     map[string]map[string]*api.WorkloadEndpoint{},
		remoteByNode: map[string]int{},
		blocks:       map[netip.Prefix]ipam.BlockSummary{},
		blocksByNode: map[string]map[netip.Prefix]ipam.BlockSummary{},
		borrowedBy:   map[string]map[netip.Addr]ipam.BorrowedAddr{},
		affinities:   map[string]map[netip.Prefix]ipam.Affinity{},
		nodeGC:       map[string]datastore.KV{},
		labels:       newLabelSets(),
	}
}

func (st *state) keys() []string { return slices.Collect(maps.Keys(st.items)) }

// decode turns a stored record into the view's value for it.
func decode(kv datastore.KV) (kind string, val any, err error) {
	switch {
	case strings.HasPrefix(kv.Key, ipam.BlockSummariesPrefix):
		b, err := ipam.DecodeSummaryRecord(kv.Key, kv.Value)
		return kindBlock, &b, err
	case strings.HasPrefix(kv.Key, ipam.AffinitiesPrefix):
		a, err := ipam.DecodeAffinity(kv.Key, kv.Value)
		return kindAffinity, &a, err
	case strings.HasPrefix(kv.Key, datastore.NodeGCPrefix):
		rec := kv // a copy: &kv would move every decoded record's kv to the heap
		return kindNodeGC, &rec, nil
	case kv.Key == datastore.BGPMeshKeyKey:
		k, err := datastore.DecodeBGPMeshKey(kv.Value)
		return kindMeshKey, &k, err
	case kv.Key == datastore.BGPSecretsKey:
		s, err := datastore.DecodeBGPSecrets(kv.Value)
		return kindBGPSecrets, &s, err
	}
	obj, err := datastore.DecodeResource(kv)
	if err != nil {
		return "", nil, err
	}
	// What the view holds reaches the kernel (routes, firewall): a record
	// written around Tabby's validation is treated like one that does not
	// decode.
	if err := validForKernel(obj); err != nil {
		return "", nil, fmt.Errorf("%s: %w", kv.Key, err)
	}
	return obj.GetTypeMeta().Kind, obj, nil
}

// validForKernel checks a resource as every write through the datastore
// does, and an endpoint's interface to be a workload interface: a record
// naming eth0 or lo must not make the agent route or police them.
func validForKernel(obj api.Object) error {
	if err := obj.Validate(); err != nil {
		return err
	}
	switch w := obj.(type) {
	case *api.WorkloadEndpoint:
		if n := w.Spec.InterfaceName; !strings.HasPrefix(n, api.WorkloadIfacePrefix) || len(n) == len(api.WorkloadIfacePrefix) {
			return fmt.Errorf("spec.interfaceName %q is not a workload interface (%s…)", n, api.WorkloadIfacePrefix)
		}
	}
	return nil
}

// unchanged says whether a new value of a key says nothing new.
func unchanged(old item, kind string, val any, rev int64) bool {
	if old.kind != kind {
		return false
	}
	switch o := old.val.(type) {
	case *ipam.BlockSummary:
		n, ok := val.(*ipam.BlockSummary)
		return ok && o.Equal(*n)
	case *ipam.Affinity:
		n, ok := val.(*ipam.Affinity)
		return ok && *o == *n
	}
	return old.rev == rev // an api object: etcd writes only changes
}

// put stores a key's new record and appends its updates to ups: none, one,
// or, when the key's value changes kind (an endpoint moving between this
// node and another in a compact view: CompactRemote), the old kind's
// deletion and the new kind's creation, so that each kind's subscribers
// see a consistent stream of their type.
func (st *state) put(kv datastore.KV, log *slog.Logger, ups []change) []change {
	if old, had := st.items[kv.Key]; had && old.rev == kv.ModRevision && old.kind != kindBlock && old.kind != kindAffinity {
		// The record the view holds (etcd writes only changes, so one
		// revision of a key is one value): a re-list after a compaction
		// or reconnect decodes nothing it already has.
		return ups
	}
	kind, val, err := decode(kv)
	if err != nil {
		if _, seen := st.bad[kv.Key]; !seen {
			log.Warn("skipping a record that does not decode", "key", kv.Key, "err", err)
		}
		st.bad[kv.Key] = err
		var c change
		var ok bool
		if strings.HasPrefix(kv.Key, ipam.BlockSummariesPrefix) {
			c, ok = st.putUnreadableBlock(kv)
		} else {
			// What was there is no longer what is stored.
			c, ok = st.del(kv.Key, kv.ModRevision)
		}
		if ok {
			ups = append(ups, c)
		}
		return ups
	}
	delete(st.bad, kv.Key)
	if w, ok := val.(*api.WorkloadEndpoint); ok {
		kind, val = st.compact(w, kv.ModRevision)
	}
	old, had := st.items[kv.Key]
	if had && unchanged(old, kind, val, kv.ModRevision) {
		// A block or affinity rewritten without a change the view
		// represents (an api object of the same revision returned above).
		st.items[kv.Key] = item{kind: kind, val: val, rev: kv.ModRevision}
		return ups
	}
	if had && old.kind != kind {
		gone, _ := st.del(kv.Key, kv.ModRevision)
		ups = append(ups, gone)
		had = false
	}
	if had {
		st.unindex(kv.Key, old)
	}
	it := item{kind: kind, val: val, rev: kv.ModRevision}
	st.items[kv.Key] = it
	st.index(kv.Key, it)
	c := change{kind: kind, key: kv.Key, new: val, rev: kv.ModRevision}
	if had {
		c.old = old.val
	}
	return append(ups, c)
}

// putUnreadableBlock keeps a block whose record stopped decoding as it
// was last seen, or, unseen, as its key and its node's claim say: the
// pods in it still need their node's blackhole route and advertisement.
// Only a deletion of the key removes it.
func (st *state) putUnreadableBlock(kv datastore.KV) (change, bool) {
	if old, had := st.items[kv.Key]; had && old.kind == kindBlock {
		return change{}, false
	}
	cidr, err := ipam.ParseSummaryKey(kv.Key)
	if err != nil {
		return st.del(kv.Key, kv.ModRevision)
	}
	sum := ipam.BlockSummary{CIDR: cidr}
	for _, node := range slices.Sorted(maps.Keys(st.affinities)) {
		if af, ok := st.affinities[node][cidr]; ok && af.Confirmed {
			sum.Affinity = node
			break
		}
	}
	c := change{kind: kindBlock, key: kv.Key, new: &sum, rev: kv.ModRevision}
	if old, had := st.items[kv.Key]; had {
		st.unindex(kv.Key, old)
		c.old = old.val
	}
	it := item{kind: kindBlock, val: &sum, rev: kv.ModRevision}
	st.items[kv.Key] = it
	st.index(kv.Key, it)
	return c, true
}

// unreadableBlocks returns the block keys whose record does not decode.
func (st *state) unreadableBlocks() []string {
	var out []string
	for k := range st.bad {
		if strings.HasPrefix(k, ipam.BlockSummariesPrefix) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// del removes a key and returns the update, if it was in the view.
func (st *state) del(key string, rev int64) (change, bool) {
	old, had := st.items[key]
	if !had {
		return change{}, false
	}
	st.unindex(key, old)
	delete(st.items, key)
	return change{kind: old.kind, key: key, old: old.val, rev: rev}, true
}

func addTo[K comparable, V any](m map[string]map[K]V, outer string, k K, v V) {
	inner := m[outer]
	if inner == nil {
		inner = map[K]V{}
		m[outer] = inner
	}
	inner[k] = v
}

func removeFrom[K comparable, V any](m map[string]map[K]V, outer string, k K) {
	if inner := m[outer]; inner != nil {
		delete(inner, k)
		if len(inner) == 0 {
			delete(m, outer)
		}
	}
}

func (st *state) index(key string, it item) {
	switch v := it.val.(type) {
	case *ipam.BlockSummary:
		st.blocks[v.CIDR] = *v
		if v.Affinity != "" {
			addTo(st.blocksByNode, v.Affinity, v.CIDR, *v)
		}
		for _, b := range v.Borrowed {
			addTo(st.borrowedBy, b.Node, b.Addr, b)
		}
	case *ipam.Affinity:
		addTo(st.affinities, v.Node, v.Block, *v)
	case *datastore.KV:
		st.nodeGC[key] = *v
	case *datastore.BGPMeshKey:
		st.meshKey = v.Key
	case *datastore.BGPSecrets:
		st.bgpSecrets = *v
	case *api.WorkloadEndpoint:
		st.labels.shareEndpoint(v)
		st.addObject(it.kind, key, v)
		addTo(st.epByNode, v.Spec.Node, key, v)
	case *api.RemoteEndpoint:
		st.labels.shareRemote(v)
		st.addObject(it.kind, key, v)
		st.remoteByNode[v.Node]++
	case api.Object:
		st.addObject(it.kind, key, v)
	}
}

func (st *state) unindex(key string, it item) {
	switch v := it.val.(type) {
	case *ipam.BlockSummary:
		delete(st.blocks, v.CIDR)
		if v.Affinity != "" {
			removeFrom(st.blocksByNode, v.Affinity, v.CIDR)
		}
		for _, b := range v.Borrowed {
			if cur, ok := st.borrowedBy[b.Node][b.Addr]; ok && cur.Block == v.CIDR {
				removeFrom(st.borrowedBy, b.Node, b.Addr)
			}
		}
	case *ipam.Affinity:
		removeFrom(st.affinities, v.Node, v.Block)
	case *datastore.KV:
		delete(st.nodeGC, key)
	case *datastore.BGPMeshKey:
		st.meshKey = ""
	case *datastore.BGPSecrets:
		st.bgpSecrets = datastore.BGPSecrets{}
	case *api.WorkloadEndpoint:
		st.labels.releaseEndpoint(v)
		st.removeObject(it.kind, key)
		removeFrom(st.epByNode, v.Spec.Node, key)
	case *api.RemoteEndpoint:
		st.labels.releaseRemote(v)
		st.removeObject(it.kind, key)
		if st.remoteByNode[v.Node]--; st.remoteByNode[v.Node] <= 0 {
			delete(st.remoteByNode, v.Node)
		}
	case api.Object:
		st.removeObject(it.kind, key)
	}
}

// object returns one object of a kind, if it is there and a T.
func object[T api.Object](st *state, kind, key string) (T, bool) {
	it, ok := st.items[key]
	if !ok || it.kind != kind {
		var zero T
		return zero, false
	}
	t, ok := it.val.(T)
	return t, ok
}

// poolOf returns the pool holding a block.
func (st *state) poolOf(cidr netip.Prefix) (*api.IPPool, bool) {
	for _, p := range objects[*api.IPPool](st, api.KindIPPool) {
		if pc, err := netip.ParsePrefix(p.Spec.CIDR); err == nil && pc.Masked().Overlaps(cidr) && pc.Bits() <= cidr.Bits() {
			return p, true
		}
	}
	return nil, false
}

func (st *state) blockInfo(b ipam.BlockSummary) ipam.BlockInfo {
	bi := ipam.BlockInfo{CIDR: b.CIDR, Pool: b.Pool, Affinity: b.Affinity}
	if b.Affinity != "" {
		bi.Confirmed = st.affinities[b.Affinity][b.CIDR].Confirmed
	}
	if p, ok := st.poolOf(b.CIDR); ok {
		bi.Pool = p.Metadata.Name
		bi.DisableBGPExport = p.Spec.DisableBGPExport
	}
	return bi
}
