package ipam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"

	"github.com/tabbynet/tabby/datastore"
)

// LoadBalancer addresses. A LoadBalancer pool (allowedUses
// [LoadBalancer]) has no blocks: its addresses go one by one to Services,
// each recorded twice, in one transaction:
//
//	ipam/lb/addresses/<addr>        → the Service holding addr
//	ipam/lb/services/<ns>/<name>    → the addresses that Service holds
//
// An address key is created only if it does not exist, so no address can
// be given twice, whoever writes; the Service key is compared on its
// revision, so two writers cannot give one Service two addresses of a
// family either. See docs/ipam.md ("LoadBalancer addresses").
const (
	lbAddrsPrefix    = "ipam/lb/addresses/"
	lbServicesPrefix = "ipam/lb/services/"
)

func lbAddrKey(a netip.Addr) string { return lbAddrsPrefix + a.String() }

func lbServiceKey(s LBService) string {
	return lbServicesPrefix + url.PathEscape(s.Namespace) + "/" + url.PathEscape(s.Name)
}

// LBService names a Kubernetes Service.
type LBService struct{ Namespace, Name string }

func (s LBService) String() string { return s.Namespace + "/" + s.Name }

// LBAllocation is one LoadBalancer address and the Service holding it.
type LBAllocation struct {
	Addr    netip.Addr
	Pool    string
	Service LBService
	// UID is the Service's UID when it was assigned (informational).
	UID string
}

// lbAddrRecord is the JSON at ipam/lb/addresses/<addr>.
type lbAddrRecord struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid,omitempty"`
	Pool      string `json:"pool"`
}

// lbServiceRecord is the JSON at ipam/lb/services/<ns>/<name>.
type lbServiceRecord struct {
	Namespace string          `json:"namespace"`
	Name      string          `json:"name"`
	UID       string          `json:"uid,omitempty"`
	Addrs     []lbServiceAddr `json:"addresses"`
}

type lbServiceAddr struct {
	Addr netip.Addr `json:"addr"`
	Pool string     `json:"pool"`
}

// LBRequest asks for a Service's LoadBalancer addresses.
type LBRequest struct {
	Service LBService
	UID     string
	// Families are the address families the Service wants (4, 6), one
	// address each.
	Families []int
	// Addrs are specific addresses (spec.loadBalancerIP, the
	// tabby.io/loadBalancerIPs annotation), at most one per family; each
	// must lie in a LoadBalancer pool.
	Addrs []netip.Addr
	// Pools restricts, per family (4, 6), the pools (names or CIDRs) for
	// a family without a specific address; none for a family: every
	// enabled LoadBalancer pool of it.
	Pools map[int][]string
	// Prefer are addresses to take if they are free and allowed (the
	// Service's current status, re-recorded after a restart).
	Prefer []netip.Addr
}

// LBTakenError: a requested address is held by another Service.
type LBTakenError struct {
	Addr   netip.Addr
	Holder LBService
}

func (e *LBTakenError) Error() string {
	return fmt.Sprintf("ipam: address %s is already assigned to Service %s", e.Addr, e.Holder)
}

// Is makes errors.Is(err, ErrInUse) hold.
func (e *LBTakenError) Is(target error) bool { return target == ErrInUse }

// LBExhaustedError: no free address of a family is left in the pools a
// Service may use.
type LBExhaustedError struct {
	Family int
	Pools  []string
	InUse  int
}

func (e *LBExhaustedError) Error() string {
	return fmt.Sprintf("ipam: LoadBalancer pools [%s] have no free IPv%d address (%d in use)", strings.Join(e.Pools, " "), e.Family, e.InUse)
}

// Is makes errors.Is(err, ErrExhausted) hold.
func (e *LBExhaustedError) Is(target error) bool { return target == ErrExhausted }

