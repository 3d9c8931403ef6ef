package attach

import (
	"context"
	"net/netip"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// Addresses is IPAM as CNI requests use it (*ipam.Allocator). Each call is
// bounded by the caller.
type Addresses interface {
	Assign(ctx context.Context, req ipam.AssignRequest) (ipam.Assignment, error)
	// ReleaseHandle releases every address of the handle; an unknown
	// handle is success.
	ReleaseHandle(ctx context.Context, handle string) error
	// ReleaseAddrHeldBy releases one address if the handle holds it.
	ReleaseAddrHeldBy(ctx context.Context, addr netip.Addr, handle string) error
	AddressesByHandle(ctx context.Context, handle string) ([]netip.Addr, error)
	// EnsureFreeBlock claims a block for the node when none of its blocks
	// of the family has a free address; it returns the block claimed.
	EnsureFreeBlock(ctx context.Context, node string, family int) (netip.Prefix, error)
}

// Endpoints stores WorkloadEndpoints. Implementations bound every call.
type Endpoints interface {
	// Get returns the endpoint, or datastore.ErrNotFound.
	Get(ctx context.Context, namespace, name string) (*api.WorkloadEndpoint, error)
	// Put creates or replaces the endpoint (fresh: it is most likely not
	// there, try a create first) and returns the revision that holds it.
	Put(ctx context.Context, wep *api.WorkloadEndpoint, fresh bool) (int64, error)
	// Restore writes an endpoint back as it was read.
	Restore(ctx context.Context, wep *api.WorkloadEndpoint) error
	// Delete removes the endpoint if its resource version is rv ("" for
	// any); a missing endpoint is success.
	Delete(ctx context.Context, namespace, name, rv string) error
	// CreateOp is the endpoint's creation as part of a transaction (see
	// datastore.CreateOp): the endpoint as it will be stored, the
	// comparison that it does not exist yet, and the put.
	CreateOp(wep *api.WorkloadEndpoint) (*api.WorkloadEndpoint, datastore.Cmp, datastore.Op, error)
}

// HostRoutes is the one writer of the pods' host routes (the agent's route
// owner). Wire installs them for a host interface, Unwire forgets them.
type HostRoutes interface {
	Wire(hostIf string, routes []dataplane.Route) error
	Unwire(hostIf string)
}

// PolicyGate programs the firewall for an endpoint stored at revision rev
// before ADD returns, so that a pod never runs without its policy: with
// every policy written up to since (the revision of the ADD's first read:
// whatever was written before the ADD began), or up to rev when since is
// 0 (an ADD that read nothing).
type PolicyGate interface {
	SyncEndpoint(ctx context.Context, wep *api.WorkloadEndpoint, rev, since int64) error
}

// PolicyFunc is a function as a PolicyGate.
type PolicyFunc func(ctx context.Context, wep *api.WorkloadEndpoint, rev, since int64) error

// SyncEndpoint implements PolicyGate.
func (f PolicyFunc) SyncEndpoint(ctx context.Context, wep *api.WorkloadEndpoint, rev, since int64) error {
	return f(ctx, wep, rev, since)
}

// PolicyPrimer lets ADD compile a new endpoint's policy while the
// transaction creating it is in flight, so that the gate's pass after the
// commit finds its rules in place. Prime adds the endpoint, not yet
// committed, to what passes compile, until the view's event of its
// creation replaces it or Unprime takes it back, and reports whether it
// did (not when the view holds an endpoint of that name); Program runs a
// pass.
type PolicyPrimer interface {
	Prime(wep *api.WorkloadEndpoint) bool
	Unprime(wep *api.WorkloadEndpoint)
	Program(ctx context.Context) error
}

// AdvertGate returns once BGP advertises the prefix (at once for a family
// BGP does not carry).
type AdvertGate interface {
	Advertised(ctx context.Context, p netip.Prefix) error
}

// AdvertFunc is a function as an AdvertGate.
type AdvertFunc func(ctx context.Context, p netip.Prefix) error

// Advertised implements AdvertGate.
func (f AdvertFunc) Advertised(ctx context.Context, p netip.Prefix) error { return f(ctx, p) }
