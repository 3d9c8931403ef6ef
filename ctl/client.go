package ctl

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// Client runs tabbyctl's commands against one datastore.
type Client struct {
	Store *datastore.Store
	IPAM  *ipam.Allocator
	// Now is the clock (time.Now); tests fix it.
	Now func() time.Time
}

// NewClient returns a Client on store with an IPAM allocator over it; now
// is the clock (nil = time.Now).
func NewClient(store *datastore.Store, now func() time.Time) *Client {
	if now == nil {
		now = time.Now
	}
	return &Client{Store: store, IPAM: ipam.New(store, ipam.WithClock(now)), Now: now}
}

// Connect probes the endpoints, so that an unreachable etcd is reported at
// once with each endpoint and the cause rather than after the dial timeout,
// and then connects.
func Connect(ctx context.Context, cfg datastore.Config) (*datastore.Store, error) {
	if err := Probe(cfg.Endpoints, probeDialTimeout); err != nil {
		return nil, err
	}
	s, err := datastore.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// ResolveKind looks a kind up by name, plural or short name; the error lists
// the kinds there are.
func ResolveKind(name string) (api.KindInfo, error) {
	info, ok := api.LookupKind(name)
	if ok {
		return info, nil
	}
	return api.KindInfo{}, fmt.Errorf("%w %q; known kinds: %s", api.ErrUnknownKind, name, KnownKinds())
}

// KnownKinds lists the kinds with their short names, for help and errors.
func KnownKinds() string {
	var parts []string
	for _, k := range api.Kinds() {
		s := k.Plural
		if len(k.ShortNames) > 0 {
			s += " (" + strings.Join(k.ShortNames, ", ") + ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// ref is "ippool/pool1": how apply, delete and label name a resource.
func ref(obj api.Object) string {
	return strings.ToLower(api.KindOf(obj)) + "/" + obj.GetMeta().Name
}

func refOf(info api.KindInfo, name string) string {
	return strings.ToLower(info.Kind) + "/" + name
}

// notFound is the error for a missing resource, the way kubectl says it.
func notFound(info api.KindInfo, ns, name string) error {
	if info.Namespaced {
		return fmt.Errorf("%s %q not found in namespace %q", strings.ToLower(info.Kind), name, ns)
	}
	return fmt.Errorf("%s %q not found", strings.ToLower(info.Kind), name)
}

// namespaceFor returns the namespace to use for kind: "" for cluster-wide
// kinds, else ns or "default".
func namespaceFor(info api.KindInfo, ns string) string {
	if !info.Namespaced {
		return ""
	}
	if ns == "" {
		return "default"
	}
	return ns
}

// formatLabels renders labels as "k=v,k2=v2", sorted, or "<none>".
func formatLabels(m map[string]string) string {
	if len(m) == 0 {
		return "<none>"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}

// isNotFound reports datastore.ErrNotFound.
func isNotFound(err error) bool { return errors.Is(err, datastore.ErrNotFound) }
