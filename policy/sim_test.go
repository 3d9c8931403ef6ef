package policy

import (
	"net/netip"
	"testing"
)

// This file adapts Eval (eval.go) to the tests' short packet literals: a
// packet Eval cannot evaluate fails the test.

// packet is one packet crossing a node's hook.
type packet struct {
	src, dst    netip.Addr
	proto       string // "tcp", "udp", "sctp", "icmp", "icmpv6"
	icmpType    uint8  // of an "icmpv6" packet
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

// forward runs pkt through the filter table's FORWARD chain, whose policy
// is ACCEPT and whose only rule is Tabby's jump.
func forward(t testing.TB, rs *Ruleset, pkt packet) verdict {
	t.Helper()
	return hook(t, rs, "FORWARD", pkt)
}

// input runs pkt (to this node) through the filter table's INPUT chain,
// whose policy is ACCEPT and whose only rule is Tabby's jump.
func input(t testing.TB, rs *Ruleset, pkt packet) verdict {
	t.Helper()
	return hook(t, rs, "INPUT", pkt)
}

func hook(t testing.TB, rs *Ruleset, from string, pkt packet) verdict {
	t.Helper()
	return tableHook(t, rs, TableFilter, from, pkt)
}

// tableHook runs pkt through a base chain of table whose policy is ACCEPT
// and whose only rules are Tabby's jumps.
func tableHook(t testing.TB, rs *Ruleset, table, from string, pkt packet) verdict {
	t.Helper()
	tr, err := Eval(rs, Hook{Table: table, From: from}, pkt.eval())
	if err != nil {
		t.Fatalf("evaluating %+v: %v", pkt, err)
	}
	if tr.Accepted {
		return vAccept
	}
	return vDrop
}

func (p packet) eval() Packet {
	return Packet{Src: p.src, Dst: p.dst, Proto: p.proto, ICMPType: p.icmpType, SrcPort: uint16(p.sport),
		DstPort: uint16(p.dport), In: p.in, Out: p.out, Established: p.established}
}
