package policy

import (
	"fmt"
	"slices"
)

// Test helpers over a compiled Ruleset: lookups and a text rendering.

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
