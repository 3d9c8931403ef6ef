package ipam

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// Errors; test with errors.Is.
var (
	// ErrExhausted: no free address in any usable pool (and no block could
	// be claimed or borrowed from). It is wrapped in an error naming the
	// pools and the node.
	ErrExhausted = errors.New("ip pools exhausted")
	// ErrNoPool: no pool may serve the request (none exist, all disabled,
	// none selects the node, none of the requested ones).
	ErrNoPool = errors.New("no usable ip pool")
	// ErrInUse: a specific address, or a pool being deleted, is in use.
	ErrInUse = errors.New("in use")
	// ErrUnreadableBlock: a block record does not decode (written around
	// Tabby, or damaged); allocation goes around it, ipam check reports it.
	ErrUnreadableBlock = errors.New("block record does not decode")
	// ErrNotInPool: a specific address lies outside every usable pool.
	ErrNotInPool = errors.New("address not in a usable pool")
	// ErrPoolOverlap: a new pool overlaps an existing one.
	ErrPoolOverlap = errors.New("pool overlaps an existing pool")
)

// ExhaustedError is returned when no address is left for a node.
type ExhaustedError struct {
	Node  string
	Pools []string
}

func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("ipam: pools [%s] exhausted for node %s", strings.Join(e.Pools, " "), e.Node)
}

// Is makes errors.Is(err, ErrExhausted) hold.
func (e *ExhaustedError) Is(target error) bool { return target == ErrExhausted }

// kvStore is the part of *datastore.Store the allocator uses. Tests wrap it
// to count round trips and to inject failures.
type kvStore interface {
	GetKV(ctx context.Context, key string) (datastore.KV, error)
	ListKV(ctx context.Context, prefix string) ([]datastore.KV, int64, error)
	ListKeys(ctx context.Context, prefix string) ([]string, error)
	ListRevisions(ctx context.Context, prefix string) ([]datastore.KV, int64, error)
	ClusterID() uint64
	Txn(ctx context.Context, cmps []datastore.Cmp, ops []datastore.Op) (int64, error)
	Create(ctx context.Context, obj api.Object) (api.Object, error)
	Update(ctx context.Context, obj api.Object) (api.Object, error)
	Delete(ctx context.Context, kind, namespace, name, resourceVersion string) error
}

// Defaults of the options.
const (
	DefaultMaxRetries = 20
	DefaultLeakGrace  = time.Minute
)

// Allocator assigns and releases pod addresses. It is safe for concurrent
// use, also by several processes on one etcd: every write is a
// compare-and-swap on the revisions it read. Within one process, operations
// for the same node are serialised, which removes self-inflicted conflicts
// when one agent assigns many addresses at once.
type Allocator struct {
	store      kvStore
	log        *slog.Logger
	fault      func(step string) error
	maxRetries int
	leakGrace  time.Duration
	now        func() time.Time

	mu     sync.Mutex
	locks  map[string]*sync.Mutex
	caches map[string]*nodeCache
	// lastHandle is, per node, the handle record this process wrote last:
	// a dual-stack pod's second assign (the other family, same handle)
	// takes the fast path with it instead of reading the handle again.
	lastHandle map[string]*handle
	// unreadable holds the blocks that did not decode when last read, with
	// why; skipped counts how often an operation went around one.
	unreadable map[netip.Prefix]string
	skipped    atomic.Int64
}

// UnreadableBlocks returns the blocks an operation of this allocator found
// undecodable the last time it read them, with the decoding error, and how
// many times in all an operation skipped one. Safe for concurrent use.
func (a *Allocator) UnreadableBlocks() (map[netip.Prefix]string, int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.unreadable), a.skipped.Load()
}

// skipUnreadable records and logs (once per block and error) that an
// operation went around an undecodable block: the node keeps allocating
// from its other blocks, and ipam check reports the block.
func (a *Allocator) skipUnreadable(cidr netip.Prefix, err error) {
	a.skipped.Add(1)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.unreadable == nil {
		a.unreadable = map[netip.Prefix]string{}
	}
	if a.unreadable[cidr] == err.Error() {
		return
	}
	a.unreadable[cidr] = err.Error()
	a.log.Warn("skipping an ipam block that does not decode; run tabbyctl ipam check", "block", cidr, "err", err)
}

// readable forgets that a block was unreadable.
func (a *Allocator) readable(cidr netip.Prefix) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.unreadable, cidr)
}

// Option configures an Allocator.
type Option func(*Allocator)

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(a *Allocator) { a.log = l } }

