package api

import (
	"slices"
	"strings"
)

// Matches reports whether labels satisfy the selector, with Kubernetes
// semantics: every matchLabels entry and every expression must hold; NotIn
// and DoesNotExist hold for a missing key. A nil selector matches nothing,
// an empty one everything. An expression with an unknown operator matches
// nothing (Validate rejects it).
func (s *LabelSelector) Matches(labels map[string]string) bool {
	if s == nil {
		return false
	}
	for k, v := range s.MatchLabels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	for _, r := range s.MatchExpressions {
		if !r.Matches(labels) {
			return false
		}
	}
	return true
}

// Matches reports whether labels satisfy the one requirement.
func (r LabelSelectorRequirement) Matches(labels map[string]string) bool {
	v, ok := labels[r.Key]
	switch r.Operator {
	case OpIn:
		return ok && slices.Contains(r.Values, v)
	case OpNotIn:
		return !ok || !slices.Contains(r.Values, v)
	case OpExists:
		return ok
	case OpDoesNotExist:
		return !ok
	}
	return false
}

// IsEmpty reports whether the selector is non-nil and has no terms, and so
// selects everything.
func (s *LabelSelector) IsEmpty() bool {
	return s != nil && len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0
}

// String renders the selector the way kubectl does: terms sorted by key,
// "app=web,tier in (a,b),!legacy". An empty selector renders as "" (it
// selects everything), a nil one as "<none>" (it selects nothing).
func (s *LabelSelector) String() string {
	if s == nil {
		return "<none>"
	}
	type term struct{ key, text string }
	terms := make([]term, 0, len(s.MatchLabels)+len(s.MatchExpressions))
	for k, v := range s.MatchLabels {
		terms = append(terms, term{k, k + "=" + v})
	}
	for _, r := range s.MatchExpressions {
		terms = append(terms, term{r.Key, r.String()})
	}
	slices.SortStableFunc(terms, func(a, b term) int { return strings.Compare(a.key, b.key) })
	parts := make([]string, len(terms))
	for i, t := range terms {
		parts[i] = t.text
	}
	return strings.Join(parts, ",")
}

// String renders one requirement: "k in (a,b)", "k notin (a)", "k", "!k".
func (r LabelSelectorRequirement) String() string {
	values := func() string {
		v := slices.Clone(r.Values)
		slices.Sort(v)
		return "(" + strings.Join(v, ",") + ")"
	}
	switch r.Operator {
	case OpIn:
		return r.Key + " in " + values()
	case OpNotIn:
		return r.Key + " notin " + values()
	case OpExists:
		return r.Key
	case OpDoesNotExist:
		return "!" + r.Key
	}
	return r.Key + " " + r.Operator + " " + values()
}
