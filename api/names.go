package api

import "strings"

// The name checks are byte loops, not regular expressions: every endpoint
// the cluster view receives is validated (its name, namespace, node, pod,
// container ID and each label), and the regexps were a third of that
// (docs/scale.md). names_test.go holds the regexps they replace and checks
// that both agree.

func isLowerAlnum(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }

func isAlnum(c byte) bool { return isLowerAlnum(c) || c >= 'A' && c <= 'Z' }

// isDNSLabel matches ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ (any length).
func isDNSLabel(s string) bool {
	if s == "" || !isLowerAlnum(s[0]) || !isLowerAlnum(s[len(s)-1]) {
		return false
	}
	for i := 1; i < len(s)-1; i++ {
		if c := s[i]; !isLowerAlnum(c) && c != '-' {
			return false
		}
	}
	return true
}

// isDNSSubdomain matches DNS labels joined by '.' (any length).
func isDNSSubdomain(s string) bool {
	for {
		label, rest, more := strings.Cut(s, ".")
		if !isDNSLabel(label) {
			return false
		}
		if !more {
			return true
		}
		s = rest
	}
}

// isQualifiedName matches ^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$ (any
// length): a label key's name, or a label value.
func isQualifiedName(s string) bool {
	if s == "" || !isAlnum(s[0]) || !isAlnum(s[len(s)-1]) {
		return false
	}
	for i := 1; i < len(s)-1; i++ {
		if c := s[i]; !isAlnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

// isContainerID matches ^[A-Za-z0-9][A-Za-z0-9_.\-]*$.
func isContainerID(s string) bool {
	if s == "" || !isAlnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}
