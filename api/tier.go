package api

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// This file holds the tiered-policy kinds (docs/policy.md, "Tiers and
// staged policies"): Tier, an ordered group of GlobalNetworkPolicies with a
// default action, and StagedGlobalNetworkPolicy, a GlobalNetworkPolicy that
// only counts what it would do.

// Kinds of the tiered-policy resources.
const (
	KindTier                      = "Tier"
	KindStagedGlobalNetworkPolicy = "StagedGlobalNetworkPolicy"
)

// ActionPass is the rule action that ends the current tier's evaluation
// and hands the packet to the next tier.
const ActionPass = "Pass"

// The built-in tiers (contract B): they always exist, whether or not etcd
// has an object for them, and cannot be deleted. kube-admin holds the
// translation of AdminNetworkPolicy / ClusterNetworkPolicy tier Admin,
// default holds GlobalNetworkPolicies without spec.tier and Kubernetes
// NetworkPolicies, kube-baseline the BaselineAdminNetworkPolicy.
const (
	TierKubeAdmin    = "kube-admin"
	TierDefault      = "default"
	TierKubeBaseline = "kube-baseline"
)

// Orders of the built-in tiers.
const (
	TierKubeAdminOrder    = 1000.0
	TierDefaultOrder      = 1_000_000.0
	TierKubeBaselineOrder = 10_000_000.0
)

// Tier is a cluster-scoped, ordered group of policies. Tiers are evaluated
// in order (lower spec.order first, nil last, ties by name); within a tier
// the policies in their own order. A rule's Pass jumps to the next tier;
// a packet reaching the end of a tier in which at least one policy selected
// the endpoint gets the tier's default action.
type Tier struct {
	TypeMeta `json:",inline"`
	Metadata ObjectMeta `json:"metadata"`
	Spec     TierSpec   `json:"spec"`
}

// TierSpec orders a tier and says what ends it.
type TierSpec struct {
	// Order: lower first; nil sorts after every number.
	Order *float64 `json:"order,omitempty"`
	// DefaultAction is Deny (the default) or Pass.
	DefaultAction string `json:"defaultAction,omitempty"`
}

// builtinTiers are the built-in tiers' specs, in order.
var builtinTiers = []struct {
	name   string
	order  float64
	action string
}{
	{TierKubeAdmin, TierKubeAdminOrder, ActionPass},
	{TierDefault, TierDefaultOrder, ActionDeny},
	{TierKubeBaseline, TierKubeBaselineOrder, ActionPass},
}

// BuiltinTiers returns fresh copies of the built-in tiers, defaulted, in
// order. The agent's view supplies them when etcd has no object for them.
func BuiltinTiers() []*Tier {
	out := make([]*Tier, 0, len(builtinTiers))
	for _, b := range builtinTiers {
		order := b.order
		t := &Tier{Metadata: ObjectMeta{Name: b.name}, Spec: TierSpec{Order: &order, DefaultAction: b.action}}
		t.SetDefaults()
		out = append(out, t)
	}
	return out
}

// IsBuiltinTier reports whether name is one of the built-in tiers.
func IsBuiltinTier(name string) bool {
	for _, b := range builtinTiers {
		if b.name == name {
			return true
		}
	}
	return false
}

// GetTypeMeta implements Object.
func (t *Tier) GetTypeMeta() *TypeMeta { return &t.TypeMeta }

// GetMeta implements Object.
func (t *Tier) GetMeta() *ObjectMeta { return &t.Metadata }

// SetDefaults implements Object: defaultAction Deny; a built-in tier's
// order and default action when unset.
func (t *Tier) SetDefaults() {
	setTypeMeta(&t.TypeMeta, KindTier)
	for _, b := range builtinTiers {
		if b.name != t.Metadata.Name {
			continue
		}
		if t.Spec.Order == nil {
			o := b.order
			t.Spec.Order = &o
		}
		if t.Spec.DefaultAction == "" {
			t.Spec.DefaultAction = b.action
		}
	}
	if t.Spec.DefaultAction == "" {
		t.Spec.DefaultAction = ActionDeny
	}
}

