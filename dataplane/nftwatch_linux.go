package dataplane

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
)

// SetElementEvent is one message of set element changes the kernel
// announced in a namespace: elements added to or deleted from a set or map
// of any table.
type SetElementEvent struct {
	Add bool
	// Addrs holds the address each element's key starts with: an
	// address set's member (an interval's start), or an address . proto .
	// port key's address. Interval ends, verdict-map elements and keys
	// of other lengths (a port set's) give none.
	Addrs []netip.Addr
	// Err, on the last event, is why the watch ended before ctx did.
	Err error
}

// WatchSetElements follows the set element changes committed in the
// network namespace at netnsPath until ctx ends, when the channel closes.
// Unlike `nft monitor` it keeps no cache of sets, which `nft monitor`
// (1.0.6) drops a named set from when a rule that refers to it is deleted
// (a flushed chain), printing none of the set's element changes after
// that. The lab's harness times policy changes with it. A slow reader
// stalls the watch, and the kernel then drops messages (ENOBUFS ends it):
// read promptly.
func WatchSetElements(ctx context.Context, netnsPath string) (<-chan SetElementEvent, error) {
	h, err := openNetNS(netnsPath)
	if err != nil {
		return nil, err
	}
	defer h.Close() // the monitor's socket keeps the namespace
	c, err := nftables.New(nftables.WithNetNSFd(int(h)), nftables.WithSockOptions(bigBuffers))
	if err != nil {
		return nil, fmt.Errorf("nftables netlink: %w", err)
	}
	// Every object: v0.3.0's filter tests (flags&1)<<type, so a monitor of
	// elements only passes no message; and its events reach the channel
	// at the generation message that ends each transaction.
	mon := nftables.NewMonitor(nftables.WithMonitorEventBuffer(1024))
	events, err := c.AddMonitor(mon)
	if err != nil {
		return nil, fmt.Errorf("watching nftables set elements: %w", err)
	}
	out := make(chan SetElementEvent, 1024)
	go func() {
		<-ctx.Done()
		_ = mon.Close() // ends events
	}()
	go func() {
		defer close(out)
		for e := range events {
			ev := SetElementEvent{Add: e.Type == nftables.MonitorEventTypeNewSetElem}
			switch e.Type {
			case nftables.MonitorEventTypeNewSetElem, nftables.MonitorEventTypeDelSetElem:
				if els, ok := e.Data.([]nftables.SetElement); ok {
					ev.Addrs = elementAddrs(els)
				}
				if len(ev.Addrs) == 0 {
					continue
				}
			case nftables.MonitorEventTypeOOB:
				ev.Err = e.Error
				if ev.Err == nil {
					ev.Err = fmt.Errorf("nftables monitor ended")
				}
			default:
				continue
			}
			select {
			case out <- ev:
			case <-ctx.Done():
			}
		}
	}()
	return out, nil
}

// elementAddrs returns the address each element's key starts with, by
// key length: 4 or 16 bytes (an address), 12 or 24 (address . proto .
// port, each field padded to 4 bytes).
func elementAddrs(els []nftables.SetElement) []netip.Addr {
	var out []netip.Addr
	for _, e := range els {
		if e.IntervalEnd || len(e.Val) > 0 {
			continue
		}
		switch len(e.Key) {
		case 4, 12:
			out = append(out, netip.AddrFrom4([4]byte(e.Key[:4])))
		case 16, 24:
			out = append(out, netip.AddrFrom16([16]byte(e.Key[:16])))
		}
	}
	return out
}
