package ctl

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// ManifestOptions are the arguments of apply, create and delete -f.
type ManifestOptions struct {
	Sources []Source
	// Namespace for resources without one; "" = "default".
	Namespace string
	// IgnoreNotFound makes delete succeed for missing resources.
	IgnoreNotFound bool
}

// Results of apply.
const (
	resultCreated    = "created"
	resultConfigured = "configured"
	resultUnchanged  = "unchanged"
)

// maxAttempts bounds retries of read-modify-write loops that lose races.
const maxAttempts = 5

// prepareManifests decodes, defaults and validates every resource. If
// anything is wrong nothing is returned: apply and create change nothing
// unless the whole input is valid.
func prepareManifests(o ManifestOptions) ([]item, error) {
	items, errs := decodeSources(o.Sources, o.Namespace)
	for _, it := range items {
		it.obj.SetDefaults()
		if err := it.obj.Validate(); err != nil {
			errs = append(errs, validationError(it, err))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w\nnothing was changed", errors.Join(errs...))
	}
	return items, nil
}

// Apply creates or updates every resource of the manifests and prints
// "ippool/pool1 created|configured|unchanged" for each. It keeps going after
// a failure and returns every error.
func (c *Client) Apply(ctx context.Context, out io.Writer, o ManifestOptions) error {
	items, err := prepareManifests(o)
	if err != nil {
		return err
	}
	tierWarnings, err := c.checkTiers(ctx, items)
	if err != nil {
		return err
	}
	printWarnings(out, tierWarnings)
	var errs []error
	var stored []api.Object
	for _, it := range items {
		res, err := c.applyOne(ctx, it.obj)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ref(it.obj), err))
			continue
		}
		fmt.Fprintf(out, "%s %s\n", ref(it.obj), res)
		stored = append(stored, it.obj)
	}
	printWarnings(out, c.failsafeWarnings(ctx, stored))
	return errors.Join(errs...)
}

func (c *Client) applyOne(ctx context.Context, obj api.Object) (string, error) {
	kind, m := api.KindOf(obj), obj.GetMeta()
	for range maxAttempts {
		cur, err := c.Store.Get(ctx, kind, m.Namespace, m.Name)
		switch {
		case isNotFound(err):
			err := c.create(ctx, obj)
			if errors.Is(err, datastore.ErrExists) {
				continue // created meanwhile: update it
			}
			if err != nil {
				return "", err
			}
			return resultCreated, nil
		case err != nil:
			return "", err
		}
		if h, ok := hooks[kind]; ok {
			if err := h.checkUpdate(cur, obj); err != nil {
				return "", err
			}
		}
		m.ResourceVersion = ""
		applied, err := c.Store.Apply(ctx, obj)
		if err != nil {
			return "", err
		}
		if applied.GetMeta().ResourceVersion == cur.GetMeta().ResourceVersion {
			return resultUnchanged, nil
		}
		return resultConfigured, nil
	}
	return "", fmt.Errorf("gave up after %d attempts: %w", maxAttempts, datastore.ErrConflict)
}

// kindHook is what apply and create do differently for one kind than the
// store's generic calls. Hooks are written against the kind's Go type
// (typedHook); hooks holds them by kind.
type kindHook interface {
	// checkUpdate refuses replacing the stored cur with next.
	checkUpdate(cur, next api.Object) error
	// create stores a new object of the kind.
	create(ctx context.Context, c *Client, obj api.Object) error
}

// hooks are the kinds whose apply and create are not the store's.
var hooks = map[string]kindHook{
	api.KindIPPool: typedHook[*api.IPPool]{check: poolImmutable, store: createPool},
}

// typedHook is a kindHook for the kind whose Go type is T; a nil func
// means the generic behaviour.
type typedHook[T api.Object] struct {
	check func(cur, next T) error
	store func(ctx context.Context, c *Client, obj T) error
}

