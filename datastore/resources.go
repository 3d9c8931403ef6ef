package datastore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tabbynet/tabby/api"
)

// ResourcesPrefix is the relative prefix of every typed resource.
const ResourcesPrefix = "resources/"

// applyAttempts bounds Apply's read-modify-write retries.
const applyAttempts = 10

// ResourceKey returns the relative key of a resource:
// resources/<plural>/<name> or, for namespaced kinds,
// resources/<plural>/<namespace>/<name>. kind is anything api.LookupKind
// accepts.
func ResourceKey(kind, namespace, name string) (string, error) {
	info, ok := api.LookupKind(kind)
	if !ok {
		return "", fmt.Errorf("%w %q", api.ErrUnknownKind, kind)
	}
	if err := checkSegment("name", name); err != nil {
		return "", fmt.Errorf("%s key: %w", info.Kind, err)
	}
	if !info.Namespaced {
		if namespace != "" {
			return "", fmt.Errorf("%s key: %s is not namespaced (got namespace %q)", info.Kind, info.Kind, namespace)
		}
		return ResourcesPrefix + info.Plural + "/" + name, nil
	}
	if err := checkSegment("namespace", namespace); err != nil {
		return "", fmt.Errorf("%s key: %w", info.Kind, err)
	}
	return ResourcesPrefix + info.Plural + "/" + namespace + "/" + name, nil
}

func checkSegment(what, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%s is required", what)
	case strings.Contains(s, "/"):
		return fmt.Errorf("%s %q must not contain /", what, s)
	case s == "." || s == "..":
		return fmt.Errorf("%s %q is not allowed", what, s)
	}
	return nil
}

// ParseResourceKey splits a relative resource key into its canonical kind,
// namespace and name; ok is false for a key that is not a resource key.
func ParseResourceKey(key string) (kind, namespace, name string, ok bool) {
	rest, found := strings.CutPrefix(key, ResourcesPrefix)
	if !found {
		return "", "", "", false
	}
	plural, rest, _ := strings.Cut(rest, "/")
	info, found := api.LookupKind(plural)
	if !found || info.Plural != plural {
		return "", "", "", false
	}
	first, second, two := strings.Cut(rest, "/")
	switch {
	case info.Namespaced && two && first != "" && second != "" && !strings.Contains(second, "/"):
		return info.Kind, first, second, true
	case !info.Namespaced && !two && first != "":
		return info.Kind, "", first, true
	}
	return "", "", "", false
}

// listPrefix returns the relative prefix listing kind in namespace ("" =
// all namespaces).
func listPrefix(kind, namespace string) (api.KindInfo, string, error) {
	info, ok := api.LookupKind(kind)
	if !ok {
		return api.KindInfo{}, "", fmt.Errorf("%w %q", api.ErrUnknownKind, kind)
	}
	p := ResourcesPrefix + info.Plural + "/"
	if namespace == "" {
		return info, p, nil
	}
	if !info.Namespaced {
		return info, "", fmt.Errorf("listing %s: not namespaced (got namespace %q)", info.Kind, namespace)
	}
	if err := checkSegment("namespace", namespace); err != nil {
		return info, "", fmt.Errorf("listing %s: %w", info.Kind, err)
	}
	return info, p + namespace + "/", nil
}

// DecodeResource decodes a stored resource (from GetKV, ListKV or a watch
// event) and sets its resourceVersion from kv.ModRevision. The kind comes
// from the key, which must match the object's namespace and name.
func DecodeResource(kv KV) (api.Object, error) {
	kind, ns, name, ok := ParseResourceKey(kv.Key)
	if !ok {
		return nil, fmt.Errorf("decoding %s: not a resource key", kv.Key)
	}
	obj, err := api.New(kind)
	if err != nil {
		return nil, fmt.Errorf("decoding %s: %w", kv.Key, err)
	}
	if err := unmarshalRecord(kv.Value, obj); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", kv.Key, err)
	}
	*obj.GetTypeMeta() = api.TypeMeta{APIVersion: api.APIVersion, Kind: kind}
	m := obj.GetMeta()
	if m.Name != name || m.Namespace != ns {
		return nil, fmt.Errorf("decoding %s: object is %s/%s, not what its key says", kv.Key, m.Namespace, m.Name)
	}
	// The same strings, held once: the key's (which whoever keeps the
	// object keeps too) and the namespace's interned.
	m.Name, m.Namespace = name, interned.internString(ns)
	m.ResourceVersion = strconv.FormatInt(kv.ModRevision, 10)
	if w, ok := obj.(*api.WorkloadEndpoint); ok {
		internEndpoint(w)
	}
	return obj, nil
}

// internEndpoint shares the strings an endpoint has in common with the
// others of its node or of the cluster (every agent holds every endpoint).
func internEndpoint(w *api.WorkloadEndpoint) {
	s := &w.Spec
	s.Node, s.Orchestrator, s.Endpoint = interned.internString(s.Node), interned.internString(s.Orchestrator), interned.internString(s.Endpoint)
	for i, p := range s.Profiles {
		s.Profiles[i] = interned.internString(p)
	}
	for i := range s.Ports {
		s.Ports[i].Name, s.Ports[i].Protocol = interned.internString(s.Ports[i].Name), interned.internString(s.Ports[i].Protocol)
	}
}

