package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// This file interprets a compiled Ruleset the way the kernel would walk
// it, for the subset of iptables the compiler emits, so that tests can ask
// "does this packet pass?" instead of comparing rule text. Any argument it
// does not know fails the test, so the interpreter cannot silently ignore
// a match.

// packet is one packet crossing a node's FORWARD hook.
type packet struct {
	src, dst    netip.Addr
	proto       string // "tcp", "udp", "sctp", "icmp"
	sport       int
	dport       int
	in, out     string // interfaces
	established bool
}

type verdict int

const (
	vAccept verdict = iota
	vDrop
)

func (v verdict) String() string {
	if v == vAccept {
		return "ACCEPT"
	}
	return "DROP"
}

type sim struct {
	t    testing.TB
	rs   *Ruleset
	mark uint32
	hops int
}

// forward runs pkt through the filter table's FORWARD chain, whose policy
// is ACCEPT and whose only rule is Tabby's jump.
func forward(t testing.TB, rs *Ruleset, pkt packet) verdict {
	t.Helper()
	s := &sim{t: t, rs: rs}
	for _, j := range rs.Jumps {
		if j.Table == TableFilter && j.From == "FORWARD" {
			if v, done := s.run(j.To, pkt); done {
				return v
			}
		}
	}
	return vAccept
}

// run walks chain; done reports a terminal verdict (else the chain
// returned).
func (s *sim) run(chain string, pkt packet) (verdict, bool) {
	s.hops++
	if s.hops > 1000 {
		s.t.Fatalf("rule walk does not end (at %s)", chain)
	}
	ch, ok := s.rs.Chain(TableFilter, chain)
	if !ok {
		s.t.Fatalf("jump to missing chain %s", chain)
	}
	for _, r := range ch.Rules {
		match, target, targs, gotoChain := s.eval(r, pkt)
		if !match {
			continue
		}
		switch target {
		case "":
		case "ACCEPT":
			return vAccept, true
		case "DROP":
			return vDrop, true
		case "RETURN":
			return 0, false
		case "MARK":
			if len(targs) != 2 || targs[0] != "--set-xmark" {
				s.t.Fatalf("MARK %v", targs)
			}
			v, m := parseMark(s.t, targs[1])
			s.mark = s.mark&^m ^ v
		default:
			if !strings.HasPrefix(target, Prefix) {
				s.t.Fatalf("unknown target %s", target)
			}
			if v, done := s.run(target, pkt); done {
				return v, true
			}
			if gotoChain {
				return 0, false
			}
		}
	}
	return 0, false
}

func parseMark(t testing.TB, s string) (v, m uint32) {
	a, b, ok := strings.Cut(s, "/")
	if !ok {
		t.Fatalf("mark %q", s)
	}
	x, err1 := strconv.ParseUint(a, 0, 32)
	y, err2 := strconv.ParseUint(b, 0, 32)
	if err1 != nil || err2 != nil {
		t.Fatalf("mark %q", s)
	}
	return uint32(x), uint32(y)
}

// eval matches one rule; it returns the target and its arguments.
func (s *sim) eval(r Rule, pkt packet) (match bool, target string, targs []string, gotoChain bool) {
	t := s.t
	match = true
	neg := false
	check := func(ok bool) {
		if neg {
			ok = !ok
		}
		neg = false
		if !ok {
			match = false
		}
	}
	for i := 0; i < len(r); i++ {
		arg := r[i]
		next := func() string {
			i++
			if i >= len(r) {
				t.Fatalf("rule %v: %s needs a value", r, arg)
			}
			return r[i]
		}
		switch arg {
		case "!":
			neg = true
		case "-i":
			check(ifaceMatch(next(), pkt.in))
		case "-o":
			check(ifaceMatch(next(), pkt.out))
		case "-s":
			check(netip.MustParsePrefix(next()).Contains(pkt.src))
		case "-d":
			check(netip.MustParsePrefix(next()).Contains(pkt.dst))
		case "-p":
			check(next() == pkt.proto)
		case "-m":
			switch m := next(); m {
			case "conntrack", "set", "mark", "multiport", "tcp", "udp", "sctp":
			default:
				t.Fatalf("rule %v: unknown match module %s", r, m)
			}
		case "--ctstate":
			check(next() == "RELATED,ESTABLISHED" && pkt.established)
		case "--match-set":
			name := next()
			check(s.setMatch(name, next(), pkt))
		case "--dport":
			check(portIn(t, next(), pkt.dport))
		case "--sport":
			check(portIn(t, next(), pkt.sport))
		case "--dports":
			check(portIn(t, next(), pkt.dport))
		case "--sports":
			check(portIn(t, next(), pkt.sport))
		case "--mark":
			v, m := parseMark(t, next())
			check(s.mark&m == v)
		case "-j", "-g":
			target = next()
			targs = r[i+1:]
			return match, target, targs, arg == "-g"
		default:
			t.Fatalf("rule %v: unknown argument %s", r, arg)
		}
	}
	return match, "", nil, false
}

func ifaceMatch(pattern, iface string) bool {
	if p, ok := strings.CutSuffix(pattern, "+"); ok {
		return strings.HasPrefix(iface, p)
	}
	return pattern == iface
}

// portIn matches "80", "80:90" and comma lists of those.
func portIn(t testing.TB, spec string, port int) bool {
	for _, part := range strings.Split(spec, ",") {
		lo, hi, ok := strings.Cut(part, ":")
		if !ok {
			hi = lo
		}
		l, err1 := strconv.Atoi(lo)
		h, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil {
			t.Fatalf("port spec %q", spec)
		}
		if port >= l && port <= h {
			return true
		}
	}
	return false
}

func (s *sim) setMatch(name, flags string, pkt packet) bool {
	set, ok := s.rs.Set(name)
	if !ok {
		s.t.Fatalf("rule references missing set %s", name)
	}
	addr := func(f string) netip.Addr {
		if f == "src" {
			return pkt.src
		}
		return pkt.dst
	}
	port := func(f string) int {
		if f == "src" {
			return pkt.sport
		}
		return pkt.dport
	}
	switch set.Type {
	case SetTypeNet:
		a := addr(flags)
		return slices.ContainsFunc(set.Members, func(m string) bool { return netip.MustParsePrefix(m).Contains(a) })
	case SetTypeIPPort:
		f := strings.Split(flags, ",")
		if len(f) != 2 {
			s.t.Fatalf("hash:ip,port set %s matched with %q", name, flags)
		}
		return slices.Contains(set.Members, fmt.Sprintf("%s,%s:%d", addr(f[0]), pkt.proto, port(f[1])))
	}
	s.t.Fatalf("set %s has unknown type %s", name, set.Type)
	return false
}
