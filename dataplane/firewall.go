package dataplane

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/tabbynet/tabby/policy"
)

// FirewallPrefix starts the name of every chain and set Tabby owns. A
// Firewall never changes or removes anything without it, except the jump
// rules to its own chains in iptables' base chains and the nftables table
// NFTTable, which is Tabby's entirely.
const FirewallPrefix = policy.Prefix

// Firewall backends.
const (
	FirewallNFTables = "nftables"
	FirewallIPTables = "iptables"
)

// ErrStaleCleanup wraps the errors of removing stale Tabby state (a chain
// something else still references, a set still in use). The desired state
// is in place despite them; callers may treat them as warnings.
var ErrStaleCleanup = errors.New("removing stale firewall state")

// FirewallState is everything Tabby wants in the node's packet filter: the
// policy compiler's backend-neutral ruleset, rendered by each backend
// (RenderIPTables, the nftables backend). A state passed to Apply must not
// be modified afterwards: the nftables backend skips chains and sets whose
// rules and members are the very slices of its last Apply (as a
// policy.Compiler shares them between passes).
type FirewallState = policy.Ruleset

// ApplyStats counts what one Apply changed.
type ApplyStats struct {
	ChainsWritten  int // created or rewritten
	RulesWritten   int // rules in the chains written
	ChainsDeleted  int
	JumpsInserted  int
	JumpsDeleted   int
	SetsCreated    int
	SetsDeleted    int
	MembersAdded   int // set and dispatch-map elements
	MembersRemoved int
}

// Changed reports whether Apply changed anything.
func (s ApplyStats) Changed() bool { return s != ApplyStats{} }

func addStats(dst *ApplyStats, s ApplyStats) {
	dst.ChainsWritten += s.ChainsWritten
	dst.RulesWritten += s.RulesWritten
	dst.ChainsDeleted += s.ChainsDeleted
	dst.JumpsInserted += s.JumpsInserted
	dst.JumpsDeleted += s.JumpsDeleted
	dst.SetsCreated += s.SetsCreated
	dst.SetsDeleted += s.SetsDeleted
	dst.MembersAdded += s.MembersAdded
	dst.MembersRemoved += s.MembersRemoved
}

// Firewall programs Tabby's packet filter: chains, hooks and sets.
// Implementations are safe for concurrent use; calls are serialised.
type Firewall interface {
	// Apply makes the kernel's Tabby state equal to desired: sets are
	// created and filled before the rules that use them, changed chains
	// are rewritten atomically, state Tabby owns that is not desired is
	// removed. Unchanged chains and sets are not touched, so a repeated
	// Apply of the same state changes nothing; Apply also repairs what
	// was changed behind its back. It keeps going after a failure and
	// returns every error joined.
	Apply(ctx context.Context, desired FirewallState) (ApplyStats, error)
	// Remove deletes everything Tabby owns in this backend; missing state
	// is success.
	Remove(ctx context.Context) error
}

// ValidateFirewallState reports every name that Tabby does not own and so
// must not program.
func ValidateFirewallState(s FirewallState) error {
	var bad []string
	type key struct{ table, name string }
	// The compiler lists chains sorted by table and name: then no chain
	// comes twice, and the map is not needed.
	sorted := slices.IsSortedFunc(s.Chains, func(a, b policy.Chain) int {
		return cmp.Or(cmp.Compare(a.Table, b.Table), cmp.Compare(a.Name, b.Name))
	})
	var seen map[key]bool
	if !sorted {
		seen = make(map[key]bool, len(s.Chains))
	}
	for i, c := range s.Chains {
		if !strings.HasPrefix(c.Name, FirewallPrefix) || len(c.Name) > policy.MaxChainName {
			bad = append(bad, fmt.Sprintf("chain %q: not a tabby chain name (prefix %q, at most %d characters)", c.Name, FirewallPrefix, policy.MaxChainName))
		}
		if sorted {
			if i > 0 && s.Chains[i-1].Table == c.Table && s.Chains[i-1].Name == c.Name {
				bad = append(bad, fmt.Sprintf("chain %s/%s listed twice", c.Table, c.Name))
			}
		} else {
			if k := (key{c.Table, c.Name}); seen[k] {
				bad = append(bad, fmt.Sprintf("chain %s/%s listed twice", c.Table, c.Name))
			}
			seen[key{c.Table, c.Name}] = true
		}
		if c.Dispatch != nil && len(c.Rules) > 0 {
			bad = append(bad, fmt.Sprintf("chain %s: a dispatch chain with rules", c.Name))
		}
	}
	for _, j := range s.Jumps {
		if !strings.HasPrefix(j.To, FirewallPrefix) || strings.HasPrefix(j.From, FirewallPrefix) {
			bad = append(bad, fmt.Sprintf("jump %s -> %s: must go from a base chain to a tabby chain", j.From, j.To))
		}
	}
	for _, set := range s.Sets {
		if !strings.HasPrefix(set.Name, FirewallPrefix) || len(set.Name) > policy.MaxSetName {
			bad = append(bad, fmt.Sprintf("set %q: not a tabby set name", set.Name))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("invalid firewall state: %s", strings.Join(bad, "; "))
	}
	return nil
}
