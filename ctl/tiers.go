package ctl

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// tierSet is tiers by name and global policies (staged ones as AsGlobal
// with their kind) by policyKey: what api.CheckTiers judges.
type tierSet struct {
	tiers map[string]*api.Tier
	pols  map[string]*api.GlobalNetworkPolicy
}

// policyKey is "Kind/name" of a policy of a tierSet, the key of
// objectKey's form.
func policyKey(p *api.GlobalNetworkPolicy) string {
	return cmp.Or(p.Kind, api.KindGlobalNetworkPolicy) + "/" + p.Metadata.Name
}

// objectKey is "Kind/name" of a cluster-scoped object.
func objectKey(o api.Object) string { return api.KindOf(o) + "/" + o.GetMeta().Name }

// storedTiers reads the stored tiers and global policies.
func (c *Client) storedTiers(ctx context.Context) (tierSet, error) {
	s := tierSet{tiers: map[string]*api.Tier{}, pols: map[string]*api.GlobalNetworkPolicy{}}
	tiers, _, err := datastore.ListAs[*api.Tier](ctx, c.Store, api.KindTier, "")
	if err != nil {
		return s, fmt.Errorf("listing tiers: %w", err)
	}
	gnps, _, err := datastore.ListAs[*api.GlobalNetworkPolicy](ctx, c.Store, api.KindGlobalNetworkPolicy, "")
	if err != nil {
		return s, fmt.Errorf("listing globalnetworkpolicies: %w", err)
	}
	staged, _, err := datastore.ListAs[*api.StagedGlobalNetworkPolicy](ctx, c.Store, api.KindStagedGlobalNetworkPolicy, "")
	if err != nil {
		return s, fmt.Errorf("listing stagedglobalnetworkpolicies: %w", err)
	}
	for _, t := range tiers {
		s.tiers[t.Metadata.Name] = t
	}
	for _, g := range gnps {
		s.pols[api.KindGlobalNetworkPolicy+"/"+g.Metadata.Name] = g
	}
	for _, st := range staged {
		s.add(st)
	}
	return s, nil
}

// add puts a tier or global policy into the set (other kinds: nothing).
func (s tierSet) add(o api.Object) {
	switch o := o.(type) {
	case *api.Tier:
		s.tiers[o.Metadata.Name] = o
	case *api.GlobalNetworkPolicy:
		s.pols[api.KindGlobalNetworkPolicy+"/"+o.Metadata.Name] = o
	case *api.StagedGlobalNetworkPolicy:
		g := o.AsGlobal()
		g.Kind = api.KindStagedGlobalNetworkPolicy
		s.pols[api.KindStagedGlobalNetworkPolicy+"/"+o.Metadata.Name] = g
	}
}

// with returns a copy of the set overlaid with the objects about to be
// applied.
func (s tierSet) with(items []item) tierSet {
	out := tierSet{tiers: maps.Clone(s.tiers), pols: maps.Clone(s.pols)}
	for _, it := range items {
		out.add(it.obj)
	}
	return out
}

// without returns a copy of the set without the objects of keys
// (objectKey's form).
func (s tierSet) without(keys map[string]bool) tierSet {
	out := tierSet{tiers: maps.Clone(s.tiers), pols: maps.Clone(s.pols)}
	maps.DeleteFunc(out.tiers, func(name string, _ *api.Tier) bool { return keys[api.KindTier+"/"+name] })
	maps.DeleteFunc(out.pols, func(k string, _ *api.GlobalNetworkPolicy) bool { return keys[k] })
	return out
}

// effective returns the tiers in evaluation order (the built-in ones
// included, api.EffectiveTiers) and the policies sorted by key.
func (s tierSet) effective() ([]*api.Tier, []*api.GlobalNetworkPolicy) {
	tiers := slices.Collect(maps.Values(s.tiers))
	var pols []*api.GlobalNetworkPolicy
	for _, k := range slices.Sorted(maps.Keys(s.pols)) {
		pols = append(pols, s.pols[k])
	}
	return api.EffectiveTiers(tiers), pols
}

// problems are api.CheckTiers' problems of the set.
func (s tierSet) problems() []api.TierProblem {
	return api.CheckTiers(s.effective())
}

