package api

import (
	"fmt"
	"math"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// FieldError is one validation problem: the path of the offending field
// ("spec.ingress[0].ports[1].endPort") and what is wrong with it.
type FieldError struct {
	Field  string
	Detail string
}

// Error implements error: "<field>: <detail>".
func (e *FieldError) Error() string { return e.Field + ": " + e.Detail }

// FieldErrors is every problem Validate found, in field order. Validate
// returns it as an error only when it is non-empty. errors.As finds the
// individual *FieldError values.
type FieldErrors []*FieldError

// Error implements error: one problem per line.
func (e FieldErrors) Error() string {
	parts := make([]string, len(e))
	for i, fe := range e {
		parts[i] = fe.Error()
	}
	return strings.Join(parts, "\n")
}

// Unwrap gives errors.Is and errors.As access to each *FieldError.
func (e FieldErrors) Unwrap() []error {
	out := make([]error, len(e))
	for i, fe := range e {
		out[i] = fe
	}
	return out
}

// validator collects field errors.
type validator struct{ errs FieldErrors }

func (v *validator) add(field, format string, args ...any) {
	v.errs = append(v.errs, &FieldError{Field: field, Detail: fmt.Sprintf(format, args...)})
}

func (v *validator) err() error {
	if len(v.errs) == 0 {
		return nil
	}
	return v.errs
}

func idx(path string, i int) string { return fmt.Sprintf("%s[%d]", path, i) }

func key(path, k string) string { return fmt.Sprintf("%s[%q]", path, k) }

// ---------------------------------------------------------------- names

const (
	dns1123LabelMax     = 63
	dns1123SubdomainMax = 253
	labelValueMax       = 63
	qualifiedNameMax    = 63
)

// checkDNSSubdomain returns what is wrong with s as a DNS-1123 subdomain
// (lowercase, as Kubernetes object names), or "".
func checkDNSSubdomain(s string) string {
	if len(s) > dns1123SubdomainMax || !isDNSSubdomain(s) {
		return fmt.Sprintf("%q must be a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most %d characters)", s, dns1123SubdomainMax)
	}
	return ""
}

// checkDNSLabel returns what is wrong with s as a DNS-1123 label, or "".
func checkDNSLabel(s string) string {
	if len(s) > dns1123LabelMax || !isDNSLabel(s) {
		return fmt.Sprintf("%q must be a DNS-1123 label (lowercase letters, digits and '-', starting and ending with a letter or digit, at most %d characters)", s, dns1123LabelMax)
	}
	return ""
}

// checkQualifiedName checks a label or annotation key: an optional
// DNS-subdomain prefix and "/", then a name of at most 63 characters.
func checkQualifiedName(s string) string {
	name := s
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		prefix := s[:i]
		name = s[i+1:]
		if prefix == "" {
			return fmt.Sprintf("key %q has an empty prefix before '/'", s)
		}
		if p := checkDNSSubdomain(prefix); p != "" {
			return fmt.Sprintf("key %q: prefix %s", s, p)
		}
	}
	if name == "" {
		return fmt.Sprintf("key %q has an empty name", s)
	}
	if len(name) > qualifiedNameMax || !isQualifiedName(name) {
		return fmt.Sprintf("key %q: name must be at most %d characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit", s, qualifiedNameMax)
	}
	return ""
}

// checkLabelValue checks a label value: empty, or at most 63 characters of
// letters, digits, '-', '_' and '.', starting and ending alphanumeric.
func checkLabelValue(s string) string {
	if s == "" {
		return ""
	}
	if len(s) > labelValueMax || !isQualifiedName(s) {
		return fmt.Sprintf("value %q must be at most %d characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit", s, labelValueMax)
	}
	return ""
}

// checkPortName checks an IANA service name as Kubernetes uses for named
// ports: at most 15 lowercase letters, digits and '-', at least one letter,
// no "--", not starting or ending with '-'.
func checkPortName(s string) string {
	switch {
	case len(s) == 0 || len(s) > 15:
		return fmt.Sprintf("port name %q must be 1 to 15 characters", s)
	case !isDNSLabel(s):
		return fmt.Sprintf("port name %q must be lowercase letters, digits and '-', starting and ending with a letter or digit", s)
	case strings.Contains(s, "--"):
		return fmt.Sprintf("port name %q must not contain \"--\"", s)
	case strings.IndexFunc(s, func(r rune) bool { return r >= 'a' && r <= 'z' }) < 0:
		return fmt.Sprintf("port name %q must contain at least one letter", s)
	}
	return ""
}