// DefaultAction returns spec.defaultAction, Deny when unset.
func (t *Tier) DefaultAction() string { return cmp.Or(t.Spec.DefaultAction, ActionDeny) }

// Validate implements Object. A tier's name is a DNS-1123 label (it names
// dataplane chains); a built-in tier keeps its order and default action.
func (t *Tier) Validate() error {
	var v validator
	v.typeMeta(&t.TypeMeta, KindTier)
	v.meta(&t.Metadata, kindInfoOf(t))
	if t.Metadata.Name != "" && checkDNSSubdomain(t.Metadata.Name) == "" {
		if p := checkDNSLabel(t.Metadata.Name); p != "" {
			v.add("metadata.name", "%s", p)
		}
	}
	if o := t.Spec.Order; o != nil && (math.IsNaN(*o) || math.IsInf(*o, 0)) {
		v.add("spec.order", "must be a finite number")
	}
	switch t.Spec.DefaultAction {
	case "", ActionDeny, ActionPass:
	default:
		v.add("spec.defaultAction", "%q is not one of Deny, Pass", t.Spec.DefaultAction)
	}
	for _, b := range builtinTiers {
		if b.name != t.Metadata.Name {
			continue
		}
		if o := t.Spec.Order; o != nil && *o != b.order {
			v.add("spec.order", "%v: %s is a built-in tier whose order is %v", *o, b.name, b.order)
		}
		if a := t.Spec.DefaultAction; a != "" && a != b.action {
			v.add("spec.defaultAction", "%s: %s is a built-in tier whose default action is %s", a, b.name, b.action)
		}
	}
	return v.err()
}

// CompareTiers orders tiers: lower spec.order first, nil order last, ties
// by name.
func CompareTiers(a, b *Tier) int {
	switch {
	case a.Spec.Order == nil && b.Spec.Order != nil:
		return 1
	case a.Spec.Order != nil && b.Spec.Order == nil:
		return -1
	case a.Spec.Order != nil && *a.Spec.Order != *b.Spec.Order:
		return cmp.Compare(*a.Spec.Order, *b.Spec.Order)
	}
	return cmp.Compare(a.Metadata.Name, b.Metadata.Name)
}

// EffectiveTiers returns the tiers in evaluation order: stored, plus the
// built-in ones that stored lacks (a stored built-in tier replaces the
// default copy). Tiers that do not validate are left out. The input is not
// modified.
func EffectiveTiers(stored []*Tier) []*Tier {
	byName := make(map[string]*Tier, len(stored)+len(builtinTiers))
	for _, t := range BuiltinTiers() {
		byName[t.Metadata.Name] = t
	}
	for _, t := range stored {
		if t == nil || t.Validate() != nil {
			continue
		}
		c := *t
		c.SetDefaults()
		byName[t.Metadata.Name] = &c
	}
	out := make([]*Tier, 0, len(byName))
	for _, t := range byName {
		out = append(out, t)
	}
	slices.SortFunc(out, CompareTiers)
	return out
}

// TierName returns the policy's tier: spec.tier, or TierDefault.
func (p *GlobalNetworkPolicy) TierName() string { return cmp.Or(p.Spec.Tier, TierDefault) }

// HasPass reports whether any rule of the policy has action Pass.
func (s *GlobalNetworkPolicySpec) HasPass() bool {
	for _, r := range slices.Concat(s.Ingress, s.Egress) {
		if r.Action == ActionPass {
			return true
		}
	}
	return false
}

// ---------------------------------------------------------------- StagedGlobalNetworkPolicy

// StagedGlobalNetworkPolicy has a GlobalNetworkPolicy's spec, but is never
// enforced: the dataplane counts the packets each of its rules (and its
// tier's end) would decide, and lets the enforced policies decide.
type StagedGlobalNetworkPolicy struct {
	TypeMeta `json:",inline"`
	Metadata ObjectMeta              `json:"metadata"`
	Spec     GlobalNetworkPolicySpec `json:"spec"`
}

// GetTypeMeta implements Object.
func (p *StagedGlobalNetworkPolicy) GetTypeMeta() *TypeMeta { return &p.TypeMeta }

// GetMeta implements Object.
func (p *StagedGlobalNetworkPolicy) GetMeta() *ObjectMeta { return &p.Metadata }

