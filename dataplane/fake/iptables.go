package fake

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/policy"
)

// Firewall is an in-memory dataplane.Firewall. It keeps Tabby's chains,
// jumps and sets as the iptables backend would program them after each
// Apply (the state goes through dataplane.RenderIPTables, so members are
// normalised as the kernel's), counts what each Apply changed the way that
// backend does (a chain counts as written only when its rules differ), and
// prints its state as iptables-save/ipset-save-like lines. The zero value
// is empty and ready.
type Firewall struct {
	mu sync.Mutex
	failer
	chains  map[string][][]string // "table/name"
	jumps   map[policy.Jump]bool
	sets    map[string]dataplane.IPSet
	applies int
}

var _ dataplane.Firewall = (*Firewall)(nil)

// SetFail makes op ("Apply", "Remove") fail with err from now on; nil clears.
func (f *Firewall) SetFail(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	setFail(&f.failer, op, err)
}

// Apply implements dataplane.Firewall.
func (f *Firewall) Apply(ctx context.Context, state dataplane.FirewallState) (dataplane.ApplyStats, error) {
	if err := dataplane.ValidateFirewallState(state); err != nil {
		return dataplane.ApplyStats{}, err
	}
	desired := dataplane.RenderIPTables(state)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("Apply", ""); err != nil {
		return dataplane.ApplyStats{}, err
	}
	if err := ctx.Err(); err != nil {
		return dataplane.ApplyStats{}, err
	}
	f.applies++
	var st dataplane.ApplyStats
	want := map[string][][]string{}
	for _, c := range desired.Chains {
		k := c.Table + "/" + c.Name
		want[k] = c.Rules
		old, ok := f.chains[k]
		if !ok || !slices.EqualFunc(old, c.Rules, slices.Equal) {
			st.ChainsWritten++
			st.RulesWritten += len(c.Rules)
		}
	}
	for k := range f.chains {
		if _, ok := want[k]; !ok {
			st.ChainsDeleted++
		}
	}
	f.chains = map[string][][]string{}
	for k, rules := range want {
		f.chains[k] = cloneRules(rules)
	}
	jumps := map[policy.Jump]bool{}
	for _, j := range desired.Jumps {
		jumps[j] = true
		if !f.jumps[j] {
			st.JumpsInserted++
		}
	}
	for j := range f.jumps {
		if !jumps[j] {
			st.JumpsDeleted++
		}
	}
	f.jumps = jumps
	sets := map[string]dataplane.IPSet{}
	for _, s := range desired.Sets {
		s.Members = slices.Clone(s.Members)
		slices.Sort(s.Members)
		s.Members = slices.Compact(s.Members)
		old, ok := f.sets[s.Name]
		if !ok || old.Type != s.Type {
			st.SetsCreated++
			old = dataplane.IPSet{}
		}
		for _, m := range s.Members {
			if !slices.Contains(old.Members, m) {
				st.MembersAdded++
			}
		}
		for _, m := range old.Members {
			if !slices.Contains(s.Members, m) {
				st.MembersRemoved++
			}
		}
		sets[s.Name] = s
	}
	for name := range f.sets {
		if _, ok := sets[name]; !ok {
			st.SetsDeleted++
		}
	}
	f.sets = sets
	return st, nil
}

func cloneRules(rules [][]string) [][]string {
	out := make([][]string, len(rules))
	for i, r := range rules {
		out[i] = slices.Clone(r)
	}
	return out
}

// Remove implements dataplane.Firewall.
func (f *Firewall) Remove(ctx context.Context) error {
	f.mu.Lock()
	err := f.fail("Remove", "")
	f.mu.Unlock()
	if err != nil {
		return err
	}
	_, err = f.Apply(ctx, dataplane.FirewallState{})
	return err
}

// Applies returns how many Apply calls succeeded.
func (f *Firewall) Applies() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.applies
}

// Rules returns the rules of a chain as "-A chain args…" lines, and whether
// the chain exists.
func (f *Firewall) Rules(table, chain string) ([]string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rules, ok := f.chains[table+"/"+chain]
	var out []string
	for _, r := range rules {
		out = append(out, "-A "+chain+" "+strings.Join(r, " "))
	}
	return out, ok
}

// Set returns a set's members, and whether it exists.
func (f *Firewall) Set(name string) ([]string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sets[name]
	return slices.Clone(s.Members), ok
}

// Lines prints the whole state: jumps, chains and rules per table, then sets.
func (f *Firewall) Lines() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, k := range slices.Sorted(maps.Keys(f.chains)) {
		table, name, _ := strings.Cut(k, "/")
		out = append(out, fmt.Sprintf("*%s :%s", table, name))
		for _, r := range f.chains[k] {
			out = append(out, fmt.Sprintf("*%s -A %s %s", table, name, strings.Join(r, " ")))
		}
	}
	var jumps []string
	for j := range f.jumps {
		jumps = append(jumps, fmt.Sprintf("*%s -I %s -j %s", j.Table, j.From, j.To))
	}
	slices.Sort(jumps)
	out = append(out, jumps...)
	for _, name := range slices.Sorted(maps.Keys(f.sets)) {
		s := f.sets[name]
		out = append(out, "create "+name+" "+s.Type)
		for _, m := range s.Members {
			out = append(out, "add "+name+" "+m)
		}
	}
	return out
}
