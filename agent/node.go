package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// DefaultPoolName is the IPPool the agent creates from --default-ipv4-pool.
const DefaultPoolName = "default-ipv4-ippool"

// registerNode creates or updates this node's Node resource: it sets the
// BGP address and keeps everything an operator set (labels, ASN, reflector
// cluster ID).
func (a *Agent) registerNode(ctx context.Context) (*api.Node, error) {
	for attempt := 0; attempt < 20; attempt++ {
		n, err := datastore.GetAs[*api.Node](ctx, a.store, api.KindNode, "", a.cfg.NodeName)
		switch {
		case errors.Is(err, datastore.ErrNotFound):
			n := &api.Node{
				Metadata: api.ObjectMeta{
					Name:        a.cfg.NodeName,
					Labels:      map[string]string{"kubernetes.io/hostname": a.cfg.NodeName},
					Annotations: map[string]string{api.AnnotationOrigin: api.OriginAgent},
				},
				Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: prefixField(a.nodeAddr), IPv6Address: a.ipv6AddressField()}},
			}
			created, cerr := datastore.CreateAs(ctx, a.store, n)
			if errors.Is(cerr, datastore.ErrExists) {
				continue
			}
			if cerr != nil {
				return nil, fmt.Errorf("registering node %s: %w", a.cfg.NodeName, cerr)
			}
			return created, nil
		case err != nil:
			return nil, fmt.Errorf("reading node %s: %w", a.cfg.NodeName, err)
		}
		if n.Spec.BGP != nil && n.Spec.BGP.IPv4Address == prefixField(a.nodeAddr) && (!a.nodeAddr6.IsValid() || n.Spec.BGP.IPv6Address == a.ipv6AddressField()) {
			return n, nil
		}
		if n.Spec.BGP == nil {
			n.Spec.BGP = &api.NodeBGPSpec{}
		}
		// An IPv6-only node clears an IPv4 address an earlier run set.
		n.Spec.BGP.IPv4Address = prefixField(a.nodeAddr)
		if a.nodeAddr6.IsValid() {
			n.Spec.BGP.IPv6Address = a.ipv6AddressField()
		}
		updated, uerr := datastore.UpdateAs(ctx, a.store, n)
		if errors.Is(uerr, datastore.ErrConflict) {
			continue
		}
		if uerr != nil {
			return nil, fmt.Errorf("updating node %s: %w", a.cfg.NodeName, uerr)
		}
		return updated, nil
	}
	return nil, fmt.Errorf("registering node %s: too many concurrent updates", a.cfg.NodeName)
}

// ipv6AddressField is the node's IPv6 address as the Node record holds
// it, "" when it has none.
func (a *Agent) ipv6AddressField() string { return prefixField(a.nodeAddr6) }

// prefixField is p as a Node record or status holds it, "" when invalid
// (an IPv6-only node's IPv4 address).
func prefixField(p netip.Prefix) string {
	if !p.IsValid() {
		return ""
	}
	return p.String()
}

// primaryAddress is the node's address in liveness and status records:
// its IPv4 address, else its IPv6 address (an IPv6-only node).
func (a *Agent) primaryAddress() string {
	if a.nodeAddr.IsValid() {
		return a.nodeAddr.String()
	}
	return prefixField(a.nodeAddr6)
}

// DefaultPoolName6 is the IPPool the agent creates from --default-ipv6-pool.
const DefaultPoolName6 = "default-ipv6-ippool"

// ensureDefaultPool creates the default pools when configured: the IPv4
// one when no pool exists yet, the IPv6 one when no IPv6 pool exists.
func (a *Agent) ensureDefaultPool(ctx context.Context) error {
	if err := a.ensureDefaultPool4(ctx); err != nil {
		return err
	}
	if !a.cfg.DefaultPoolCIDR6.IsValid() {
		return nil
	}
	pools, _, err := datastore.ListAs[*api.IPPool](ctx, a.store, api.KindIPPool, "")
	if err != nil {
		return fmt.Errorf("listing IP pools: %w", err)
	}
	if hasPodPool(pools, true) {
		return nil
	}
	p := &api.IPPool{
		Metadata: api.ObjectMeta{Name: DefaultPoolName6},
		Spec:     api.IPPoolSpec{CIDR: a.cfg.DefaultPoolCIDR6.String()},
	}
	// Through IPAM: it refuses a default pool that overlaps an existing
	// (LoadBalancer) pool.
	if _, err := a.ipam.CreatePool(ctx, p); err != nil && !errors.Is(err, datastore.ErrExists) {
		return fmt.Errorf("creating the default IPv6 pool %s: %w", a.cfg.DefaultPoolCIDR6, err)
	}
	a.log.Info("created default IPv6 pool", "cidr", a.cfg.DefaultPoolCIDR6)
	return nil
}