// AssignLB makes the Service hold one address of each requested family and
// nothing else, and returns what it holds, in the order of req.Families.
// It is idempotent: an address it already holds that still fits the
// request is kept; one that does not (another family, pool or specific
// address asked for now) is released in the same transaction that takes
// the new one. On error nothing changes. Safe for concurrent use by
// several processes (compare-and-swap on every key it read).
func (a *Allocator) AssignLB(ctx context.Context, req LBRequest) ([]LBAllocation, error) {
	var out []LBAllocation
	err := a.retry(ctx, "ipam: assigning LoadBalancer addresses for "+req.Service.String(), func() error {
		var err error
		out, err = a.assignLBOnce(ctx, req)
		return err
	})
	return out, err
}

// lbState is what one AssignLB attempt read.
type lbState struct {
	pools   []poolInfo // LoadBalancer pools only
	all     []poolInfo
	cur     lbServiceRecord
	curRev  int64
	used    map[netip.Addr]lbAddrRecord
	usedRev map[netip.Addr]int64
}

func (a *Allocator) loadLBState(ctx context.Context, svc LBService) (*lbState, error) {
	all, err := a.listPools(ctx)
	if err != nil {
		return nil, err
	}
	st := &lbState{all: all, used: map[netip.Addr]lbAddrRecord{}, usedRev: map[netip.Addr]int64{}}
	for _, p := range all {
		if p.pool.IsLoadBalancer() {
			st.pools = append(st.pools, p)
		}
	}
	slices.SortFunc(st.pools, func(x, y poolInfo) int { return strings.Compare(x.name, y.name) })
	kv, err := a.store.GetKV(ctx, lbServiceKey(svc))
	switch {
	case err == nil:
		if err := json.Unmarshal(kv.Value, &st.cur); err != nil {
			return nil, fmt.Errorf("ipam: decoding %s: %w", kv.Key, err)
		}
		st.curRev = kv.ModRevision
	case !errors.Is(err, datastore.ErrNotFound):
		return nil, err
	}
	kvs, _, err := a.store.ListKV(ctx, lbAddrsPrefix)
	if err != nil {
		return nil, fmt.Errorf("ipam: listing LoadBalancer addresses: %w", err)
	}
	for _, kv := range kvs {
		addr, err := netip.ParseAddr(strings.TrimPrefix(kv.Key, lbAddrsPrefix))
		var r lbAddrRecord
		if err == nil {
			err = json.Unmarshal(kv.Value, &r)
		}
		if err != nil {
			// Keep it taken: an address nobody can read is not free.
			a.log.Warn("LoadBalancer address record does not decode", "key", kv.Key, "err", err)
			r = lbAddrRecord{Namespace: "?", Name: kv.Key}
			if addr, err = netip.ParseAddr(strings.TrimPrefix(kv.Key, lbAddrsPrefix)); err != nil {
				continue
			}
		}
		st.used[addr], st.usedRev[addr] = r, kv.ModRevision
	}
	return st, nil
}

// holder returns who holds addr, if anyone.
func (st *lbState) holder(addr netip.Addr) (LBService, bool) {
	r, ok := st.used[addr]
	return LBService{r.Namespace, r.Name}, ok
}

// LBNoPoolError: no pool may give a family's address (none of that
// family, all disabled, a requested pool missing or not a LoadBalancer
// pool).
type LBNoPoolError struct {
	Family int
	Reason string
}

func (e *LBNoPoolError) Error() string { return "ipam: " + e.Reason + ": " + ErrNoPool.Error() }

// Is makes errors.Is(err, ErrNoPool) hold.
func (e *LBNoPoolError) Is(target error) bool { return target == ErrNoPool }

