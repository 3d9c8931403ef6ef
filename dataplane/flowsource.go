package dataplane

import (
	"net/netip"
	"time"
)

// FlowKey is a flow's five-tuple in its original direction (ports are 0
// for protocols without them).
type FlowKey struct {
	Proto    uint8
	Src, Dst netip.AddrPort
}

// PacketLog is one packet a Tabby rule logged to NFLOG.
type PacketLog struct {
	Key FlowKey
	// Prefix is the rule's log prefix (FlowLogPrefix).
	Prefix string
	// Bytes is the packet's length from its IP header.
	Bytes int
	Time  time.Time
}

// ConnEvent is a conntrack event: a flow seen, changed or ended, with the
// kernel's packet and byte counts of both directions (nf_conntrack_acct).
type ConnEvent struct {
	Key            FlowKey
	Destroy        bool
	Packets, Bytes uint64
	Time           time.Time
}
