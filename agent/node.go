package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
		obj, err := a.store.Get(ctx, api.KindNode, "", a.cfg.NodeName)
		switch {
		case errors.Is(err, datastore.ErrNotFound):
			n := &api.Node{
				Metadata: api.ObjectMeta{
					Name:   a.cfg.NodeName,
					Labels: map[string]string{"kubernetes.io/hostname": a.cfg.NodeName},
				},
				Spec: api.NodeSpec{BGP: &api.NodeBGPSpec{IPv4Address: a.nodeAddr.String()}},
			}
			created, cerr := a.store.Create(ctx, n)
			if errors.Is(cerr, datastore.ErrExists) {
				continue
			}
			if cerr != nil {
				return nil, fmt.Errorf("registering node %s: %w", a.cfg.NodeName, cerr)
			}
			return created.(*api.Node), nil
		case err != nil:
			return nil, fmt.Errorf("reading node %s: %w", a.cfg.NodeName, err)
		}
		n := obj.(*api.Node)
		if n.Spec.BGP != nil && n.Spec.BGP.IPv4Address == a.nodeAddr.String() {
			return n, nil
		}
		if n.Spec.BGP == nil {
			n.Spec.BGP = &api.NodeBGPSpec{}
		}
		n.Spec.BGP.IPv4Address = a.nodeAddr.String()
		updated, uerr := a.store.Update(ctx, n)
		if errors.Is(uerr, datastore.ErrConflict) {
			continue
		}
		if uerr != nil {
			return nil, fmt.Errorf("updating node %s: %w", a.cfg.NodeName, uerr)
		}
		return updated.(*api.Node), nil
	}
	return nil, fmt.Errorf("registering node %s: too many concurrent updates", a.cfg.NodeName)
}

// ensureDefaultPool creates the default pool when configured and no pool
// exists yet.
func (a *Agent) ensureDefaultPool(ctx context.Context) error {
	if a.cfg.DefaultPoolCIDR == "" {
		return nil
	}
	pools, _, err := a.store.List(ctx, api.KindIPPool, "")
	if err != nil {
		return fmt.Errorf("listing IP pools: %w", err)
	}
	if len(pools) > 0 {
		return nil
	}
	p := &api.IPPool{
		Metadata: api.ObjectMeta{Name: DefaultPoolName},
		Spec:     api.IPPoolSpec{CIDR: a.cfg.DefaultPoolCIDR, NATOutgoing: true},
	}
	if _, err := a.store.Create(ctx, p); err != nil && !errors.Is(err, datastore.ErrExists) {
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
}

func (a *Agent) publishLiveness(ctx context.Context, lease datastore.LeaseID) error {
	b, err := json.Marshal(liveness{Node: a.cfg.NodeName, Address: a.nodeAddr.String(), Started: a.started})
	if err != nil {
		return err
	}
	if _, err := a.store.PutKV(ctx, "status/nodes/"+a.cfg.NodeName, b, lease); err != nil {
		return fmt.Errorf("publishing node liveness: %w", err)
	}
	return nil
}

// leaseLoop keeps the liveness lease alive and re-grants it (re-publishing
// the keys under it) whenever it is lost, e.g. after an etcd outage.
func (a *Agent) leaseLoop(ctx context.Context, lease datastore.LeaseID) {
	for {
		err := a.store.KeepAlive(ctx, lease)
		if ctx.Err() != nil {
			return
		}
		a.log.Warn("node liveness lease lost, renewing", "err", err)
		for attempt := 0; ; attempt++ {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff(attempt)):
			}
			l, gerr := a.store.GrantLease(ctx, a.cfg.LeaseTTL)
			if gerr != nil {
				continue
			}
			if perr := a.publishLiveness(ctx, l); perr != nil {
				continue
			}
			lease = l
			a.mu.Lock()
			a.statusLease = l
			a.mu.Unlock()
			break
		}
	}
}
