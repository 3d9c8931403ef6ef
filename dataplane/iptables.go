package dataplane

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/tabbynet/tabby/policy"
)

// IPTChain is one Tabby chain rendered for iptables: each rule is the
// arguments that follow "-A <Name>".
type IPTChain struct {
	Table string // "filter", "nat", …
	Name  string // starts with FirewallPrefix
	Rules [][]string
	// Origins, when not nil, holds each rule's policy.Origin (nil for
	// Tabby's own rules and NFLOG rules): it is part of the rule's
	// identity and goes into its comment, where RuleCounters reads it.
	Origins []*policy.Origin
}

// origin is rule i's origin.
func (c IPTChain) origin(i int) *policy.Origin {
	if i < len(c.Origins) {
		return c.Origins[i]
	}
	return nil
}

// IPSet is one Tabby ipset. Members are in ipset's syntax:
// "10.244.0.0/16" for hash:net, "10.244.1.5,tcp:8080" for hash:ip,port.
type IPSet struct {
	Name    string
	Type    string
	Family  policy.Family // "family inet" or "inet6"
	Members []string
}

// IPTablesState is a FirewallState rendered for iptables and ipset.
type IPTablesState struct {
	Chains []IPTChain
	Jumps  []policy.Jump
	Sets   []IPSet
}

// ruleHashes returns each rule's identity: a hash over the chain name, the
// previous rule's hash and the rule, so that equal hash lists mean equal
// chains.
func ruleHashes(c IPTChain) []string {
	out := make([]string, len(c.Rules))
	prev := ""
	for i, r := range c.Rules {
		h := sha256.New()
		fmt.Fprintf(h, "%s\x00%s\x00%s", c.Name, prev, strings.Join(r, "\x00"))
		if o := c.origin(i); o != nil {
			fmt.Fprintf(h, "\x00origin %s", o)
		}
		prev = base64.RawURLEncoding.EncodeToString(h.Sum(nil))[:16]
		out[i] = prev
	}
	return out
}

// hashComment marks a rule with its identity and, after a comma, the ID
// of its origin: "tabby:<hash>,<origin id>" (29 characters, well under the
// 256 of the comment match).
func hashComment(h string, o *policy.Origin) []string {
	c := "tabby:" + h
	if o != nil {
		c += "," + o.ID()
	}
	return []string{"-m", "comment", "--comment", c}
}

var hashRE = regexp.MustCompile(`--comment "?tabby:([A-Za-z0-9_-]{16})`)

// tableState is what iptables-save says about one table.
type tableState struct {
	// chains maps each chain to the hashes of its rules ("" for a rule
	// without one).
	chains map[string][]string
	// rules maps each chain to its rules' arguments.
	rules map[string][][]string
	// builtin holds the kernel's base chains (those with a policy).
	builtin map[string]bool
}

// forgetRule removes the first rule of r.chain with r's arguments.
func (ts tableState) forgetRule(r baseRule) {
	rules := ts.rules[r.chain]
	for i, args := range rules {
		if slices.Equal(args, r.args) {
			ts.rules[r.chain] = slices.Delete(rules, i, i+1)
			if h := ts.chains[r.chain]; i < len(h) {
				ts.chains[r.chain] = slices.Delete(h, i, i+1)
			}
			return
		}
	}
}

// parseSave reads one table of iptables-save output.
func parseSave(out string) (tableState, error) {
	ts := tableState{chains: map[string][]string{}, rules: map[string][][]string{}, builtin: map[string]bool{}}
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, ":"):
			name, rest, _ := strings.Cut(line[1:], " ")
			if _, ok := ts.chains[name]; !ok {
				ts.chains[name] = []string{}
			}
			if policy, _, _ := strings.Cut(rest, " "); policy != "-" && policy != "" {
				ts.builtin[name] = true
			}
		case strings.HasPrefix(line, "-A "):
			args, err := splitArgs(line[3:])
			if err != nil {
				return tableState{}, fmt.Errorf("parsing %q: %w", line, err)
			}
			if len(args) == 0 {
				continue
			}
			chain := args[0]
			h := ""
			if m := hashRE.FindStringSubmatch(line); m != nil {
				h = m[1]
			}
			ts.chains[chain] = append(ts.chains[chain], h)
			ts.rules[chain] = append(ts.rules[chain], args[1:])
		}
	}
	return ts, nil
}

// splitArgs splits a rule line into arguments, honouring double quotes and
// backslash escapes inside them, as iptables-save writes them.
func splitArgs(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inQuote, have := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case inQuote && c == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case c == '"':
			inQuote = !inQuote
			have = true
		case !inQuote && (c == ' ' || c == '\t'):
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteByte(c)
			have = true
		}
	}
	if inQuote {
		return nil, fmt.Errorf("unterminated quote")
	}
	if have {
		out = append(out, cur.String())
	}
	return out, nil
}