// SetDefaults implements Object, as GlobalNetworkPolicy's.
func (p *StagedGlobalNetworkPolicy) SetDefaults() {
	setTypeMeta(&p.TypeMeta, KindStagedGlobalNetworkPolicy)
	p.Spec.Types = p.AsGlobal().effectiveTypes()
}

// Validate implements Object, as GlobalNetworkPolicy's.
func (p *StagedGlobalNetworkPolicy) Validate() error {
	var v validator
	v.typeMeta(&p.TypeMeta, KindStagedGlobalNetworkPolicy)
	v.meta(&p.Metadata, kindInfoOf(p))
	v.gnpSpec(p.AsGlobal())
	return v.err()
}

// AsGlobal returns the GlobalNetworkPolicy the staged one would be once
// enforced: same metadata and spec (shared, not copied).
func (p *StagedGlobalNetworkPolicy) AsGlobal() *GlobalNetworkPolicy {
	return &GlobalNetworkPolicy{TypeMeta: TypeMeta{APIVersion: APIVersion, Kind: KindGlobalNetworkPolicy}, Metadata: p.Metadata, Spec: p.Spec}
}

// ---------------------------------------------------------------- cross-object checks

// TierProblem is a problem of a set of tiers and policies that no single
// object shows: a policy naming a tier that does not exist, Pass in the
// last tier, two tiers with the same order. Warning problems do not stop
// the rule set from being applied.
type TierProblem struct {
	Kind, Name string // the object the problem is about
	FieldError
	Warning bool
}

// String: "GlobalNetworkPolicy x: spec.tier: ...".
func (p TierProblem) String() string {
	s := fmt.Sprintf("%s %s: %s", p.Kind, p.Name, p.FieldError.Error())
	if p.Warning {
		s = "warning: " + s
	}
	return s
}

// CheckTiers reports what is wrong with tiers and policies together
// (tiers are the effective ones, EffectiveTiers; staged policies are
// passed as their AsGlobal form with kind set to say so). A policy whose
// tier does not exist is ignored whole by the agents (an error here); Pass
// in the last tier acts as the end of the tier list (an error here, as it
// is meaningless); equal orders are a warning (ties are broken by name).
func CheckTiers(tiers []*Tier, policies []*GlobalNetworkPolicy) []TierProblem {
	var out []TierProblem
	known := make(map[string]bool, len(tiers))
	for i, t := range tiers {
		known[t.Metadata.Name] = true
		if i > 0 && t.Spec.Order != nil && tiers[i-1].Spec.Order != nil && *t.Spec.Order == *tiers[i-1].Spec.Order {
			out = append(out, TierProblem{Kind: KindTier, Name: t.Metadata.Name, Warning: true,
				FieldError: FieldError{"spec.order", fmt.Sprintf("%v is also tier %s's order: ties are evaluated by name", *t.Spec.Order, tiers[i-1].Metadata.Name)}})
		}
	}
	last := ""
	if len(tiers) > 0 {
		last = tiers[len(tiers)-1].Metadata.Name
	}
	for _, p := range policies {
		kind := cmp.Or(p.Kind, KindGlobalNetworkPolicy)
		tier := p.TierName()
		switch {
		case !known[tier]:
			out = append(out, TierProblem{Kind: kind, Name: p.Metadata.Name,
				FieldError: FieldError{"spec.tier", fmt.Sprintf("tier %q does not exist: the policy is ignored until it does", tier)}})
		case tier == last:
			for _, f := range passFields(&p.Spec) {
				out = append(out, TierProblem{Kind: kind, Name: p.Metadata.Name,
					FieldError: FieldError{f, fmt.Sprintf("Pass in tier %s, the last tier: there is no next tier to pass to", tier)}})
			}
		}
	}
	return out
}

func passFields(s *GlobalNetworkPolicySpec) []string {
	var out []string
	for i, r := range s.Ingress {
		if r.Action == ActionPass {
			out = append(out, idx("spec.ingress", i)+".action")
		}
	}
	for i, r := range s.Egress {
		if r.Action == ActionPass {
			out = append(out, idx("spec.egress", i)+".action")
		}
	}
	return out
}