// WithMaxRetries bounds the attempts of one operation that keeps losing
// compare-and-swap races (default 20).
func WithMaxRetries(n int) Option { return func(a *Allocator) { a.maxRetries = max(n, 1) } }

// WithLeakGrace sets how old an allocation without a workload endpoint must
// be before Check calls it leaked (default one minute; 0 = any).
func WithLeakGrace(d time.Duration) Option { return func(a *Allocator) { a.leakGrace = d } }

// WithClock replaces time.Now, for tests.
func WithClock(now func() time.Time) Option { return func(a *Allocator) { a.now = now } }

// WithFaultHook installs a hook called after each successful etcd write with
// the name of the step ("assign", "repair", "release", "release-node",
// "release-empty-block", "delete-pool"). An error from the hook aborts the
// operation as if the process had died right after the write; tests use it
// to prove crash safety.
func WithFaultHook(hook func(step string) error) Option { return func(a *Allocator) { a.fault = hook } }

// New returns an allocator on store.
func New(store *datastore.Store, opts ...Option) *Allocator {
	return newAllocator(store, opts...)
}

func newAllocator(store kvStore, opts ...Option) *Allocator {
	a := &Allocator{
		store:      store,
		log:        slog.New(slog.DiscardHandler),
		maxRetries: DefaultMaxRetries,
		leakGrace:  DefaultLeakGrace,
		now:        time.Now,
		locks:      map[string]*sync.Mutex{},
		caches:     map[string]*nodeCache{},
		lastHandle: map[string]*handle{},
	}
	for _, o := range opts {
		o(a)
	}
	return a
}

// nodeLock returns the mutex that serialises this process's operations for
// node.
func (a *Allocator) nodeLock(node string) *sync.Mutex {
	a.mu.Lock()
	defer a.mu.Unlock()
	m, ok := a.locks[node]
	if !ok {
		m = &sync.Mutex{}
		a.locks[node] = m
	}
	return m
}

// written reports a completed write to the fault hook.
func (a *Allocator) written(step string) error {
	if a.fault == nil {
		return nil
	}
	if err := a.fault(step); err != nil {
		return fmt.Errorf("after %s: %w", step, err)
	}
	return nil
}

// errRetry marks a lost race: the operation re-reads and tries again.
var errRetry = errors.New("ipam: lost a race, retrying")

// retry runs fn until it returns something other than errRetry, at most
// maxRetries times, with a small jittered backoff between attempts.
func (a *Allocator) retry(ctx context.Context, what string, fn func() error) error {
	var err error
	for i := range a.maxRetries {
		if err = fn(); !errors.Is(err, errRetry) {
			return err
		}
		if i == a.maxRetries-1 {
			break
		}
		// 1ms, 2ms, 4ms … capped at 50ms, each jittered to 50–150%.
		d := min(time.Millisecond<<min(i, 6), 50*time.Millisecond)
		d = d/2 + rand.N(d)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-t.C:
		}
	}
	return fmt.Errorf("%s: gave up after %d attempts: %w", what, a.maxRetries, datastore.ErrConflict)
}

// txn runs an etcd transaction and turns a failed comparison into errRetry.
func (a *Allocator) txn(ctx context.Context, cmps []datastore.Cmp, ops []datastore.Op) (int64, error) {
	rev, err := a.store.Txn(ctx, cmps, ops)
	if errors.Is(err, datastore.ErrConflict) {
		return 0, errRetry
	}
	return rev, err
}

// ---------------------------------------------------------------- reads

// resourcePrefix returns the key prefix of a kind's resources.
func resourcePrefix(kind string) (string, error) {
	info, ok := api.LookupKind(kind)
	if !ok {
		return "", fmt.Errorf("%w %q", api.ErrUnknownKind, kind)
	}
	return datastore.ResourcesPrefix + info.Plural + "/", nil
}

// listPools reads every IPPool with its revision. A pool IPAM cannot use (an
// IPv6 CIDR, say) is skipped and logged, not fatal.
func (a *Allocator) listPools(ctx context.Context) ([]poolInfo, error) {
	prefix, err := resourcePrefix(api.KindIPPool)
	if err != nil {
		return nil, err
	}
	kvs, _, err := a.store.ListKV(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("listing ip pools: %w", err)
	}
	out := make([]poolInfo, 0, len(kvs))
	for _, kv := range kvs {
		p, err := datastore.DecodeResourceAs[*api.IPPool](kv)
		if err != nil {
			a.log.Warn("skipping undecodable ip pool", "key", kv.Key, "err", err)
			continue
		}
		pi, err := newPoolInfo(p, kv.Key, kv.ModRevision)
		if err != nil {
			a.log.Warn("skipping ip pool", "pool", p.Metadata.Name, "err", err)
			continue
		}
		out = append(out, pi)
	}
	return out, nil
}

