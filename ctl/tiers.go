package ctl

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// tierState is the stored tiers and global policies (staged ones as
// AsGlobal with their kind) overlaid with the objects about to be applied.
func (c *Client) tierState(ctx context.Context, items []item) ([]*api.Tier, []*api.GlobalNetworkPolicy, error) {
	tiers, _, err := datastore.ListAs[*api.Tier](ctx, c.Store, api.KindTier, "")
	if err != nil {
		return nil, nil, fmt.Errorf("listing tiers: %w", err)
	}
	gnps, _, err := datastore.ListAs[*api.GlobalNetworkPolicy](ctx, c.Store, api.KindGlobalNetworkPolicy, "")
	if err != nil {
		return nil, nil, fmt.Errorf("listing globalnetworkpolicies: %w", err)
	}
	staged, _, err := datastore.ListAs[*api.StagedGlobalNetworkPolicy](ctx, c.Store, api.KindStagedGlobalNetworkPolicy, "")
	if err != nil {
		return nil, nil, fmt.Errorf("listing stagedglobalnetworkpolicies: %w", err)
	}
	pols := map[string]*api.GlobalNetworkPolicy{}
	for _, g := range gnps {
		pols[api.KindGlobalNetworkPolicy+"/"+g.Metadata.Name] = g
	}
	for _, s := range staged {
		g := s.AsGlobal()
		g.Kind = api.KindStagedGlobalNetworkPolicy
		pols[api.KindStagedGlobalNetworkPolicy+"/"+s.Metadata.Name] = g
	}
	byName := map[string]*api.Tier{}
	for _, t := range tiers {
		byName[t.Metadata.Name] = t
	}
	for _, it := range items {
		switch o := it.obj.(type) {
		case *api.Tier:
			byName[o.Metadata.Name] = o
		case *api.GlobalNetworkPolicy:
			pols[api.KindGlobalNetworkPolicy+"/"+o.Metadata.Name] = o
		case *api.StagedGlobalNetworkPolicy:
			g := o.AsGlobal()
			g.Kind = api.KindStagedGlobalNetworkPolicy
			pols[api.KindStagedGlobalNetworkPolicy+"/"+o.Metadata.Name] = g
		}
	}
	tiers = tiers[:0]
	for _, t := range byName {
		tiers = append(tiers, t)
	}
	var out []*api.GlobalNetworkPolicy
	for _, k := range slices.Sorted(maps.Keys(pols)) {
		out = append(out, pols[k])
	}
	return api.EffectiveTiers(tiers), out, nil
}

// checkTiers refuses a manifest whose tiers and policies, together with
// what is stored, have a policy naming a missing tier or Pass in the last
// tier (api.CheckTiers), about an object of the manifest; it returns the
// warnings (order ties) to print.
func (c *Client) checkTiers(ctx context.Context, items []item) ([]string, error) {
	touches := false
	mine := map[string]bool{}
	for _, it := range items {
		switch it.obj.(type) {
		case *api.Tier, *api.GlobalNetworkPolicy, *api.StagedGlobalNetworkPolicy:
			touches = true
			mine[api.KindOf(it.obj)+"/"+it.obj.GetMeta().Name] = true
		}
	}
	if !touches {
		return nil, nil
	}
	tiers, pols, err := c.tierState(ctx, items)
	if err != nil {
		return nil, err
	}
	var warnings []string
	var errs []error
	for _, p := range api.CheckTiers(tiers, pols) {
		switch {
		case p.Warning:
			warnings = append(warnings, fmt.Sprintf("%s %s: %s", p.Kind, p.Name, p.FieldError.Error()))
		case mine[p.Kind+"/"+p.Name] || mine[api.KindTier+"/"+p.Name]:
			errs = append(errs, errors.New(p.String()))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w\nnothing was changed", errors.Join(errs...))
	}
	return warnings, nil
}

// checkTierDelete refuses deleting a built-in tier, or a tier that
// policies still name.
func (c *Client) checkTierDelete(ctx context.Context, name string) error {
	if api.IsBuiltinTier(name) {
		return fmt.Errorf("tier/%s: cannot delete: %s is a built-in tier (it exists whether or not it is stored)", name, name)
	}
	_, pols, err := c.tierState(ctx, nil)
	if err != nil {
		return err
	}
	n := 0
	for _, p := range pols {
		if p.TierName() == name {
			n++
		}
	}
	if n > 0 {
		return fmt.Errorf("tier/%s: cannot delete: %s (they would be ignored); delete or move them first", name, plural(n, "policy", "policies")+" still name it")
	}
	return nil
}

// tierObjects are the tiers `get tiers` shows: the effective ones (the
// built-in ones included when not stored), in evaluation order, or those
// named.
func (c *Client) tierObjects(ctx context.Context, names []string) ([]api.Object, map[string][2]int, error) {
	tiers, pols, err := c.tierState(ctx, nil)
	if err != nil {
		return nil, nil, err
	}
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
