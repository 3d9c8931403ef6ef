package bgp

import (
	"slices"

	"github.com/tabbynet/tabby/api"
)

// selectorMatches reports whether labels satisfy sel with Kubernetes
// semantics: a nil selector matches nothing, an empty one everything.
//
// TODO: switch to api.LabelSelector.Matches once package api offers it.
func selectorMatches(sel *api.LabelSelector, labels map[string]string) bool {
	if sel == nil {
		return false
	}
	for k, v := range sel.MatchLabels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	for _, r := range sel.MatchExpressions {
		v, ok := labels[r.Key]
		switch r.Operator {
		case api.OpIn:
			if !ok || !slices.Contains(r.Values, v) {
				return false
			}
		case api.OpNotIn:
			if ok && slices.Contains(r.Values, v) {
				return false
			}
		case api.OpExists:
			if !ok {
				return false
			}
		case api.OpDoesNotExist:
			if ok {
				return false
			}
		default:
			return false
		}
	}
	return true
}