// encodeResource returns the stored form: JSON without resourceVersion.
func encodeResource(obj api.Object) ([]byte, error) {
	m := obj.GetMeta()
	rv := m.ResourceVersion
	m.ResourceVersion = ""
	data, err := json.Marshal(obj)
	m.ResourceVersion = rv
	return data, err
}

// prepare copies obj (the caller's object is never modified), defaults and
// validates it, and returns it with its key.
func prepare(obj api.Object) (api.Object, string, error) {
	if obj == nil {
		return nil, "", errors.New("nil object")
	}
	kind := api.KindOf(obj)
	if kind == "" {
		return nil, "", fmt.Errorf("%T is not a Tabby resource", obj)
	}
	c, err := api.New(kind)
	if err != nil {
		return nil, "", err
	}
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, "", fmt.Errorf("copying %s: %w", kind, err)
	}
	if err := json.Unmarshal(data, c); err != nil {
		return nil, "", fmt.Errorf("copying %s: %w", kind, err)
	}
	c.SetDefaults()
	m := c.GetMeta()
	if err := c.Validate(); err != nil {
		return nil, "", fmt.Errorf("invalid %s %s: %w", kind, nsName(m.Namespace, m.Name), err)
	}
	key, err := ResourceKey(kind, m.Namespace, m.Name)
	if err != nil {
		return nil, "", err
	}
	return c, key, nil
}

func nsName(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

// resourceErr names the resource in an error.
func resourceErr(kind, ns, name string, err error) error {
	if info, ok := api.LookupKind(kind); ok {
		kind = info.Kind
	}
	return fmt.Errorf("%s %s: %w", kind, nsName(ns, name), err)
}

func parseRV(rv string) (int64, error) {
	n, err := strconv.ParseInt(rv, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("invalid resourceVersion %q", rv)
	}
	return n, nil
}

// Get returns a resource, or ErrNotFound.
func (s *Store) Get(ctx context.Context, kind, namespace, name string) (api.Object, error) {
	key, err := ResourceKey(kind, namespace, name)
	if err != nil {
		return nil, err
	}
	kv, err := s.GetKV(ctx, key)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil, resourceErr(kind, namespace, name, ErrNotFound)
		}
		return nil, err
	}
	return DecodeResource(kv)
}

// List returns the resources of kind, in namespace ("" = all), sorted by
// namespace and name, and the store revision of the list. Records that do
// not decode are skipped (and logged to Config.Logger), never fatal.
func (s *Store) List(ctx context.Context, kind, namespace string) ([]api.Object, int64, error) {
	_, prefix, err := listPrefix(kind, namespace)
	if err != nil {
		return nil, 0, err
	}
	kvs, rev, err := s.ListKV(ctx, prefix)
	if err != nil {
		return nil, 0, err
	}
	out := make([]api.Object, 0, len(kvs))
	for _, kv := range kvs {
		obj, err := DecodeResource(kv)
		if err != nil {
			// One corrupt record (written around Tabby, say with etcdctl)
			// must not blind every reader to all the others: skip it and
			// say so. Get of that key still returns the error.
			s.log.Warn("skipping a resource that does not decode", "key", kv.Key, "err", err)
			continue
		}
		out = append(out, obj)
	}
	return out, rev, nil
}

// Create stores a new resource after defaulting and validating it, and
// returns the stored object with a fresh uid, creationTimestamp and
// resourceVersion. An existing resource is ErrExists.
func (s *Store) Create(ctx context.Context, obj api.Object) (api.Object, error) {
	c, key, err := prepare(obj)
	if err != nil {
		return nil, err
	}
	return s.create(ctx, c, key)
}

// CreateOp is Create as part of a transaction (Txn, or a write that
// rides on another's, ipam.AssignRequest.With): the comparison that the
// key does not exist and the put. The returned object is obj prepared as
// Create stores it (defaults, uid, creationTimestamp; obj itself is not
// modified); set its resourceVersion to the transaction's revision once
// it commits. A failed comparison means the resource exists.
func CreateOp[T api.Object](obj T) (T, Cmp, Op, error) {
	var zero T
	c, key, err := prepare(obj)
	if err != nil {
		return zero, Cmp{}, Op{}, err
	}
	data, err := stamp(c, key)
	if err != nil {
		return zero, Cmp{}, Op{}, err
	}
	t, err := as[T](c)
	return t, Cmp{Key: key, ModRevision: 0}, Op{Key: key, Value: data}, err
}