// checkIfName checks a Linux interface name.
func checkIfName(s string) string {
	switch {
	case s == "":
		return "is required"
	case len(s) > 15:
		return fmt.Sprintf("%q is longer than the kernel's limit of 15 characters", s)
	case s == "." || s == "..":
		return fmt.Sprintf("%q is not a valid interface name", s)
	case strings.ContainsAny(s, "/: \t\n\r\v\f\x00"):
		return fmt.Sprintf("%q must not contain '/', ':' or whitespace", s)
	}
	return ""
}

// ---------------------------------------------------------------- metadata

func (v *validator) typeMeta(tm *TypeMeta, kind string) {
	if tm.APIVersion != "" && tm.APIVersion != APIVersion {
		v.add("apiVersion", "%q is not supported (want %q)", tm.APIVersion, APIVersion)
	}
	if tm.Kind != "" && tm.Kind != kind {
		v.add("kind", "%q does not match the resource type %s", tm.Kind, kind)
	}
}

func (v *validator) meta(m *ObjectMeta, info KindInfo) {
	switch {
	case m.Name == "":
		v.add("metadata.name", "is required")
	case info.Singleton && m.Name != SingletonName && !(info.Kind == KindBGPConfiguration && isNodeConfigName(m.Name)):
		v.add("metadata.name", "%q: %s is a singleton and must be named %q", m.Name, info.Kind, SingletonName)
	default:
		if p := checkDNSSubdomain(m.Name); p != "" {
			v.add("metadata.name", "%s", p)
		}
	}
	switch {
	case info.Namespaced && m.Namespace == "":
		v.add("metadata.namespace", "is required for %s", info.Kind)
	case !info.Namespaced && m.Namespace != "":
		v.add("metadata.namespace", "must not be set: %s is cluster-scoped", info.Kind)
	case m.Namespace != "":
		if p := checkDNSLabel(m.Namespace); p != "" {
			v.add("metadata.namespace", "%s", p)
		}
	}
	v.labels("metadata.labels", m.Labels)
	if validKeys(m.Annotations, func(string) bool { return true }) {
		return
	}
	for _, k := range sortedKeys(m.Annotations) {
		if p := checkQualifiedName(k); p != "" {
			v.add(key("metadata.annotations", k), "%s", p)
		}
	}
}

// validKeys reports whether every key of m is a valid qualified name and
// every value passes value: the common case, checked without sorting the
// keys (which only the messages need) or building any message.
func validKeys(m map[string]string, value func(string) bool) bool {
	for k, val := range m {
		if checkQualifiedName(k) != "" || !value(val) {
			return false
		}
	}
	return true
}

func validLabelValue(s string) bool { return checkLabelValue(s) == "" }

func (v *validator) labels(path string, labels map[string]string) {
	if validKeys(labels, validLabelValue) {
		return
	}
	for _, k := range sortedKeys(labels) {
		if p := checkQualifiedName(k); p != "" {
			v.add(key(path, k), "%s", p)
		}
		if p := checkLabelValue(labels[k]); p != "" {
			v.add(key(path, k), "%s", p)
		}
	}
}

// selector validates a label selector. A nil selector is fine.
func (v *validator) selector(path string, s *LabelSelector) {
	if s == nil {
		return
	}
	v.labels(path+".matchLabels", s.MatchLabels)
	for i, r := range s.MatchExpressions {
		p := idx(path+".matchExpressions", i)
		if r.Key == "" {
			v.add(p+".key", "is required")
		} else if msg := checkQualifiedName(r.Key); msg != "" {
			v.add(p+".key", "%s", msg)
		}
		switch r.Operator {
		case OpIn, OpNotIn:
			if len(r.Values) == 0 {
				v.add(p+".values", "must not be empty for operator %s", r.Operator)
			}
			for j, val := range r.Values {
				if msg := checkLabelValue(val); msg != "" {
					v.add(idx(p+".values", j), "%s", msg)
				}
			}
		case OpExists, OpDoesNotExist:
			if len(r.Values) > 0 {
				v.add(p+".values", "must be empty for operator %s", r.Operator)
			}
		case "":
			v.add(p+".operator", "is required (In, NotIn, Exists or DoesNotExist)")
		default:
			v.add(p+".operator", "%q is not one of In, NotIn, Exists, DoesNotExist", r.Operator)
		}
	}
}

