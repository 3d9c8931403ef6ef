package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/syncer"
)

// simNode is one simulated node of the scale harness: no namespace, no
// agent, no kernel, but a real etcd client of its own (its Node record, a
// liveness record under a lease, its blocks and affinities through the real
// IPAM code, its WorkloadEndpoints) and a real iBGP session with every
// route reflector, on which it advertises its blocks.
type simNode struct {
	name string
	addr netip.Addr
	// zone is the node's zone label ("" without zones); rrs are the
	// reflectors it peers with, its zone's (simRun.zoneRRs).
	zone  string
	rrs   []netip.Addr
	store *datastore.Store
	alloc *ipam.Allocator

	mu       sync.Mutex
	sessions map[netip.Addr]*bgp.SimSession // by reflector address
	blocks   map[netip.Prefix]bool
	eps      []simEndpoint // live endpoints, oldest first
	seq      int
	watchEnd context.CancelFunc
	// onUpdate, when set (the observer), receives the prefixes each
	// reflector sends it.
	onUpdate func(rr netip.Addr, prefixes []netip.Prefix)
	// lastRev is the revision of the latest endpoint it created.
	lastRev int64
	// drops, when set, logs and counts the node's sessions that end.
	drops *simDrops
	// simBlocks, when set, holds every simulated node's blocks: its
	// sessions count those they hold (waitQuiet).
	simBlocks *blockSet
}

// blockSet is a set of blocks safe for concurrent use.
type blockSet struct {
	mu sync.RWMutex
	m  map[netip.Prefix]bool
}

func (b *blockSet) add(p netip.Prefix) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[netip.Prefix]bool{}
	}
	b.m[p] = true
}

func (b *blockSet) has(p netip.Prefix) bool {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.m[p]
}

// list returns the blocks.
func (b *blockSet) list() []netip.Prefix {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return slices.Collect(maps.Keys(b.m))
}

func (b *blockSet) len() int {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return len(b.m)
}

type simEndpoint struct {
	name, handle string
	addr         netip.Addr
	labels       map[string]string
}

// simNamespace is the Kubernetes namespace of the simulated endpoints (the
// real pods' too, so that NetworkPolicy pod selectors reach both).
const simNamespace = "default"

// simSubnet holds the simulated nodes' addresses (lab/simnet.go).
var simSubnet = netip.MustParsePrefix("198.18.4.0/22")

// simAddr is the address of simulated node i (1-based).
func simAddr(i int) netip.Addr {
	a := simSubnet.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) + uint32(i)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func newSimNode(i int) *simNode {
	return &simNode{name: fmt.Sprintf("sim%d", i), addr: simAddr(i), sessions: map[netip.Addr]*bgp.SimSession{}, blocks: map[netip.Prefix]bool{}}
}

// Timeouts of a simulated node's etcd client: growing a lab by hundreds
// of nodes at once queues their first requests behind each other's (and
// the reflectors' reactions to each new Node) on a loaded 2-core host, where
// the product's 5 s defaults expired at 300 → 1,000 (docs/scale.md, Status).
// A simulated node is load, not the product: it waits longer and retries.
const (
	simEtcdTimeout    = 30 * time.Second
	simConnectTries   = 4
	simConnectBackoff = 2 * time.Second
)

// connect opens the node's own etcd client from inside the sim namespace,
// from the node's own address, and writes its Node record and liveness
// (under a lease kept alive until ctx ends), retrying a failed step.
func (n *simNode) connect(ctx context.Context, simNS string, endpoints []string) error {
	var err error
	for try := range simConnectTries {
		if try > 0 {
			sleepCtx(ctx, time.Duration(try)*simConnectBackoff)
		}
		if err = n.connectOnce(ctx, simNS, endpoints); err == nil || ctx.Err() != nil {
			break
		}
	}
	return err
}

func (n *simNode) connectOnce(ctx context.Context, simNS string, endpoints []string) error {
	local := &net.TCPAddr{IP: n.addr.AsSlice()}
	if n.store == nil {
		s, err := datastore.New(ctx, datastore.Config{Endpoints: endpoints, DialTimeout: simEtcdTimeout, RequestTimeout: simEtcdTimeout,
			Dialer: func(ctx context.Context, addr string) (net.Conn, error) {
				var c net.Conn
				err := inNetNS(simNS, func() (err error) {
					d := net.Dialer{LocalAddr: local}
					c, err = d.DialContext(ctx, "tcp", addr)
					return err
				})
				return c, err
			}})
		if err != nil {
			return fmt.Errorf("%s: %w", n.name, err)
		}
		n.store, n.alloc = s, ipam.New(s)
	}
	s := n.store
	labels := map[string]string{"tabby.io/simulated": "true"}
	if n.zone != "" {
		labels[api.DefaultZoneLabel] = n.zone
	}
	node := &api.Node{Metadata: api.ObjectMeta{Name: n.name, Labels: labels},
		Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: netip.PrefixFrom(n.addr, simSubnet.Bits()).String()}}}
	if _, err := s.Apply(ctx, node); err != nil {
		return fmt.Errorf("%s: writing node: %w", n.name, err)
	}
	lease, err := s.GrantLease(ctx, 30*time.Second)
	if err != nil {
		return fmt.Errorf("%s: lease: %w", n.name, err)
	}
	b, _ := json.Marshal(map[string]any{"node": n.name, "address": n.addr.String(), "started": time.Now()})
	if _, err := s.PutKV(ctx, datastore.NodeLivenessKey(n.name), b, lease); err != nil {
		return fmt.Errorf("%s: liveness: %w", n.name, err)
	}
	go func() { _ = s.KeepAlive(ctx, lease) }()
	return nil
}