// stamp gives a new resource its uid and creation time and encodes it.
func stamp(c api.Object, key string) ([]byte, error) {
	m := c.GetMeta()
	uid, err := newUID()
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC().Truncate(time.Second)
	m.UID, m.CreationTimestamp, m.ResourceVersion = uid, &now, ""
	data, err := encodeResource(c)
	if err != nil {
		return nil, fmt.Errorf("encoding %s: %w", key, err)
	}
	return data, nil
}

// create stores c, already prepared, at key.
func (s *Store) create(ctx context.Context, c api.Object, key string) (api.Object, error) {
	m := c.GetMeta()
	data, err := stamp(c, key)
	if err != nil {
		return nil, err
	}
	rev, err := s.CreateKV(ctx, key, data, 0)
	if err != nil {
		if errors.Is(err, ErrExists) {
			return nil, resourceErr(c.GetTypeMeta().Kind, m.Namespace, m.Name, ErrExists)
		}
		return nil, err
	}
	m.ResourceVersion = strconv.FormatInt(rev, 10)
	return c, nil
}

// Update replaces a resource if it is still at metadata.resourceVersion
// (required): ErrConflict if it changed since, ErrNotFound if it is gone.
// uid and creationTimestamp are kept from the stored object.
func (s *Store) Update(ctx context.Context, obj api.Object) (api.Object, error) {
	c, key, err := prepare(obj)
	if err != nil {
		return nil, err
	}
	m := c.GetMeta()
	kind := c.GetTypeMeta().Kind
	rev, err := parseRV(m.ResourceVersion)
	if err != nil {
		return nil, fmt.Errorf("updating %s %s: %w", kind, nsName(m.Namespace, m.Name), err)
	}
	cur, err := s.GetKV(ctx, key)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil, resourceErr(kind, m.Namespace, m.Name, ErrNotFound)
		}
		return nil, err
	}
	if cur.ModRevision != rev {
		return nil, resourceErr(kind, m.Namespace, m.Name, ErrConflict)
	}
	if err := s.write(ctx, c, key, cur); err != nil {
		return nil, err
	}
	return c, nil
}

// write stores c over cur with compare-and-swap, keeping cur's uid and
// creationTimestamp, and sets c's resourceVersion. When the stored object
// already equals c, nothing is written.
func (s *Store) write(ctx context.Context, c api.Object, key string, cur KV) error {
	m := c.GetMeta()
	kind := c.GetTypeMeta().Kind
	stored, err := DecodeResource(cur)
	if err != nil {
		return err
	}
	m.UID = stored.GetMeta().UID
	m.CreationTimestamp = stored.GetMeta().CreationTimestamp
	data, err := encodeResource(c)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", key, err)
	}
	if old, err := encodeResource(stored); err == nil && bytes.Equal(old, data) {
		m.ResourceVersion = strconv.FormatInt(cur.ModRevision, 10)
		return nil
	}
	rev, err := s.UpdateKV(ctx, key, data, cur.ModRevision)
	if err != nil {
		if errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) {
			return resourceErr(kind, m.Namespace, m.Name, err)
		}
		return err
	}
	m.ResourceVersion = strconv.FormatInt(rev, 10)
	return nil
}

// Apply creates the resource or replaces whatever is stored (its
// resourceVersion is ignored), retrying on concurrent changes. An object
// equal to the stored one is not written again.
func (s *Store) Apply(ctx context.Context, obj api.Object) (api.Object, error) {
	c, key, err := prepare(obj)
	if err != nil {
		return nil, err
	}
	m := c.GetMeta()
	kind := c.GetTypeMeta().Kind
	var lastErr error
	for range applyAttempts {
		cur, err := s.GetKV(ctx, key)
		switch {
		case errors.Is(err, ErrNotFound):
			created, err := s.create(ctx, c, key)
			if errors.Is(err, ErrExists) {
				lastErr = err
				continue
			}
			return created, err
		case err != nil:
			return nil, err
		}
		if err := s.write(ctx, c, key, cur); err != nil {
			if errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) {
				lastErr = err
				continue
			}
			return nil, err
		}
		return c, nil
	}
	return nil, fmt.Errorf("applying %s %s: gave up after %d attempts: %w", kind, nsName(m.Namespace, m.Name), applyAttempts, lastErr)
}

// Delete removes a resource: unconditionally when resourceVersion is "",
// else only at that version (ErrConflict). A missing resource is
// ErrNotFound.
func (s *Store) Delete(ctx context.Context, kind, namespace, name, resourceVersion string) error {
	key, err := ResourceKey(kind, namespace, name)
	if err != nil {
		return err
	}
	var rev int64
	if resourceVersion != "" {
		if rev, err = parseRV(resourceVersion); err != nil {
			return resourceErr(kind, namespace, name, err)
		}
	}
	if err := s.DeleteKV(ctx, key, rev); err != nil {
		for _, sentinel := range []error{ErrNotFound, ErrConflict} {
			if errors.Is(err, sentinel) {
				return resourceErr(kind, namespace, name, sentinel)
			}
		}
		return err
	}
	return nil
}

// newUID returns a random (version 4) UUID.
func newUID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generating uid: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}
