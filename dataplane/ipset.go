package dataplane

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/tabbynet/tabby/policy"
)

// Options of every IPv4 set Tabby creates: room for a large cluster.
const ipsetCreateOptions = "family inet hashsize 1024 maxelem 1048576"

// ipsetFamily is ipset's name of a family.
func ipsetFamily(f policy.Family) string {
	if f == policy.IPv6 {
		return "inet6"
	}
	return "inet"
}

// ipsetOptions are the create options of a set of family f.
func ipsetOptions(f policy.Family) string {
	return strings.Replace(ipsetCreateOptions, "family inet", "family "+ipsetFamily(f), 1)
}

// kernelSet is one set as `ipset save` prints it.
type kernelSet struct {
	typ     string
	family  string // "inet" or "inet6"
	members map[string]bool
}

// parseIPSetSave reads `ipset save` output, keeping only Tabby's sets, with
// members normalised (see normMember).
func parseIPSetSave(out string) (map[string]*kernelSet, error) {
	sets := map[string]*kernelSet{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.HasPrefix(f[1], FirewallPrefix) {
			continue
		}
		switch f[0] {
		case "create":
			ks := &kernelSet{typ: f[2], family: "inet", members: map[string]bool{}}
			if i := slices.Index(f, "family"); i > 0 && i+1 < len(f) {
				ks.family = f[i+1]
			}
			sets[f[1]] = ks
		case "add":
			s := sets[f[1]]
			if s == nil {
				return nil, fmt.Errorf("ipset save: member of %s before its create line", f[1])
			}
			s.members[normMember(s.typ, f[2])] = true
		}
	}
	return sets, nil
}

// normMember writes a member the way this package compares them: hash:net
// members as masked prefixes ("10.1.1.1" → "10.1.1.1/32"), everything else
// lowercased.
func normMember(typ, m string) string {
	if typ == "hash:net" {
		if p, err := netip.ParsePrefix(m); err == nil {
			return p.Masked().String()
		}
		if a, err := netip.ParseAddr(m); err == nil {
			return netip.PrefixFrom(a, a.BitLen()).String()
		}
	}
	return strings.ToLower(m)
}

// setPlan is what the sets need: a script for `ipset -exist restore` run
// before the iptables changes (creations, additions, then removals of
// members) and the stale sets to destroy after them.
type setPlan struct {
	script  string
	destroy []string
	stats   ApplyStats
	// want is every desired set with its members normalised: the record
	// of the kernel's sets once the script has run.
	want map[string]*kernelSet
}

// planSets diffs the desired sets of family fam against the kernel's sets
// of that family (the other family's belong to the other table's
// firewall). A set whose type differs is destroyed and created again
// (names encode their type, so this only happens to sets left by
// something else).
func planSets(desired []IPSet, all map[string]*kernelSet, fam policy.Family) setPlan {
	var b strings.Builder
	p := setPlan{want: make(map[string]*kernelSet, len(desired))}
	actual := make(map[string]*kernelSet, len(all))
	for name, s := range all {
		if s.family == ipsetFamily(fam) {
			actual[name] = s
		}
	}
	var dels []string
	for _, s := range desired {
		members := make(map[string]bool, len(s.Members))
		for _, m := range s.Members {
			members[normMember(s.Type, m)] = true
		}
		p.want[s.Name] = &kernelSet{typ: s.Type, family: ipsetFamily(fam), members: members}
		cur := all[s.Name]
		if cur != nil && (cur.typ != s.Type || cur.family != ipsetFamily(fam)) {
			fmt.Fprintf(&b, "destroy %s\n", s.Name)
			cur = nil
		}
		if cur == nil {
			fmt.Fprintf(&b, "create %s %s %s\n", s.Name, s.Type, ipsetOptions(fam))
			p.stats.SetsCreated++
			cur = &kernelSet{typ: s.Type, family: ipsetFamily(fam), members: map[string]bool{}}
		}
		for _, m := range slices.Sorted(maps.Keys(members)) {
			if !cur.members[m] {
				fmt.Fprintf(&b, "add %s %s\n", s.Name, m)
				p.stats.MembersAdded++
			}
		}
		for _, m := range slices.Sorted(maps.Keys(cur.members)) {
			if !members[m] {
				dels = append(dels, fmt.Sprintf("del %s %s\n", s.Name, m))
				p.stats.MembersRemoved++
			}
		}
	}
	// Additions before removals: a member moving between sets is never
	// missing from both.
	for _, d := range dels {
		b.WriteString(d)
	}
	p.script = b.String()
	for name := range actual {
		if p.want[name] == nil {
			p.destroy = append(p.destroy, name)
		}
	}
	slices.Sort(p.destroy)
	return p
}