// typedAs is obj as the hook's type. hooks is keyed by kind and api.New
// makes every kind's one Go type, so a mismatch is a programming error,
// reported rather than panicking.
func typedAs[T api.Object](obj api.Object) (T, error) {
	t, ok := obj.(T)
	if !ok {
		return t, fmt.Errorf("%s is a %T, not a %T", ref(obj), obj, t)
	}
	return t, nil
}

func (h typedHook[T]) checkUpdate(cur, next api.Object) error {
	if h.check == nil {
		return nil
	}
	c, err := typedAs[T](cur)
	if err != nil {
		return err
	}
	n, err := typedAs[T](next)
	if err != nil {
		return err
	}
	return h.check(c, n)
}

func (h typedHook[T]) create(ctx context.Context, c *Client, obj api.Object) error {
	if h.store == nil {
		_, err := c.Store.Create(ctx, obj)
		return err
	}
	t, err := typedAs[T](obj)
	if err != nil {
		return err
	}
	return h.store(ctx, c, t)
}

// poolImmutable refuses changes IPAM cannot follow: an IPPool's CIDR and
// block size are fixed once blocks may have been carved from it.
func poolImmutable(cp, np *api.IPPool) error {
	var msgs []string
	cc, _ := cp.Prefix()
	nc, _ := np.Prefix()
	if cc != nc {
		msgs = append(msgs, fmt.Sprintf("spec.cidr: cannot be changed (%s to %s)", cp.Spec.CIDR, np.Spec.CIDR))
	}
	if cp.Spec.BlockSize != np.Spec.BlockSize {
		msgs = append(msgs, fmt.Sprintf("spec.blockSize: cannot be changed (%d to %d)", cp.Spec.BlockSize, np.Spec.BlockSize))
	}
	if cp.IsLoadBalancer() != np.IsLoadBalancer() {
		msgs = append(msgs, fmt.Sprintf("spec.allowedUses: cannot be changed between LoadBalancer and pod use (%v to %v)", cp.Uses(), np.Uses()))
	}
	if len(msgs) == 0 {
		return nil
	}
	return fmt.Errorf("the pool's addresses cannot change under IPAM:\n  %s\n"+
		"create a new pool, disable this one (spec.disabled: true), move the pods, then delete it", strings.Join(msgs, "\n  "))
}

// createPool creates a pool through IPAM, which refuses a pool that
// overlaps another.
func createPool(ctx context.Context, c *Client, p *api.IPPool) error {
	_, err := c.IPAM.CreatePool(ctx, p)
	return cleanIPAMError(err)
}

// create stores a new resource, through its kind's hook if it has one.
func (c *Client) create(ctx context.Context, obj api.Object) error {
	obj.GetMeta().ResourceVersion = ""
	if h, ok := hooks[api.KindOf(obj)]; ok {
		return h.create(ctx, c, obj)
	}
	_, err := c.Store.Create(ctx, obj)
	return err
}

// cleanIPAMError drops the "ipam: " prefix from errors shown to users.
func cleanIPAMError(err error) error {
	if err == nil {
		return nil
	}
	if msg, ok := strings.CutPrefix(err.Error(), "ipam: "); ok {
		return &wrapped{msg: msg, err: err}
	}
	return err
}

// wrapped replaces an error's message, keeping it for errors.Is and As.
type wrapped struct {
	msg string
	err error
}

func (w *wrapped) Error() string { return w.msg }
func (w *wrapped) Unwrap() error { return w.err }

// Create creates every resource of the manifests; one that exists is an
// error (use apply to update it).
func (c *Client) Create(ctx context.Context, out io.Writer, o ManifestOptions) error {
	items, err := prepareManifests(o)
	if err != nil {
		return err
	}
	tierWarnings, err := c.checkTiers(ctx, items)
	if err != nil {
		return err
	}
	printWarnings(out, tierWarnings)
	var errs []error
	var stored []api.Object
	for _, it := range items {
		err := c.create(ctx, it.obj)
		if errors.Is(err, datastore.ErrExists) {
			err = errors.New("already exists (use apply to update it)")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ref(it.obj), err))
			continue
		}
		fmt.Fprintf(out, "%s created\n", ref(it.obj))
		stored = append(stored, it.obj)
	}
	printWarnings(out, c.failsafeWarnings(ctx, stored))
	return errors.Join(errs...)
}

