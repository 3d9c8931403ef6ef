package policy

import (
	"fmt"
	"slices"
	"strings"
)

// Test helpers over a compiled Ruleset: lookups, a text rendering and the
// per-endpoint rule count the benchmark reports.

// Chain returns the named chain of the table, if the ruleset has it.
func (r *Ruleset) Chain(table, name string) (Chain, bool) {
	i := slices.IndexFunc(r.Chains, func(c Chain) bool { return c.Table == table && c.Name == name })
	if i < 0 {
		return Chain{}, false
	}
	return r.Chains[i], true
}

// Set returns the named set, if the ruleset has it.
func (r *Ruleset) Set(name string) (IPSet, bool) {
	i := slices.IndexFunc(r.Sets, func(s IPSet) bool { return s.Name == name })
	if i < 0 {
		return IPSet{}, false
	}
	return r.Sets[i], true
}

// Lines renders the ruleset as text for tests and debugging: per table an
// iptables-save-like section, then "create"/"add" lines as ipset save
// prints them.
func (r *Ruleset) Lines() []string {
	var out []string
	for _, table := range []string{TableFilter, TableNAT} {
		out = append(out, "*"+table)
		for _, j := range r.Jumps {
			if j.Table == table {
				out = append(out, fmt.Sprintf("-I %s -j %s", j.From, j.To))
			}
		}
		for _, c := range r.Chains {
			if c.Table == table {
				out = append(out, ":"+c.Name)
			}
		}
		for _, c := range r.Chains {
			if c.Table != table {
				continue
			}
			for _, rule := range c.Rules {
				out = append(out, "-A "+c.Name+" "+rule.String())
			}
		}
	}
	for _, s := range r.Sets {
		out = append(out, "create "+s.Name+" "+s.Type)
		for _, m := range s.Members {
			out = append(out, "add "+s.Name+" "+m)
		}
	}
	return out
}

// RulesPerEndpoint counts the rules in the chains that exist because of
// local endpoints (their dispatch entries, anti-spoofing and endpoint
// chains), divided by the number of local endpoints; 0 without any.
func (r *Ruleset) RulesPerEndpoint() float64 {
	n, rules := 0, 0
	for _, c := range r.Chains {
		switch {
		case strings.HasPrefix(c.Name, "tabby-tw-"):
			n++
			rules += len(c.Rules)
		case strings.HasPrefix(c.Name, "tabby-fw-"), strings.HasPrefix(c.Name, "tabby-sp-"):
			rules += len(c.Rules)
		case strings.HasPrefix(c.Name, ChainFromWL), strings.HasPrefix(c.Name, ChainToWL):
			for _, rule := range c.Rules {
				if slices.Contains(rule, "-g") && slices.ContainsFunc(rule, func(a string) bool {
					return strings.HasPrefix(a, "tabby-tw-") || strings.HasPrefix(a, "tabby-fw-")
				}) {
					rules++
				}
			}
		}
	}
	if n == 0 {
		return 0
	}
	return float64(rules) / float64(n)
}
