package policy

import (
	"fmt"
	"strings"
)

// Test helpers over a compiled Ruleset: lookups and a text rendering.

// Lines renders the ruleset as text for tests and debugging, in the
// model's nft-like notation: per table the hooks and chains, then the
// sets.
func (r *Ruleset) Lines() []string {
	var out []string
	for _, table := range []string{TableFilter, TableNAT} {
		out = append(out, "table "+table)
		for _, j := range r.Jumps {
			if j.Table == table {
				out = append(out, fmt.Sprintf("hook %s jump %s", j.From, j.To))
			}
		}
		for _, c := range r.Chains {
			if c.Table != table {
				continue
			}
			out = append(out, "chain "+c.Name)
			if d := c.Dispatch; d != nil {
				key := "iifname"
				if d.Out {
					key = "oifname"
				}
				var els []string
				for _, t := range d.Targets {
					els = append(els, fmt.Sprintf("%q : goto %s", t.Iface, t.Chain))
				}
				out = append(out, "  "+key+" vmap { "+strings.Join(els, ", ")+" } else drop")
			}
			for _, rule := range c.Rules {
				out = append(out, "  "+rule.String())
			}
		}
	}
	for _, s := range r.Sets {
		out = append(out, "set "+s.Name+" "+s.Family.String()+" "+string(s.Type)+" { "+strings.Join(s.Members(), ", ")+" }")
	}
	return out
}