// DeleteManifests deletes the resources the manifests name.
func (c *Client) DeleteManifests(ctx context.Context, out io.Writer, o ManifestOptions) error {
	items, errs := decodeSources(o.Sources, o.Namespace)
	if len(errs) > 0 {
		return fmt.Errorf("%w\nnothing was deleted", errors.Join(errs...))
	}
	keys := map[string]bool{}
	for _, it := range items {
		keys[objectKey(it.obj)] = true
	}
	if err := c.checkTierDeletes(ctx, keys); err != nil {
		return fmt.Errorf("%w\nnothing was deleted", err)
	}
	// Tiers last: the policies that name them go first.
	slices.SortStableFunc(items, func(a, b item) int {
		return cmp.Compare(boolInt(api.KindOf(a.obj) == api.KindTier), boolInt(api.KindOf(b.obj) == api.KindTier))
	})
	for _, it := range items {
		info, _ := api.LookupKind(api.KindOf(it.obj))
		m := it.obj.GetMeta()
		if err := c.deleteOne(ctx, out, info, m.Namespace, m.Name, o.IgnoreNotFound); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Delete deletes resources of one kind by name.
func (c *Client) Delete(ctx context.Context, out io.Writer, kind, namespace string, names []string, ignoreNotFound bool) error {
	info, err := ResolveKind(kind)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return fmt.Errorf("delete %s: give the names to delete (or -f FILE)", info.Plural)
	}
	if info.Kind == api.KindTier {
		keys := map[string]bool{}
		for _, name := range names {
			keys[api.KindTier+"/"+name] = true
		}
		if err := c.checkTierDeletes(ctx, keys); err != nil {
			return fmt.Errorf("%w\nnothing was deleted", err)
		}
	}
	var errs []error
	for _, name := range names {
		if err := c.deleteOne(ctx, out, info, namespaceFor(info, namespace), name, ignoreNotFound); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (c *Client) deleteOne(ctx context.Context, out io.Writer, info api.KindInfo, ns, name string, ignoreNotFound bool) error {
	var err error
	if info.Kind == api.KindTier {
		if err := c.checkTierDeletes(ctx, map[string]bool{api.KindTier + "/" + name: true}); err != nil {
			return err
		}
	}
	if info.Kind == api.KindIPPool {
		err = c.deletePool(ctx, name)
	} else {
		err = c.Store.Delete(ctx, info.Kind, ns, name, "")
	}
	var inUse *ipam.PoolInUseError
	switch {
	case isNotFound(err) && ignoreNotFound:
		return nil
	case isNotFound(err):
		return notFound(info, ns, name)
	case errors.As(err, &inUse) && inUse.LoadBalancer:
		return fmt.Errorf("%s: cannot delete: the LoadBalancer pool is in use (%s held by Services); "+
			"disable the pool (spec.disabled: true), delete those Services or move them to another pool, check with `tabbyctl ipam show`, then delete it",
			refOf(info, name), plural(inUse.Allocated, "address", "addresses"))
	case errors.As(err, &inUse):
		return fmt.Errorf("%s: cannot delete: the pool is in use (%s allocated); "+
			"disable the pool (spec.disabled: true), move or delete its pods, check with `tabbyctl ipam show --show-blocks`, then delete it",
			refOf(info, name), plural(inUse.Allocated, "address", "addresses"))
	case err != nil:
		return fmt.Errorf("%s: %w", refOf(info, name), err)
	}
	_, err = fmt.Fprintf(out, "%s deleted\n", refOf(info, name))
	return err
}

// deletePool deletes a pool through IPAM, which refuses while addresses of
// it are allocated and removes its blocks and affinities. A pool IPAM does
// not know (one it cannot use) is deleted from the store directly.
func (c *Client) deletePool(ctx context.Context, name string) error {
	err := c.IPAM.DeletePool(ctx, name)
	if !isNotFound(err) {
		return cleanIPAMError(err)
	}
	return c.Store.Delete(ctx, api.KindIPPool, "", name, "")
}

// LabelOptions are the arguments of label.
type LabelOptions struct {
	Kind, Namespace, Name string
	// Changes are "key=value" (set) and "key-" (remove).
	Changes []string
	// Overwrite allows changing a label that has another value.
	Overwrite bool
}

// Label sets and removes labels of one resource.
func (c *Client) Label(ctx context.Context, out io.Writer, o LabelOptions) error {
	info, err := ResolveKind(o.Kind)
	if err != nil {
		return err
	}
	set, remove, err := parseLabelChanges(o.Changes)
	if err != nil {
		return err
	}
	ns := namespaceFor(info, o.Namespace)
	for range maxAttempts {
		obj, err := c.Store.Get(ctx, info.Kind, ns, o.Name)
		if isNotFound(err) {
			return notFound(info, ns, o.Name)
		}
		if err != nil {
			return err
		}
		m := obj.GetMeta()
		changed := false
		for _, k := range remove {
			if _, ok := m.Labels[k]; ok {
				delete(m.Labels, k)
				changed = true
			}
		}
		for _, kv := range set {
			old, ok := m.Labels[kv[0]]
			if ok && old == kv[1] {
				continue
			}
			if ok && !o.Overwrite {
				return fmt.Errorf("%s: label %q is already %q; use --overwrite to change it", refOf(info, o.Name), kv[0], old)
			}
			if m.Labels == nil {
				m.Labels = map[string]string{}
			}
			m.Labels[kv[0]] = kv[1]
			changed = true
		}
		if !changed {
			_, err := fmt.Fprintf(out, "%s not labeled (no change)\n", refOf(info, o.Name))
			return err
		}
		_, err = c.Store.Update(ctx, obj)
		if errors.Is(err, datastore.ErrConflict) {
			continue
		}
		var fes api.FieldErrors
		if errors.As(err, &fes) {
			return validationError(item{obj: obj}, fes)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", refOf(info, o.Name), err)
		}
		_, err = fmt.Fprintf(out, "%s labeled\n", refOf(info, o.Name))
		return err
	}
	return fmt.Errorf("%s: gave up after %d attempts: %w", refOf(info, o.Name), maxAttempts, datastore.ErrConflict)
}

func parseLabelChanges(changes []string) (set [][2]string, remove []string, err error) {
	if len(changes) == 0 {
		return nil, nil, errors.New("give at least one label change: key=value or key-")
	}
	for _, ch := range changes {
		if k, v, ok := strings.Cut(ch, "="); ok {
			if k == "" {
				return nil, nil, fmt.Errorf("invalid label change %q: empty key", ch)
			}
			set = append(set, [2]string{k, v})
			continue
		}
		if k, ok := strings.CutSuffix(ch, "-"); ok && k != "" {
			remove = append(remove, k)
			continue
		}
		return nil, nil, fmt.Errorf("invalid label change %q: want key=value or key-", ch)
	}
	return set, remove, nil
}

// Validate checks manifests without a datastore: decoding, defaults and
// every field problem. It prints a line per valid resource and returns the
// problems.
func Validate(out io.Writer, o ManifestOptions) error {
	items, errs := decodeSources(o.Sources, o.Namespace)
	bad := 0
	for _, it := range items {
		it.obj.SetDefaults()
		if err := it.obj.Validate(); err != nil {
			errs = append(errs, validationError(it, err))
			bad++
			continue
		}
		fmt.Fprintf(out, "%s: %s valid\n", it.src, ref(it.obj))
	}
	if len(errs) == 0 {
		return nil
	}
	var summary []string
	if bad > 0 {
		summary = append(summary, fmt.Sprintf("%d of %d resources invalid", bad, len(items)))
	}
	if n := len(errs) - bad; n > 0 {
		summary = append(summary, plural(n, "input", "inputs")+" not readable")
	}
	return fmt.Errorf("%w\n%s", errors.Join(errs...), strings.Join(summary, ", "))
}

// plural is "1 input", "2 inputs".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