// nodeInfo is the Node resource as IPAM needs it: labels for pool node
// selectors, and the key and revision (0 = absent) to compare against.
type nodeInfo struct {
	key    string
	rev    int64
	labels map[string]string
}

func (a *Allocator) getNode(ctx context.Context, node string) (nodeInfo, error) {
	key, err := datastore.ResourceKey(api.KindNode, "", node)
	if err != nil {
		return nodeInfo{}, fmt.Errorf("node %q: %w", node, err)
	}
	kv, err := a.store.GetKV(ctx, key)
	if errors.Is(err, datastore.ErrNotFound) {
		return nodeInfo{key: key}, nil
	}
	if err != nil {
		return nodeInfo{}, fmt.Errorf("reading node %s: %w", node, err)
	}
	n, err := datastore.DecodeResourceAs[*api.Node](kv)
	if err != nil {
		return nodeInfo{}, fmt.Errorf("reading node %s: %w", node, err)
	}
	return nodeInfo{key: key, rev: kv.ModRevision, labels: n.Metadata.Labels}, nil
}

// getConfig reads IPAMConfig "default"; absent means the defaults.
func (a *Allocator) getConfig(ctx context.Context) (*api.IPAMConfig, error) {
	key, err := datastore.ResourceKey(api.KindIPAMConfig, "", api.SingletonName)
	if err != nil {
		return nil, err
	}
	kv, err := a.store.GetKV(ctx, key)
	if errors.Is(err, datastore.ErrNotFound) {
		c := &api.IPAMConfig{}
		c.SetDefaults()
		return c, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading ipam config: %w", err)
	}
	c, err := datastore.DecodeResourceAs[*api.IPAMConfig](kv)
	if err != nil {
		return nil, fmt.Errorf("reading ipam config: %w", err)
	}
	return c, nil
}

func (a *Allocator) getBlock(ctx context.Context, cidr netip.Prefix) (*block, error) {
	kv, err := a.store.GetKV(ctx, blockKey(cidr))
	if err != nil {
		return nil, fmt.Errorf("reading block %s: %w", cidr, err)
	}
	b, err := decodeBlock(kv.Value, kv.ModRevision)
	if err == nil && b.cidr != cidr {
		err = fmt.Errorf("block key %s holds cidr %s", blockKey(cidr), b.cidr)
	}
	if err != nil {
		return nil, fmt.Errorf("reading block %s: %w: %w", cidr, ErrUnreadableBlock, err)
	}
	return b, nil
}

// listBlocks reads every block. Undecodable blocks are returned as errors
// keyed by key so that Check can report them; allocation skips them.
func (a *Allocator) listBlocks(ctx context.Context) ([]*block, map[string]error, error) {
	kvs, _, err := a.store.ListKV(ctx, blocksPrefix)
	if err != nil {
		return nil, nil, fmt.Errorf("listing blocks: %w", err)
	}
	blocks, bad := decodeBlocks(kvs)
	return blocks, bad, nil
}

func decodeBlocks(kvs []datastore.KV) ([]*block, map[string]error) {
	var out []*block
	bad := map[string]error{}
	for _, kv := range kvs {
		b, err := decodeBlock(kv.Value, kv.ModRevision)
		if err == nil && blockKey(b.cidr) != kv.Key {
			err = fmt.Errorf("block key %s holds cidr %s", kv.Key, b.cidr)
		}
		if err != nil {
			bad[kv.Key] = err
			continue
		}
		out = append(out, b)
	}
	return out, bad
}

func (a *Allocator) listAffinities(ctx context.Context, prefix string) ([]affinity, error) {
	kvs, _, err := a.store.ListKV(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("listing block affinities: %w", err)
	}
	out := make([]affinity, 0, len(kvs))
	for _, kv := range kvs {
		af, err := decodeAffinity(kv.Key, kv.Value, kv.ModRevision)
		if err != nil {
			a.log.Warn("skipping undecodable affinity", "key", kv.Key, "err", err)
			continue
		}
		out = append(out, af)
	}
	return out, nil
}

// getHandle reads a handle record; nil when absent.
func (a *Allocator) getHandle(ctx context.Context, h string) (*handle, error) {
	kv, err := a.store.GetKV(ctx, handleKey(h))
	if errors.Is(err, datastore.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading handle %s: %w", h, err)
	}
	hr, err := decodeHandle(kv.Value, kv.ModRevision)
	if err != nil {
		return nil, fmt.Errorf("reading handle %s: %w", h, err)
	}
	return hr, nil
}
