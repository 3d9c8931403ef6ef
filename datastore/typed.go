package datastore

import (
	"context"
	"fmt"
	"net/url"

	"github.com/tabbynet/tabby/api"
)

// Typed forms of the resource calls, for callers that know the Go type of
// the kind they ask for: GetAs[*api.Node](ctx, s, api.KindNode, "", name).
// A stored object of another type than T is an error, not a panic. Each
// takes only the method of *Store it calls, so that a caller's wrapper of
// the store (a test's round-trip counter, a fault injector) serves as well.

// Getter is the part of *Store that GetAs uses.
type Getter interface {
	Get(ctx context.Context, kind, namespace, name string) (api.Object, error)
}

// Lister is the part of *Store that ListAs uses.
type Lister interface {
	List(ctx context.Context, kind, namespace string) ([]api.Object, int64, error)
}

// Creator is the part of *Store that CreateAs uses.
type Creator interface {
	Create(ctx context.Context, obj api.Object) (api.Object, error)
}

// Updater is the part of *Store that UpdateAs uses.
type Updater interface {
	Update(ctx context.Context, obj api.Object) (api.Object, error)
}

func as[T api.Object](obj api.Object) (T, error) {
	t, ok := obj.(T)
	if !ok {
		var zero T
		return zero, fmt.Errorf("stored %s %s is a %T, not a %T", obj.GetTypeMeta().Kind, obj.GetMeta().Name, obj, zero)
	}
	return t, nil
}

// GetAs is Get returning T.
func GetAs[T api.Object](ctx context.Context, s Getter, kind, namespace, name string) (T, error) {
	obj, err := s.Get(ctx, kind, namespace, name)
	if err != nil {
		var zero T
		return zero, err
	}
	return as[T](obj)
}

// ListAs is List returning []T.
func ListAs[T api.Object](ctx context.Context, s Lister, kind, namespace string) ([]T, int64, error) {
	objs, rev, err := s.List(ctx, kind, namespace)
	if err != nil {
		return nil, 0, err
	}
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		t, err := as[T](o)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, t)
	}
	return out, rev, nil
}

// CreateAs is Create returning T.
func CreateAs[T api.Object](ctx context.Context, s Creator, obj T) (T, error) {
	out, err := s.Create(ctx, obj)
	if err != nil {
		var zero T
		return zero, err
	}
	return as[T](out)
}

// UpdateAs is Update returning T.
func UpdateAs[T api.Object](ctx context.Context, s Updater, obj T) (T, error) {
	out, err := s.Update(ctx, obj)
	if err != nil {
		var zero T
		return zero, err
	}
	return as[T](out)
}

// DecodeResourceAs is DecodeResource returning T: for callers that read
// one kind's keys with GetKV or ListKV (for their revisions) and want its
// Go type.
func DecodeResourceAs[T api.Object](kv KV) (T, error) {
	obj, err := DecodeResource(kv)
	if err != nil {
		var zero T
		return zero, err
	}
	return as[T](obj)
}

// Status records, published by each agent under its liveness lease.
const (
	// StatusPrefix holds every status record.
	StatusPrefix = "status/"
	// NodeStatusPrefix holds each agent's status (BGP sessions, blocks):
	// status/bgp/<node>.
	NodeStatusPrefix = "status/bgp/"
	// NodeLivenessPrefix holds each agent's liveness record:
	// status/nodes/<node>.
	NodeLivenessPrefix = "status/nodes/"
)

// NodeGCPrefix holds node GC's records: gc/nodes/<node> says since when
// any agent has seen the node gone (no Node record, no liveness record), so
// that the grace survives agent restarts.
const NodeGCPrefix = "gc/nodes/"

// NodeGCKey is node GC's record of node.
func NodeGCKey(node string) string { return NodeGCPrefix + url.PathEscape(node) }

// NodeStatusKey is where node publishes its status.
func NodeStatusKey(node string) string { return NodeStatusPrefix + node }

// NodeLivenessKey is where node publishes its liveness.
func NodeLivenessKey(node string) string { return NodeLivenessPrefix + node }
