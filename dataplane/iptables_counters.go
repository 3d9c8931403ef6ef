package dataplane

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/tabbynet/tabby/policy"
)

// iptCounts is the packet and byte count of one origin's kernel rules.
type iptCounts struct{ packets, bytes uint64 }

// parseSaveCounters adds up the counters of `iptables-save -c` output per
// origin ID (the ID in a rule's hash comment, hashComment): a policy rule
// that became several kernel rules is one sum. Rules without an origin are
// left out. It reads the output line by line; memory is bounded by the
// number of origins.
func parseSaveCounters(out string, sums map[string]iptCounts) error {
	for line := range strings.Lines(out) {
		if !strings.HasPrefix(line, "[") || !strings.Contains(line, "] -A ") {
			continue
		}
		id, ok := commentOrigin(line)
		if !ok {
			continue
		}
		pb, _, _ := strings.Cut(line[1:], "]")
		p, b, ok := strings.Cut(pb, ":")
		if !ok {
			return fmt.Errorf("counters %q: want [packets:bytes]", pb)
		}
		packets, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return fmt.Errorf("counters %q: %w", pb, err)
		}
		bytes, err := strconv.ParseUint(b, 10, 64)
		if err != nil {
			return fmt.Errorf("counters %q: %w", pb, err)
		}
		c := sums[id]
		c.packets += packets
		c.bytes += bytes
		sums[id] = c
	}
	return nil
}

// commentOrigin finds the origin ID in a saved rule's hash comment
// (`--comment "tabby:<16 characters>,<origin id>"`, quoted or not),
// without a regular expression: a scrape reads every rule of the node.
func commentOrigin(line string) (string, bool) {
	const tag, hashLen, idLen = "--comment ", 16, 12
	for {
		i := strings.Index(line, tag)
		if i < 0 {
			return "", false
		}
		line = strings.TrimPrefix(line[i+len(tag):], `"`)
		rest, ok := strings.CutPrefix(line, "tabby:")
		if !ok || len(rest) < hashLen+1+idLen || rest[hashLen] != ',' {
			continue
		}
		id := rest[hashLen+1 : hashLen+1+idLen]
		if strings.Trim(id, "abcdefghijklmnopqrstuvwxyz234567") == "" {
			return id, true
		}
	}
}

// countersByOrigin turns sums by origin ID into RuleCounters, in the order
// of origins (those the last Apply wrote); IDs of no known origin (rules
// of an earlier agent, an Apply in between) are left out.
func countersByOrigin(sums map[string]iptCounts, origins []*policy.Origin) []RuleCounter {
	var out []RuleCounter
	for _, o := range origins {
		if c, ok := sums[o.ID()]; ok {
			out = append(out, RuleCounter{Origin: o, Packets: c.packets, Bytes: c.bytes})
		}
	}
	return out
}

// originsOf lists the origins of the chains' rules, each once, in order.
func originsOf(chains []IPTChain) []*policy.Origin {
	var out []*policy.Origin
	seen := map[string]bool{}
	for _, c := range chains {
		for _, o := range c.Origins {
			if o != nil && !seen[o.ID()] {
				seen[o.ID()] = true
				out = append(out, o)
			}
		}
	}
	return out
}
