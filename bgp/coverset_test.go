package bgp

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestCoverPrefixes(t *testing.T) {
	run := func(first string, n int) []netip.Addr {
		a := netip.MustParseAddr(first)
		var out []netip.Addr
		for range n {
			out = append(out, a)
			a = a.Next()
		}
		return out
	}
	addrs := func(ss ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	for _, tc := range []struct {
		name string
		in   []netip.Addr
		want []string
	}{
		{"none", nil, []string{}},
		{"one", addrs("198.18.0.11"), []string{"198.18.0.11/32"}},
		{"siblings", addrs("198.18.0.12", "198.18.0.13"), []string{"198.18.0.12/31"}},
		{"not siblings", addrs("198.18.0.11", "198.18.0.12"), []string{"198.18.0.11/32", "198.18.0.12/32"}},
		{"unsorted and repeated", addrs("198.18.0.13", "198.18.0.12", "198.18.0.13"), []string{"198.18.0.12/31"}},
		{"simulated nodes", run("198.18.4.0", 1024), []string{"198.18.4.0/22"}},
		{"a run off alignment", run("198.18.0.11", 6), []string{"198.18.0.11/32", "198.18.0.12/30", "198.18.0.16/32"}},
		{"nodes and a ToR left out", append(run("198.18.0.2", 2), run("198.18.0.4", 4)...), []string{"198.18.0.2/31", "198.18.0.4/30"}},
		{"both families", addrs("fd00:198:18::2", "198.18.0.2", "fd00:198:18::3", "198.18.0.3"), []string{"198.18.0.2/31", "fd00:198:18::2/127"}},
		{"mapped and invalid", []netip.Addr{netip.MustParseAddr("::ffff:198.18.0.2"), {}}, []string{"198.18.0.2/32"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, coverPrefixes(tc.in)); diff != "" {
				t.Errorf("coverPrefixes (-want +got):\n%s", diff)
			}
		})
	}
}

// The cover holds exactly the addresses given: every address of a /22 is
// in it if and only if it was given, for random subsets.
func TestCoverPrefixesExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	base := netip.MustParsePrefix("198.18.4.0/22")
	for round := range 200 {
		given := map[netip.Addr]bool{}
		var in []netip.Addr
		density := rng.Float64()
		for a := base.Addr(); base.Contains(a); a = a.Next() {
			if rng.Float64() < density {
				given[a] = true
				in = append(in, a)
			}
		}
		rng.Shuffle(len(in), func(i, j int) { in[i], in[j] = in[j], in[i] })
		var cover []netip.Prefix
		for _, s := range coverPrefixes(in) {
			cover = append(cover, netip.MustParsePrefix(s))
		}
		// Every address of the /22 and one on either side of it.
		last := netip.MustParseAddr("198.18.8.0")
		for a := base.Addr().Prev(); a.Compare(last) <= 0; a = a.Next() {
			in := false
			for _, p := range cover {
				in = in || p.Contains(a)
			}
			if in != given[a] {
				t.Fatalf("round %d: %s in the cover %v, given %v", round, a, in, given[a])
			}
		}
		// No two prefixes of the cover could merge.
		for i := 1; i < len(cover); i++ {
			if _, ok := siblingsParent(cover[i-1], cover[i]); ok {
				t.Fatalf("round %d: %s and %s left unmerged", round, cover[i-1], cover[i])
			}
		}
	}
}