// allowed returns the enabled LoadBalancer pools of family that the
// request may allocate from, or a *LBNoPoolError naming why there are
// none.
func (st *lbState) allowed(family int, requested []string, withDisabled bool) ([]poolInfo, error) {
	noPool := func(format string, args ...any) error {
		return &LBNoPoolError{Family: family, Reason: fmt.Sprintf(format, args...)}
	}
	for _, r := range requested {
		i := slices.IndexFunc(st.all, func(p poolInfo) bool { return p.isNamed(r) })
		switch {
		case i < 0:
			return nil, noPool("requested pool %q does not exist (no IP pool has that name or CIDR)", r)
		case !st.all[i].pool.IsLoadBalancer():
			return nil, noPool("requested pool %q is not a LoadBalancer pool (allowedUses %v)", r, st.all[i].pool.Uses())
		case st.all[i].family() != family:
			return nil, noPool("requested pool %q is an IPv%d pool, asked for an IPv%d address", r, st.all[i].family(), family)
		}
	}
	var out []poolInfo
	for _, p := range st.pools {
		if p.family() != family || (p.pool.Spec.Disabled && !withDisabled) || (len(requested) > 0 && !slices.ContainsFunc(requested, p.isNamed)) {
			continue
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		if len(requested) > 0 {
			return nil, noPool("none of the requested pools %v is an enabled IPv%d LoadBalancer pool", requested, family)
		}
		return nil, noPool("no enabled IPv%d LoadBalancer pool (a pool with allowedUses [LoadBalancer])", family)
	}
	return out, nil
}

// specific checks a requested address: inside an enabled LoadBalancer
// pool and free (or the Service's own).
func (st *lbState) specific(svc LBService, addr netip.Addr) (poolInfo, error) {
	p, ok := poolFor(st.all, hostPrefix(addr))
	switch {
	case !ok:
		var names []string
		for _, p := range st.pools {
			names = append(names, p.prefix.String())
		}
		return poolInfo{}, fmt.Errorf("ipam: address %s is outside every LoadBalancer pool [%s]: %w", addr, strings.Join(names, " "), ErrNotInPool)
	case !p.pool.IsLoadBalancer():
		return poolInfo{}, fmt.Errorf("ipam: address %s is in pool %s, which is not a LoadBalancer pool (allowedUses %v): %w", addr, p.name, p.pool.Uses(), ErrNotInPool)
	}
	if h, taken := st.holder(addr); taken && h != svc {
		return poolInfo{}, &LBTakenError{Addr: addr, Holder: h}
	}
	if p.pool.Spec.Disabled && !st.holds(addr) {
		return poolInfo{}, fmt.Errorf("ipam: address %s is in pool %s, which is disabled: %w", addr, p.name, ErrNotInPool)
	}
	return p, nil
}

// holds reports whether the Service's record has addr and the address
// record agrees.
func (st *lbState) holds(addr netip.Addr) bool {
	h, ok := st.holder(addr)
	return ok && h == LBService{st.cur.Namespace, st.cur.Name} && slices.ContainsFunc(st.cur.Addrs, func(x lbServiceAddr) bool { return x.Addr == addr })
}

// firstFree returns the lowest free address of the pools, in their order.
func (st *lbState) firstFree(pools []poolInfo, skip []netip.Addr) (netip.Addr, poolInfo, bool) {
	for _, p := range pools {
		for addr := p.prefix.Addr(); addr.IsValid() && p.prefix.Contains(addr); addr = addr.Next() {
			if _, taken := st.used[addr]; !taken && !slices.Contains(skip, addr) {
				return addr, p, true
			}
		}
	}
	return netip.Addr{}, poolInfo{}, false
}

func (a *Allocator) assignLBOnce(ctx context.Context, req LBRequest) ([]LBAllocation, error) {
	st, err := a.loadLBState(ctx, req.Service)
	if err != nil {
		return nil, err
	}
	st.cur.Namespace, st.cur.Name = req.Service.Namespace, req.Service.Name
	want, err := st.choose(req)
	if err != nil {
		return nil, err
	}
	var cmps []datastore.Cmp
	var ops []datastore.Op
	rec := lbServiceRecord{Namespace: req.Service.Namespace, Name: req.Service.Name, UID: req.UID}
	poolsCompared := map[string]bool{}
	for _, w := range want {
		rec.Addrs = append(rec.Addrs, lbServiceAddr{Addr: w.Addr, Pool: w.Pool})
		if st.holds(w.Addr) {
			continue
		}
		// New to this Service: the address key must not exist (or still be
		// the Service's own leftover), and the pool must be unchanged, so
		// that a pool being deleted or disabled gives nothing out.
		cmps = append(cmps, datastore.Cmp{Key: lbAddrKey(w.Addr), ModRevision: st.usedRev[w.Addr]})
		val, _ := json.Marshal(lbAddrRecord{Namespace: req.Service.Namespace, Name: req.Service.Name, UID: req.UID, Pool: w.Pool})
		ops = append(ops, datastore.Op{Key: lbAddrKey(w.Addr), Value: val})
		if p, ok := poolFor(st.all, hostPrefix(w.Addr)); ok && !poolsCompared[p.name] {
			poolsCompared[p.name] = true
			cmps = append(cmps, datastore.Cmp{Key: p.key, ModRevision: p.rev})
		}
	}
	for _, old := range st.cur.Addrs {
		if slices.ContainsFunc(want, func(w LBAllocation) bool { return w.Addr == old.Addr }) || !st.holds(old.Addr) {
			continue
		}
		cmps = append(cmps, datastore.Cmp{Key: lbAddrKey(old.Addr), ModRevision: st.usedRev[old.Addr]})
		ops = append(ops, datastore.Op{Key: lbAddrKey(old.Addr), Delete: true})
	}
	if len(ops) == 0 && st.curRev != 0 && st.cur.UID == req.UID && slices.Equal(st.cur.Addrs, rec.Addrs) {
		return want, nil
	}
	val, _ := json.Marshal(rec)
	cmps = append(cmps, datastore.Cmp{Key: lbServiceKey(req.Service), ModRevision: st.curRev})
	ops = append(ops, datastore.Op{Key: lbServiceKey(req.Service), Value: val})
	if _, err := a.txn(ctx, cmps, ops); err != nil {
		return nil, err
	}
	return want, a.written("assign-lb")
}

// choose picks the Service's address of each family.
func (st *lbState) choose(req LBRequest) ([]LBAllocation, error) {
	specific := map[int]netip.Addr{}
	for _, addr := range req.Addrs {
		f := familyOf(addr)
		if !slices.Contains(req.Families, f) {
			return nil, fmt.Errorf("ipam: address %s is IPv%d, but the Service asks for %s: %w", addr, f, familiesString(req.Families), ErrNotInPool)
		}
		if prev, dup := specific[f]; dup && prev != addr {
			return nil, fmt.Errorf("ipam: two IPv%d addresses requested (%s and %s); a Service gets one per family", f, prev, addr)
		}
		specific[f] = addr
	}
	var want []LBAllocation
	var taken []netip.Addr
	for _, f := range req.Families {
		pick := func(addr netip.Addr, p poolInfo) {
			want = append(want, LBAllocation{Addr: addr, Pool: p.name, Service: req.Service, UID: req.UID})
			taken = append(taken, addr)
		}
		if addr, ok := specific[f]; ok {
			p, err := st.specific(req.Service, addr)
			if err != nil {
				return nil, err
			}
			pick(addr, p)
			continue
		}
		// Keep what the Service holds (also in a pool disabled since),
		// else take what it shows, else the first free address.
		if p, ok := st.keep(f, req, taken); ok {
			pick(p.Addr, poolInfo{name: p.Pool})
			continue
		}
		pools, err := st.allowed(f, req.Pools[f], false)
		if err != nil {
			return nil, err
		}
		addr, p, ok := st.firstFree(pools, taken)
		if !ok {
			n := 0
			for a := range st.used {
				if slices.ContainsFunc(pools, func(p poolInfo) bool { return p.prefix.Contains(a) }) {
					n++
				}
			}
			return nil, &LBExhaustedError{Family: f, Pools: poolNames(pools), InUse: n}
		}
		pick(addr, p)
	}
	return want, nil
}

// keep returns the address of family the Service should keep: one it
// holds, in a pool it may use (enabled or not), else one of req.Prefer
// that is free, in an enabled pool it may use.
func (st *lbState) keep(family int, req LBRequest, taken []netip.Addr) (LBAllocation, bool) {
	try := func(c netip.Addr, withDisabled bool) (LBAllocation, bool) {
		if familyOf(c) != family || slices.Contains(taken, c) {
			return LBAllocation{}, false
		}
		if h, used := st.holder(c); used && h != req.Service {
			return LBAllocation{}, false
		}
		pools, err := st.allowed(family, req.Pools[family], withDisabled)
		if err != nil {
			return LBAllocation{}, false
		}
		i := slices.IndexFunc(pools, func(p poolInfo) bool { return p.prefix.Contains(c) })
		if i < 0 {
			return LBAllocation{}, false
		}
		return LBAllocation{Addr: c, Pool: pools[i].name}, true
	}
	for _, x := range st.cur.Addrs {
		if st.holds(x.Addr) {
			if a, ok := try(x.Addr, true); ok {
				return a, true
			}
		}
	}
	for _, c := range req.Prefer {
		if a, ok := try(c, false); ok {
			return a, true
		}
	}
	return LBAllocation{}, false
}

func familiesString(fs []int) string {
	var s []string
	for _, f := range fs {
		s = append(s, fmt.Sprintf("IPv%d", f))
	}
	return strings.Join(s, " and ")
}

// LBHeld returns the LoadBalancer addresses the Service's record holds
// (one etcd read).
func (a *Allocator) LBHeld(ctx context.Context, svc LBService) ([]LBAllocation, error) {
	kv, err := a.store.GetKV(ctx, lbServiceKey(svc))
	if errors.Is(err, datastore.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r lbServiceRecord
	if err := json.Unmarshal(kv.Value, &r); err != nil {
		return nil, fmt.Errorf("ipam: decoding %s: %w", kv.Key, err)
	}
	out := make([]LBAllocation, 0, len(r.Addrs))
	for _, x := range r.Addrs {
		out = append(out, LBAllocation{Addr: x.Addr, Pool: x.Pool, Service: svc, UID: r.UID})
	}
	return out, nil
}

// ReleaseLB releases every LoadBalancer address the Service holds.
// Idempotent: a Service holding nothing is success (one etcd read).
func (a *Allocator) ReleaseLB(ctx context.Context, svc LBService) error {
	return a.retry(ctx, "ipam: releasing LoadBalancer addresses of "+svc.String(), func() error {
		if _, err := a.store.GetKV(ctx, lbServiceKey(svc)); errors.Is(err, datastore.ErrNotFound) {
			return nil
		}
		st, err := a.loadLBState(ctx, svc)
		if err != nil {
			return err
		}
		if st.curRev == 0 {
			return nil
		}
		cmps := []datastore.Cmp{{Key: lbServiceKey(svc), ModRevision: st.curRev}}
		ops := []datastore.Op{{Key: lbServiceKey(svc), Delete: true}}
		for _, x := range st.cur.Addrs {
			if h, ok := st.holder(x.Addr); ok && h == svc {
				cmps = append(cmps, datastore.Cmp{Key: lbAddrKey(x.Addr), ModRevision: st.usedRev[x.Addr]})
				ops = append(ops, datastore.Op{Key: lbAddrKey(x.Addr), Delete: true})
			}
		}
		if _, err := a.txn(ctx, cmps, ops); err != nil {
			return err
		}
		return a.written("release-lb")
	})
}

// LBAllocations returns every LoadBalancer address with the Service
// holding it, sorted by address.
func (a *Allocator) LBAllocations(ctx context.Context) ([]LBAllocation, error) {
	kvs, _, err := a.store.ListKV(ctx, lbAddrsPrefix)
	if err != nil {
		return nil, fmt.Errorf("ipam: listing LoadBalancer addresses: %w", err)
	}
	out := make([]LBAllocation, 0, len(kvs))
	for _, kv := range kvs {
		x, err := decodeLBAddr(kv)
		if err != nil {
			a.log.Warn("LoadBalancer address record does not decode", "key", kv.Key, "err", err)
			continue
		}
		out = append(out, x)
	}
	slices.SortFunc(out, func(x, y LBAllocation) int { return x.Addr.Compare(y.Addr) })
	return out, nil
}

// decodeLBAddr decodes an ipam/lb/addresses/<addr> record.
func decodeLBAddr(kv datastore.KV) (LBAllocation, error) {
	addr, err := netip.ParseAddr(strings.TrimPrefix(kv.Key, lbAddrsPrefix))
	if err != nil {
		return LBAllocation{}, fmt.Errorf("LoadBalancer address key %s: %w", kv.Key, err)
	}
	var r lbAddrRecord
	if err := json.Unmarshal(kv.Value, &r); err != nil {
		return LBAllocation{}, fmt.Errorf("decoding %s: %w", kv.Key, err)
	}
	return LBAllocation{Addr: addr, Pool: r.Pool, Service: LBService{r.Namespace, r.Name}, UID: r.UID}, nil
}

// LBServices returns the Services that hold LoadBalancer addresses, by the
// Service records.
func (a *Allocator) LBServices(ctx context.Context) ([]LBService, error) {
	kvs, _, err := a.store.ListKV(ctx, lbServicesPrefix)
	if err != nil {
		return nil, fmt.Errorf("ipam: listing LoadBalancer Services: %w", err)
	}
	out := make([]LBService, 0, len(kvs))
	for _, kv := range kvs {
		var r lbServiceRecord
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			a.log.Warn("LoadBalancer Service record does not decode", "key", kv.Key, "err", err)
			continue
		}
		out = append(out, LBService{r.Namespace, r.Name})
	}
	return out, nil
}

// lbInUse counts the LoadBalancer addresses inside prefix.
func (a *Allocator) lbInUse(ctx context.Context, prefix netip.Prefix) (int, error) {
	all, err := a.LBAllocations(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, x := range all {
		if prefix.Contains(x.Addr) {
			n++
		}
	}
	return n, nil
}

// checkLB cross-checks LoadBalancer IPAM for Check: no pod block in a
// LoadBalancer pool, every LoadBalancer address in one, and the address
// and Service records naming each other.
func checkLB(s *snapshot, add func(kind, key, format string, args ...any)) {
	for _, b := range s.blocks {
		if p, ok := poolFor(s.pools, b.cidr); ok && p.pool.IsLoadBalancer() {
			add(BlockInLoadBalancerPool, blockName(b.cidr), "block %s lies in LoadBalancer pool %s: pods must not use it", b.cidr, p.name)
		}
	}
	listed := map[netip.Addr]LBService{}
	for _, r := range s.lbServices {
		svc := LBService{r.Namespace, r.Name}
		for _, x := range r.Addrs {
			listed[x.Addr] = svc
		}
	}
	held := map[netip.Addr]LBService{}
	for _, x := range s.lb {
		held[x.Addr] = x.Service
		key := lbAddrKey(x.Addr)
		if p, ok := poolFor(s.pools, hostPrefix(x.Addr)); !ok || !p.pool.IsLoadBalancer() {
			add(LBAddressOutsidePools, key, "LoadBalancer address %s (Service %s) lies in no LoadBalancer pool", x.Addr, x.Service)
		}
		if svc, ok := listed[x.Addr]; !ok || svc != x.Service {
			add(LBRecordMismatch, key, "address %s is recorded for Service %s, whose record does not list it", x.Addr, x.Service)
		}
	}
	for addr, svc := range listed {
		if h, ok := held[addr]; !ok || h != svc {
			add(LBRecordMismatch, lbServiceKey(svc), "Service %s lists address %s, which is not recorded for it", svc, addr)
		}
	}
}
