package flowlog

import (
	"net/netip"
	"testing"
	"time"

	"github.com/tabbynet/tabby/dataplane"
)

// BenchmarkAggregatorDenyFlood: the agent's cost per logged denied packet
// of a flood of distinct flows (a new source port each), with the flush
// every 1000 packets; the flow table full most of the time.
func BenchmarkAggregatorDenyFlood(b *testing.B) {
	a := New(testConfig(), "n1", view, fakeOrigins(denyIn))
	prefix := dataplane.FlowLogPrefix(denyIn)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		a.Packet(dataplane.PacketLog{Key: dataplane.FlowKey{Proto: 17, Src: netip.AddrPortFrom(client, uint16(i)), Dst: netip.AddrPortFrom(server, 81)}, Prefix: prefix, Bytes: 60, Time: t0})
		if i%1000 == 999 {
			a.Flush(t0.Add(time.Duration(i)))
		}
	}
}

// BenchmarkAggregatorConntrack: the cost per conntrack event of short
// allowed flows (new, update, destroy each).
func BenchmarkAggregatorConntrack(b *testing.B) {
	a := New(testConfig(), "n1", view, fakeOrigins(allowEg))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		k := dataplane.FlowKey{Proto: 6, Src: netip.AddrPortFrom(client, uint16(i/3)), Dst: netip.AddrPortFrom(server, 80)}
		a.Conn(dataplane.ConnEvent{Key: k, Packets: uint64(i%3 + 1), Bytes: 100, Destroy: i%3 == 2, Time: t0})
		if i%3000 == 2999 {
			a.Flush(t0.Add(time.Duration(i)))
		}
	}
}