func (a *Agent) ensureDefaultPool4(ctx context.Context) error {
	if !a.cfg.DefaultPoolCIDR.IsValid() {
		return nil
	}
	pools, _, err := datastore.ListAs[*api.IPPool](ctx, a.store, api.KindIPPool, "")
	if err != nil {
		return fmt.Errorf("listing IP pools: %w", err)
	}
	if hasPodPool(pools, false) {
		return nil
	}
	p := &api.IPPool{
		Metadata: api.ObjectMeta{Name: DefaultPoolName},
		Spec:     api.IPPoolSpec{CIDR: a.cfg.DefaultPoolCIDR.String(), NATOutgoing: true},
	}
	// Through IPAM: it refuses a default pool that overlaps an existing
	// (LoadBalancer) pool.
	if _, err := a.ipam.CreatePool(ctx, p); err != nil && !errors.Is(err, datastore.ErrExists) {
		return fmt.Errorf("creating the default pool %s: %w", a.cfg.DefaultPoolCIDR, err)
	}
	a.log.Info("created default IP pool", "cidr", a.cfg.DefaultPoolCIDR)
	return nil
}

// liveness is the value of status/nodes/<node>, held under the node's lease.
type liveness struct {
	Node    string    `json:"node"`
	Address string    `json:"address"`
	Started time.Time `json:"started"`
	// ReflectorReady, on an elected reflector (routeReflectorMode Auto),
	// is the election (Reflector.Since) for which it has every session
	// its role asks for Established, with End-of-RIB, to every peer node
	// whose liveness record is there (bgpOwner.reflectorReady): the
	// reflectors of its zone elected before it then send it their own
	// routes only (docs/bgp.md, "Promotion").
	ReflectorReady *time.Time `json:"reflectorReady,omitempty"`
}

func (a *Agent) publishLiveness(ctx context.Context, lease datastore.LeaseID) error {
	l := liveness{Node: a.cfg.NodeName, Address: a.primaryAddress(), Started: a.started}
	if at := a.bgp.readyReported(); !at.IsZero() {
		l.ReflectorReady = &at
	}
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	if _, err := a.store.PutKV(ctx, datastore.NodeLivenessKey(a.cfg.NodeName), b, lease); err != nil {
		return fmt.Errorf("publishing node liveness: %w", err)
	}
	return nil
}

// leaseHolder keeps the node's liveness lease, under which its liveness
// and status records live, so that they disappear with a dead agent.
type leaseHolder struct {
	store   *datastore.Store
	ttl     time.Duration
	log     *slog.Logger
	publish func(context.Context, datastore.LeaseID) error

	mu sync.Mutex
	id datastore.LeaseID
	// renewed is when etcd last granted or renewed the lease (readiness:
	// the datastore is reachable).
	renewed time.Time
}

// markRenewed records a grant or renewal answered by etcd.
func (l *leaseHolder) markRenewed() {
	l.mu.Lock()
	l.renewed = time.Now()
	l.mu.Unlock()
}

// sinceRenewed is how long ago etcd last answered for the lease.
func (l *leaseHolder) sinceRenewed() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Since(l.renewed)
}

// unreachableAfter is how long without an answer for the lease means etcd
// is unreachable: etcd's client renews every third of the TTL, so two
// renewals missed, and a second for the round trip.
func (l *leaseHolder) unreachableAfter() time.Duration { return 2*l.ttl/3 + time.Second }

// grant takes a new lease and publishes the liveness record under it.
func (l *leaseHolder) grant(ctx context.Context) error {
	id, err := l.store.GrantLease(ctx, l.ttl)
	if err != nil {
		return fmt.Errorf("granting the node's liveness lease: %w", err)
	}
	if err := l.publish(ctx, id); err != nil {
		return err
	}
	l.mu.Lock()
	l.id, l.renewed = id, time.Now()
	l.mu.Unlock()
	return nil
}

// current returns the lease in force; it changes when one was lost.
func (l *leaseHolder) current() datastore.LeaseID {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.id
}

// keep keeps the lease alive and re-grants it (re-publishing the liveness
// record) whenever it is lost, e.g. after an etcd outage.
func (l *leaseHolder) keep(ctx context.Context) {
	for {
		err := l.store.KeepAliveNotify(ctx, l.current(), l.markRenewed)
		if ctx.Err() != nil {
			return
		}
		l.log.Warn("node liveness lease lost, renewing", "err", err)
		for attempt := 0; ; attempt++ {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff(attempt)):
			}
			if l.grant(ctx) == nil {
				break
			}
		}
	}
}

// revoke ends the lease, deleting the node's liveness and status records:
// a node stopped on purpose leaves at once instead of after the TTL. It
// runs as the agent stops: ctx's values are kept, its end is not.
func (l *leaseHolder) revoke(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := l.store.RevokeLease(ctx, l.current()); err != nil {
		l.log.Warn("revoking the node's liveness lease; its records expire with it", "err", err)
	}
}

// hasPodPool reports whether a pool of the family (IPv6 when is6) may hold
// pods: a LoadBalancer pool alone does not stop the default pool from
// being created, since no pod can use it.
func hasPodPool(pools []*api.IPPool, is6 bool) bool {
	for _, p := range pools {
		if pr, err := p.Prefix(); err == nil && pr.Addr().Is6() == is6 && !p.IsLoadBalancer() {
			return true
		}
	}
	return false
}
