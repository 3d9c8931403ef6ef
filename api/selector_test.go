package api

import "testing"

func TestSelectorMatches(t *testing.T) {
	labels := map[string]string{"app": "web", "tier": "front", "env": ""}
	req := func(k, op string, vals ...string) LabelSelectorRequirement {
		return LabelSelectorRequirement{Key: k, Operator: op, Values: vals}
	}
	tests := []struct {
		name   string
		sel    *LabelSelector
		labels map[string]string
		want   bool
	}{
		{"nil selects nothing", nil, labels, false},
		{"nil with nil labels", nil, nil, false},
		{"empty selects everything", &LabelSelector{}, labels, true},
		{"empty selects unlabelled", &LabelSelector{}, nil, true},
		{"matchLabels hit", &LabelSelector{MatchLabels: map[string]string{"app": "web"}}, labels, true},
		{"matchLabels wrong value", &LabelSelector{MatchLabels: map[string]string{"app": "db"}}, labels, false},
		{"matchLabels missing key", &LabelSelector{MatchLabels: map[string]string{"zone": "a"}}, labels, false},
		{"matchLabels empty value needs key", &LabelSelector{MatchLabels: map[string]string{"zone": ""}}, labels, false},
		{"matchLabels empty value present", &LabelSelector{MatchLabels: map[string]string{"env": ""}}, labels, true},
		{"all matchLabels must hold", &LabelSelector{MatchLabels: map[string]string{"app": "web", "tier": "back"}}, labels, false},
		{"In hit", &LabelSelector{MatchExpressions: []LabelSelectorRequirement{req("tier", OpIn, "back", "front")}}, labels, true},
		{"In miss", &LabelSelector{MatchExpressions: []LabelSelectorRequirement{req("tier", OpIn, "back")}}, labels, false},
		{"In missing key", &LabelSelector{MatchExpressions: []LabelSelectorRequirement{req("zone", OpIn, "a")}}, labels, false},
		{"NotIn hit", &LabelSelector{MatchExpressions: []LabelSelectorRequirement{req("tier", OpNotIn, "back")}}, labels, true},
		{"NotIn miss", &LabelSelector{MatchExpressions: []LabelSelectorRequirement{req("tier", OpNotIn, "front")}}, labels, false},
		{"NotIn missing key matches", &LabelSelector{MatchExpressions: []LabelSelectorRequirement{req("zone", OpNotIn, "a")}}, labels, true},
		{"Exists", &LabelSelector{MatchExpressions: []LabelSelectorRequirement{req("env", OpExists)}}, labels, true},
		{"Exists missing", &LabelSelector{MatchExpressions: []LabelSelectorRequirement{req("zone", OpExists)}}, labels, false},
		{"DoesNotExist", &LabelSelector{MatchExpressions: []LabelSelectorRequirement{req("zone", OpDoesNotExist)}}, labels, true},
		{"DoesNotExist present", &LabelSelector{MatchExpressions: []LabelSelectorRequirement{req("app", OpDoesNotExist)}}, labels, false},
		{"unknown operator matches nothing", &LabelSelector{MatchExpressions: []LabelSelectorRequirement{req("app", "Equals", "web")}}, labels, false},
		{"labels and expressions combined", &LabelSelector{
			MatchLabels:      map[string]string{"app": "web"},
			MatchExpressions: []LabelSelectorRequirement{req("tier", OpIn, "front"), req("legacy", OpDoesNotExist)},
		}, labels, true},
		{"one failing expression fails all", &LabelSelector{
			MatchLabels:      map[string]string{"app": "web"},
			MatchExpressions: []LabelSelectorRequirement{req("tier", OpIn, "front"), req("app", OpNotIn, "web")},
		}, labels, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.sel.Matches(tt.labels); got != tt.want {
				t.Errorf("%s.Matches(%v) = %v, want %v", tt.sel, tt.labels, got, tt.want)
			}
		})
	}
}

func TestSelectorString(t *testing.T) {
	tests := []struct {
		sel  *LabelSelector
		want string
	}{
		{nil, "<none>"},
		{&LabelSelector{}, ""},
		{&LabelSelector{MatchLabels: map[string]string{"tier": "front", "app": "web"}}, "app=web,tier=front"},
		{&LabelSelector{
			MatchLabels: map[string]string{"app": "web"},
			MatchExpressions: []LabelSelectorRequirement{
				{Key: "tier", Operator: OpIn, Values: []string{"b", "a"}},
				{Key: "zone", Operator: OpNotIn, Values: []string{"x"}},
				{Key: "legacy", Operator: OpDoesNotExist},
				{Key: "env", Operator: OpExists},
			},
		}, "app=web,env,!legacy,tier in (a,b),zone notin (x)"},
	}
	for _, tt := range tests {
		if got := tt.sel.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
}