// quoteArg quotes an argument for iptables-restore when it needs it.
func quoteArg(a string) string {
	if a != "" && !strings.ContainsAny(a, " \t\"'\\") {
		return a
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(a) + `"`
}

// tablePlan is what one table needs.
type tablePlan struct {
	table  string
	write  []IPTChain // chains to create or rewrite
	delete []string   // tabby chains to remove
	// staleJumps are rules in base (built-in) chains that jump to tabby
	// chains and are not desired; they go before the restore, which may delete their
	// targets.
	staleJumps []baseRule
	// missingJumps are desired jumps absent from the kernel; firstJumps
	// desired jumps present but not exactly once and first in their base
	// chain (another tool inserted rules above, or a copy was appended):
	// they are put back on top and the other copies deleted.
	missingJumps []policy.Jump
	firstJumps   []policy.Jump
}

// baseRule is a rule in a base chain.
type baseRule struct {
	chain string
	args  []string
}

// planTable diffs the desired chains and jumps of one table against the
// kernel's.
func planTable(table string, desired []IPTChain, jumps []policy.Jump, ts tableState) tablePlan {
	p := tablePlan{table: table}
	want := map[string]bool{}
	for _, c := range desired {
		want[c.Name] = true
		if !slices.Equal(ts.chains[c.Name], ruleHashes(c)) || !hasChain(ts, c.Name) {
			p.write = append(p.write, c)
		}
	}
	for name := range ts.chains {
		if strings.HasPrefix(name, FirewallPrefix) && !want[name] {
			p.delete = append(p.delete, name)
		}
	}
	slices.Sort(p.delete)
	type jumpKey struct{ from, to string }
	wantJump := map[jumpKey]bool{}
	for _, j := range jumps {
		wantJump[jumpKey{j.From, j.To}] = true
	}
	found := map[jumpKey]int{}
	// misplaced: a desired jump below a foreign rule (stale Tabby jumps,
	// deleted first, and Tabby's other desired jumps do not count).
	misplaced := map[jumpKey]bool{}
	for chain, rules := range ts.rules {
		// Jumps live in base chains only; a user chain of someone else
		// that references a Tabby chain is not ours to change.
		if !ts.builtin[chain] {
			continue
		}
		above := 0
		for _, args := range rules {
			to := jumpTarget(args)
			k := jumpKey{chain, to}
			switch {
			case !strings.HasPrefix(to, FirewallPrefix):
				above++
			case !wantJump[k]:
				p.staleJumps = append(p.staleJumps, baseRule{chain, args})
			default:
				// Tabby's jumps on top of a base chain are all first,
				// in any order (INPUT has tabby-INPUT and the tunnel
				// guard's): only a foreign rule above one misplaces it.
				if found[k]++; found[k] > 1 || above > 0 {
					misplaced[k] = true
				}
			}
		}
	}
	slices.SortFunc(p.staleJumps, func(a, b baseRule) int { return strings.Compare(a.chain, b.chain) })
	for _, j := range jumps {
		switch k := (jumpKey{j.From, j.To}); {
		case found[k] == 0:
			p.missingJumps = append(p.missingJumps, j)
		case misplaced[k]:
			p.firstJumps = append(p.firstJumps, j)
		}
	}
	return p
}

// jumpRuleNumbers returns the rule numbers (1-based) of the rules of chain
// that jump to target, in `iptables -S chain` output (a base chain's first
// line is its policy, -P).
func jumpRuleNumbers(lines []string, chain, target string) []int {
	var out []int
	n := 0
	for _, line := range lines {
		rest, ok := strings.CutPrefix(line, "-A "+chain+" ")
		if !ok {
			continue
		}
		n++
		if args, err := splitArgs(rest); err == nil && jumpTarget(args) == target {
			out = append(out, n)
		}
	}
	return out
}

func hasChain(ts tableState, name string) bool {
	_, ok := ts.chains[name]
	return ok
}

// jumpTarget returns the -j or -g target of a rule.
func jumpTarget(args []string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-j" || args[i] == "-g" {
			return args[i+1]
		}
	}
	return ""
}

// restoreInput renders the plan's chain changes for iptables-restore
// --noflush: declaring a chain flushes it, so every written or deleted
// chain is declared first, then the written ones are filled, then the
// deleted ones removed, all in one transaction. withDeletes false leaves
// the deletions out.
func (p tablePlan) restoreInput(withDeletes bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*%s\n", p.table)
	for _, c := range p.write {
		fmt.Fprintf(&b, ":%s - [0:0]\n", c.Name)
	}
	if withDeletes {
		for _, name := range p.delete {
			fmt.Fprintf(&b, ":%s - [0:0]\n", name)
		}
	}
	for _, c := range p.write {
		for i, h := range ruleHashes(c) {
			b.WriteString("-A ")
			b.WriteString(c.Name)
			for _, a := range append(hashComment(h, c.origin(i)), c.Rules[i]...) {
				b.WriteByte(' ')
				b.WriteString(quoteArg(a))
			}
			b.WriteByte('\n')
		}
	}
	if withDeletes {
		for _, name := range p.delete {
			fmt.Fprintf(&b, "-X %s\n", name)
		}
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// empty reports whether the plan changes no chain.
func (p tablePlan) emptyRestore() bool { return len(p.write) == 0 && len(p.delete) == 0 }

// tablesOf lists the tables a state touches plus those always inspected
// for stale Tabby chains, sorted. The mangle table holds host endpoints'
// preDNAT chains: it is inspected too, so that an agent restarted after
// the last host endpoint went removes them.
func tablesOf(s IPTablesState) []string {
	set := map[string]bool{"filter": true, "nat": true, "mangle": true}
	for _, c := range s.Chains {
		set[c.Table] = true
	}
	for _, j := range s.Jumps {
		set[j.Table] = true
	}
	out := make([]string, 0, len(set))
	for t := range set {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}
