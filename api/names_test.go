package api

import (
	"regexp"
	"testing"
)

// The regexps the name checks replaced: the checks must match exactly
// the strings these match.
var nameRegexps = []struct {
	name string
	re   *regexp.Regexp
	fn   func(string) bool
}{
	{"dns label", regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`), isDNSLabel},
	{"dns subdomain", regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`), isDNSSubdomain},
	{"qualified name", regexp.MustCompile(`^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`), isQualifiedName},
	{"container id", regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.\-]*$`), isContainerID},
}

var nameSamples = []string{
	"", "a", "A", "0", "-", ".", "_", "a-", "-a", "a.b", "a..b", ".a", "a.", "a-b", "a--b", "a_b", "a_", "Ab", "aB",
	"web-5d8f7c9b4", "kubernetes.io", "kubernetes.io/metadata.name", "k8s-pod-network", "x.y-z.w", "x.-y", "x-.y",
	"0123456789abcdef", "café", "a\x00b", "a\nb", "a b", "a/b", "a\u00e9", "\xff", "a\xffb", "ab\n", "UPPER", "Mixed.Case_1",
}

func TestNameChecksMatchTheirRegexps(t *testing.T) {
	for _, c := range nameRegexps {
		for _, s := range nameSamples {
			if got, want := c.fn(s), c.re.MatchString(s); got != want {
				t.Errorf("%s(%q) = %v, the regexp says %v", c.name, s, got, want)
			}
		}
	}
}

func FuzzNameChecks(f *testing.F) {
	for _, s := range nameSamples {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, c := range nameRegexps {
			if got, want := c.fn(s), c.re.MatchString(s); got != want {
				t.Errorf("%s(%q) = %v, the regexp says %v", c.name, s, got, want)
			}
		}
	})
}