// ---------------------------------------------------------------- addresses

// reservedV4 are ranges no pool may overlap: pod addresses there would
// clash with the host's loopback, the fake gateway 169.254.1.1, broadcast
// or multicast.
var reservedV4 = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/3"),
}

// reservedV6 are the IPv6 ranges no pool may overlap: the unspecified and
// loopback addresses, IPv4-mapped addresses, link-local (the pods' gateway
// lives there) and multicast.
var reservedV6 = []netip.Prefix{
	netip.MustParsePrefix("::/127"),
	netip.MustParsePrefix("::ffff:0:0/96"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("ff00::/8"),
}

func familyName(is6 bool) string {
	if is6 {
		return "IPv6"
	}
	return "IPv4"
}

// cidr validates an IPv4 or IPv6 CIDR in canonical form and returns it.
func (v *validator) cidr(path, s string) (netip.Prefix, bool) {
	if s == "" {
		v.add(path, "is required")
		return netip.Prefix{}, false
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		v.add(path, "%q is not a valid CIDR", s)
		return netip.Prefix{}, false
	}
	if p.Addr().Zone() != "" {
		v.add(path, "%q: a CIDR has no zone", s)
		return netip.Prefix{}, false
	}
	if p.Masked() != p {
		v.add(path, "%q has host bits set (did you mean %q?)", s, p.Masked().String())
		return netip.Prefix{}, false
	}
	return p, true
}

// cidr4 validates an IPv4 CIDR in canonical form ("10.0.0.0/16") and
// returns it (BGPFilter rules, whose IPv6 side is not supported yet).
func (v *validator) cidr4(path, s string) (netip.Prefix, bool) {
	if p, err := netip.ParsePrefix(s); err == nil && !p.Addr().Is4() {
		v.add(path, "%q: IPv6 is not supported yet, only IPv4", s)
		return netip.Prefix{}, false
	}
	return v.cidr(path, s)
}

// ---------------------------------------------------------------- numbers

// checkASN returns what is wrong with an AS number, or "".
func checkASN(asn uint32) string {
	switch asn {
	case 0, 23456, 65535, math.MaxUint32:
		return fmt.Sprintf("%d is a reserved AS number", asn)
	}
	return ""
}

// bgpTimers validates keepalive, hold and restart times: whole seconds, in
// the ranges the BGP messages can carry, keepalive below hold.
func (v *validator) bgpTimers(prefix string, keepalive, hold, restart *Duration, restartField string) {
	check := func(field string, d *Duration, lo, hi time.Duration) bool {
		if d == nil {
			return false
		}
		switch {
		case d.Duration <= 0:
			v.add(prefix+field, "%s must be greater than zero", d.Duration)
		case d.Duration%time.Second != 0:
			v.add(prefix+field, "%s must be a whole number of seconds", d.Duration)
		case d.Duration < lo || d.Duration > hi:
			v.add(prefix+field, "%s must be between %s and %s", d.Duration, lo, hi)
		default:
			return true
		}
		return false
	}
	kaOK := check("keepaliveTime", keepalive, time.Second, 21845*time.Second)
	holdOK := check("holdTime", hold, 3*time.Second, 65535*time.Second)
	check(restartField, restart, time.Second, 4095*time.Second)
	if kaOK && holdOK && keepalive.Duration >= hold.Duration {
		v.add(prefix+"keepaliveTime", "%s must be less than holdTime %s", keepalive.Duration, hold.Duration)
	}
}

// ---------------------------------------------------------------- ports

func validProtocol(p string, allowed ...string) bool {
	for _, a := range allowed {
		if p == a {
			return true
		}
	}
	return false
}

// ParsePortRange parses a GlobalNetworkPolicy port range "lo:hi"; ok is
// false for anything else (a named port). It does not check the bounds:
// validation reports those.
func ParsePortRange(s string) (lo, hi int, ok bool) {
	a, b, found := strings.Cut(s, ":")
	if !found {
		return 0, 0, false
	}
	lo, err1 := strconv.Atoi(a)
	hi, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return lo, hi, true
}

func isDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

func validMAC(s string) bool {
	hw, err := net.ParseMAC(s)
	return err == nil && len(hw) == 6
}