// attach runs a session with a reflector until it ends,
// announcing the node's blocks once it is established.
func (n *simNode) attach(ctx context.Context, conn net.Conn, peer netip.Addr) {
	cfg := bgp.SimConfig{ASN: api.DefaultASNumber, RouterID: n.addr}
	if n.simBlocks != nil {
		cfg.Track = n.simBlocks.has
	}
	if n.onUpdate != nil {
		cfg.OnUpdate = func(ps []netip.Prefix) { n.onUpdate(peer, ps) }
	}
	s := bgp.NewSimSession(conn, cfg)
	go func() {
		select {
		case <-s.Established():
		case <-ctx.Done():
			return
		}
		n.mu.Lock()
		n.sessions[peer] = s
		blocks := keysOf(n.blocks)
		n.mu.Unlock()
		_ = s.Announce(blocks)
	}()
	if err := s.Run(ctx); ctx.Err() == nil && n.drops != nil {
		n.drops.record(n.name, peer, err)
	}
	n.mu.Lock()
	if n.sessions[peer] == s {
		delete(n.sessions, peer)
	}
	n.mu.Unlock()
}

func keysOf(m map[netip.Prefix]bool) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// updates is how many UPDATEs the node's current sessions have received.
func (n *simNode) updates() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	var sum uint64
	for _, s := range n.sessions {
		sum += s.Updates()
	}
	return sum
}

// missing is how many of the cluster's simulated blocks (all) node n's
// established sessions lack, summed, and how many sessions lack any: a
// reflector sends a client every block but the client's own (a session
// counts only simulated blocks, simBlocks).
func (n *simNode) missing(all int) (prefixes, sessions int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	want := all - len(n.blocks)
	for _, s := range n.sessions {
		if d := want - s.Held(); d > 0 {
			prefixes += d
			sessions++
		}
	}
	return prefixes, sessions
}

// lacking describes, up to max, node n's sessions that lack a block of all
// other than n's own: "sim12 ← 198.18.0.11 lacks 10.244.3.0/26".
func (n *simNode) lacking(all []netip.Prefix, max int) []string {
	n.mu.Lock()
	want := slices.DeleteFunc(slices.Clone(all), func(p netip.Prefix) bool { return n.blocks[p] })
	rrs := slices.SortedFunc(maps.Keys(n.sessions), netip.Addr.Compare)
	sessions := map[netip.Addr]*bgp.SimSession{}
	for _, rr := range rrs {
		sessions[rr] = n.sessions[rr]
	}
	n.mu.Unlock()
	var out []string
	for _, rr := range rrs {
		if len(out) == max {
			break
		}
		if miss := sessions[rr].Lacks(want, 3); len(miss) > 0 {
			out = append(out, fmt.Sprintf("%s ← %s lacks %v", n.name, rr, miss))
		}
	}
	return out
}

// unstable calls fn for each of node n's reflectors whose session
// is not yet stable at now: none (down), established less than minUp ago
// (young), or nothing from the reflector since it was established (mute:
// a reflector sends its table, at least the real nodes' blocks, or a
// KEEPALIVE within a third of the hold time).
func (n *simNode) unstable(now time.Time, minUp time.Duration, fn func(rr netip.Addr, why string)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, rr := range n.rrs {
		s := n.sessions[rr]
		switch {
		case s == nil:
			fn(rr, "down")
		case now.Sub(s.EstablishedAt()) < minUp:
			fn(rr, "young")
		case s.ReceivedSinceEstablished() == 0:
			fn(rr, "mute")
		}
	}
}

// established is how many reflector sessions are up.
func (n *simNode) established() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.sessions)
}