// errorSet is the set's problems that are not warnings, by String.
func (s tierSet) errorSet() map[string]bool {
	out := map[string]bool{}
	for _, p := range s.problems() {
		if !p.Warning {
			out[p.String()] = true
		}
	}
	return out
}

// checkTiers refuses a manifest whose tiers and policies, together with
// what is stored, have a policy naming a missing tier or Pass in the last
// tier (api.CheckTiers) about an object of the manifest, or such a
// problem the store did not have before (a tier moved to the end under a
// stored policy's Pass); it returns the warnings (order ties) to print.
func (c *Client) checkTiers(ctx context.Context, items []item) ([]string, error) {
	mine := map[string]bool{}
	for _, it := range items {
		switch it.obj.(type) {
		case *api.Tier, *api.GlobalNetworkPolicy, *api.StagedGlobalNetworkPolicy:
			mine[objectKey(it.obj)] = true
		}
	}
	if len(mine) == 0 {
		return nil, nil
	}
	stored, err := c.storedTiers(ctx)
	if err != nil {
		return nil, err
	}
	before := stored.errorSet()
	var warnings []string
	var errs []error
	for _, p := range stored.with(items).problems() {
		switch {
		case p.Warning:
			warnings = append(warnings, fmt.Sprintf("%s %s: %s", p.Kind, p.Name, p.FieldError.Error()))
		case mine[p.Kind+"/"+p.Name] || !before[p.String()]:
			errs = append(errs, errors.New(p.String()))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w\nnothing was changed", errors.Join(errs...))
	}
	return warnings, nil
}

// checkTierDeletes refuses deleting the objects of keys (objectKey's
// form) when one is a built-in tier, a tier that policies not deleted
// with it still name, or a tier whose going leaves a problem the store did
// not have (a stored policy's Pass in what becomes the last tier).
func (c *Client) checkTierDeletes(ctx context.Context, keys map[string]bool) error {
	var names []string
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if name, ok := strings.CutPrefix(k, api.KindTier+"/"); ok {
			if api.IsBuiltinTier(name) {
				return fmt.Errorf("tier/%s: cannot delete: %s is a built-in tier (it exists whether or not it is stored)", name, name)
			}
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	stored, err := c.storedTiers(ctx)
	if err != nil {
		return err
	}
	after := stored.without(keys)
	var errs []error
	for _, name := range names {
		n := 0
		for _, p := range after.pols {
			if p.TierName() == name {
				n++
			}
		}
		if n > 0 {
			errs = append(errs, fmt.Errorf("tier/%s: cannot delete: %s (they would be ignored); delete or move them first", name, plural(n, "policy", "policies")+" still name it"))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	before := stored.errorSet()
	for _, p := range after.problems() {
		if !p.Warning && !before[p.String()] {
			errs = append(errs, fmt.Errorf("tier/%s: cannot delete: %s", strings.Join(names, ", tier/"), p))
		}
	}
	return errors.Join(errs...)
}

// tierObjects are the tiers `get tiers` shows: the effective ones (the
// built-in ones included when not stored), in evaluation order, or those
// named.
func (c *Client) tierObjects(ctx context.Context, names []string) ([]api.Object, map[string][2]int, error) {
	stored, err := c.storedTiers(ctx)
	if err != nil {
		return nil, nil, err
	}
	tiers, pols := stored.effective()
	counts := map[string][2]int{}
	for _, p := range pols {
		n := counts[p.TierName()]
		if p.Kind == api.KindStagedGlobalNetworkPolicy {
			n[1]++
		} else {
			n[0]++
		}
		counts[p.TierName()] = n
	}
	var out []api.Object
	for _, t := range tiers {
		if len(names) == 0 || containsString(names, t.Metadata.Name) {
			out = append(out, t)
		}
	}
	return out, counts, nil
}

func containsString(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func tierRow(t *api.Tier, counts map[string][2]int) (cells, wide []string) {
	order := "<none>"
	if t.Spec.Order != nil {
		order = strconv.FormatFloat(*t.Spec.Order, 'f', -1, 64)
	}
	n := counts[t.Metadata.Name]
	return []string{t.Metadata.Name, order, t.DefaultAction(), strconv.Itoa(n[0])}, []string{strconv.Itoa(n[1])}
}
