package dataplane

import (
	"context"
	"fmt"

	"github.com/tabbynet/tabby/policy"
)

// RuleCounters reads the counters of the rules with an Origin with one
// `iptables-save -c` of every table (and one `ip6tables-save -c`), not a
// command per chain or rule, and sums them by origin over both families.
// A rule is known by the origin ID in its comment, mapped to its origin
// through the last Apply. Thread-safe; an Apply is not held up by it.
func (f *LinuxFirewall) RuleCounters(ctx context.Context) ([]RuleCounter, error) {
	sums := map[string]iptCounts{}
	var origins []*policy.Origin
	seen := map[string]bool{}
	for _, fw := range []*LinuxFirewall{f, f.six} {
		if fw == nil {
			continue
		}
		fw.mu.Lock()
		os := fw.origins
		fw.mu.Unlock()
		for _, o := range os {
			if id := o.ID(); !seen[id] {
				seen[id] = true
				origins = append(origins, o)
			}
		}
		out, err := fw.exec(ctx, nil, fw.save, "-c")
		if err != nil {
			return nil, fmt.Errorf("reading rule counters: %w", err)
		}
		if err := parseSaveCounters(string(out), sums); err != nil {
			return nil, fmt.Errorf("reading rule counters (%s): %w", fw.save, err)
		}
	}
	return countersByOrigin(sums, origins), nil
}