// addEndpoint does what an agent does for a pod ADD, minus the kernel: an
// address from IPAM (claiming a block when needed, then advertising it on
// every session) and the WorkloadEndpoint. It returns the address's block
// and when this call advertised it (zero when it was announced already).
func (n *simNode) addEndpoint(ctx context.Context, labels map[string]string) (block netip.Prefix, advertised time.Time, err error) {
	n.mu.Lock()
	n.seq++
	seq := n.seq
	n.mu.Unlock()
	ep := simEndpoint{name: fmt.Sprintf("%s-p%d", n.name, seq), labels: labels}
	ep.handle = "k8s-pod-network." + ep.name
	a, err := n.alloc.Assign(ctx, ipam.AssignRequest{Node: n.name, Handle: ep.handle})
	if err != nil {
		return netip.Prefix{}, time.Time{}, fmt.Errorf("%s: assigning: %w", n.name, err)
	}
	ep.addr = a.Addr
	if !a.Borrowed {
		advertised = n.advertise(a.Block)
	}
	w, err := n.store.Create(ctx, n.endpoint(ep))
	if err != nil {
		return a.Block, advertised, fmt.Errorf("%s: writing endpoint: %w", n.name, err)
	}
	rev, _ := strconv.ParseInt(w.GetMeta().ResourceVersion, 10, 64)
	n.mu.Lock()
	n.lastRev = max(n.lastRev, rev)
	n.eps = append(n.eps, ep)
	n.mu.Unlock()
	return a.Block, advertised, nil
}

// advertise announces block on every session unless it is announced, and
// returns when it did (zero when the block was announced already).
func (n *simNode) advertise(block netip.Prefix) time.Time {
	n.mu.Lock()
	if n.blocks[block] {
		n.mu.Unlock()
		return time.Time{}
	}
	n.blocks[block] = true
	if n.simBlocks != nil {
		n.simBlocks.add(block) // before any session announces it
	}
	var ss []*bgp.SimSession
	for _, s := range n.sessions {
		ss = append(ss, s)
	}
	n.mu.Unlock()
	at := time.Now()
	for _, s := range ss {
		_ = s.Announce([]netip.Prefix{block})
	}
	return at
}

func (n *simNode) endpoint(ep simEndpoint) *api.WorkloadEndpoint {
	w := &api.WorkloadEndpoint{
		Metadata: api.ObjectMeta{Name: ep.name, Namespace: simNamespace, Labels: ep.labels},
		Spec: api.WorkloadEndpointSpec{Node: n.name, Orchestrator: "k8s", Pod: ep.name, ContainerID: ep.name, Endpoint: "eth0",
			InterfaceName: "cali" + fmt.Sprintf("%011x", uint64(ep.addr.As4()[2])<<8|uint64(ep.addr.As4()[3])|uint64(len(n.name))<<32),
			IPNetworks:    []string{netip.PrefixFrom(ep.addr, 32).String()}, IPAMHandle: ep.handle},
	}
	w.SetDefaults()
	return w
}

// deleteOldest does what an agent does for a pod DEL of its oldest pod:
// the endpoint goes, then its address.
func (n *simNode) deleteOldest(ctx context.Context) error {
	n.mu.Lock()
	if len(n.eps) == 0 {
		n.mu.Unlock()
		return nil
	}
	ep := n.eps[0]
	n.eps = n.eps[1:]
	n.mu.Unlock()
	if err := n.store.Delete(ctx, api.KindWorkloadEndpoint, simNamespace, ep.name, ""); err != nil {
		return fmt.Errorf("%s: deleting endpoint: %w", n.name, err)
	}
	if err := n.alloc.ReleaseHandle(ctx, ep.handle); err != nil {
		return fmt.Errorf("%s: releasing: %w", n.name, err)
	}
	return nil
}

// relabel sets one label of the node's first endpoint and returns its
// address.
func (n *simNode) relabel(ctx context.Context, key, value string) (netip.Addr, error) {
	n.mu.Lock()
	if len(n.eps) == 0 {
		n.mu.Unlock()
		return netip.Addr{}, fmt.Errorf("%s has no endpoint", n.name)
	}
	ep := &n.eps[0]
	addr := ep.addr
	labels := map[string]string{}
	for k, v := range ep.labels {
		labels[k] = v
	}
	labels[key] = value
	ep.labels = labels
	w := n.endpoint(*ep)
	n.mu.Unlock()
	if _, err := n.store.Apply(ctx, w); err != nil {
		return netip.Addr{}, fmt.Errorf("%s: relabelling: %w", n.name, err)
	}
	return addr, nil
}

// watch holds the watch an agent's view holds after its initial list
// (syncer.WatchSpec: the prefix without the IPAM blocks), from revision rev
// on, and drops what it receives (etcd's fan-out is what it is for);
// stopWatch ends it.
func (n *simNode) watch(ctx context.Context, rev int64) {
	ctx, cancel := context.WithCancel(ctx)
	n.mu.Lock()
	n.watchEnd = cancel
	n.mu.Unlock()
	ch := n.store.WatchKeys(ctx, syncer.WatchSpec(), rev)
	go func() {
		for range ch {
		}
	}()
}

func (n *simNode) stopWatch() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.watchEnd != nil {
		n.watchEnd()
		n.watchEnd = nil
	}
}

func (n *simNode) close() error {
	n.stopWatch()
	if n.store == nil {
		return nil
	}
	return n.store.Close()
}
