package dataplane

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"
)

// nfnetlink_log's message types and attributes (linux/netfilter/nfnetlink_log.h).
const (
	nfnlSubsysULOG      = 4
	nfulnlMsgPacket     = 0
	nfulnlMsgConfig     = 1
	nfulaCfgCmd         = 1
	nfulaCfgMode        = 2
	nfulnlCfgCmdBind    = 1
	nfulnlCfgCmdUnbind  = 2
	nfulnlCopyPacket    = 2
	nfulaPayload        = 9
	nfulaPrefix         = 10
	flowLogCopyRange    = 80 // an IPv6 header and the ports after it
	flowSourceRecvBytes = 8 << 20
)

// ListenNFLOG binds NFLOG group in the caller's network namespace and
// calls out for every packet Tabby's rules log, until ctx ends. out runs
// on the reading goroutine and must not block. Packets the socket could not
// hold (a flood) are lost in the kernel, not queued: ListenNFLOG keeps
// going and reports each overflow to lost.
func ListenNFLOG(ctx context.Context, group uint16, out func(PacketLog), lost func()) error {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return fmt.Errorf("nflog netlink: %w", err)
	}
	defer c.Close()
	_ = c.SetReadBuffer(flowSourceRecvBytes)
	cfg := func(attrs []netlink.Attribute) error {
		data, err := netlink.MarshalAttributes(attrs)
		if err != nil {
			return err
		}
		hdr := []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, byte(group >> 8), byte(group)}
		_, err = c.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysULOG<<8 | nfulnlMsgConfig), Flags: netlink.Request | netlink.Acknowledge},
			Data:   append(hdr, data...),
		})
		return err
	}
	mode := make([]byte, 6)
	binary.BigEndian.PutUint32(mode, flowLogCopyRange)
	mode[4] = nfulnlCopyPacket
	if err := cfg([]netlink.Attribute{{Type: nfulaCfgCmd, Data: []byte{nfulnlCfgCmdBind}}}); err != nil {
		return fmt.Errorf("binding nflog group %d: %w", group, err)
	}
	defer func() { _ = cfg([]netlink.Attribute{{Type: nfulaCfgCmd, Data: []byte{nfulnlCfgCmdUnbind}}}) }()
	if err := cfg([]netlink.Attribute{{Type: nfulaCfgMode, Data: mode}}); err != nil {
		return fmt.Errorf("nflog group %d copy mode: %w", group, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetReadDeadline(time.Now()) })
	defer stop()
	for {
		msgs, err := c.Receive()
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, unix.ENOBUFS) {
			lost()
			continue
		}
		if err != nil {
			return fmt.Errorf("reading nflog group %d: %w", group, err)
		}
		now := time.Now()
		for _, m := range msgs {
			if m.Header.Type != netlink.HeaderType(nfnlSubsysULOG<<8|nfulnlMsgPacket) || len(m.Data) < 4 {
				continue
			}
			if pl, ok := parseNFLOG(m.Data[4:]); ok {
				pl.Time = now
				out(pl)
			}
		}
	}
}

// parseNFLOG reads a logged packet's prefix and five-tuple.
func parseNFLOG(b []byte) (PacketLog, bool) {
	var pl PacketLog
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return pl, false
	}
	var payload []byte
	for ad.Next() {
		switch ad.Type() {
		case nfulaPrefix:
			pl.Prefix = ad.String()
		case nfulaPayload:
			payload = ad.Bytes()
		}
	}
	if ad.Err() != nil {
		return pl, false
	}
	var ok bool
	pl.Key, pl.Bytes, ok = parseIPHeader(payload)
	return pl, ok
}

// parseIPHeader reads the five-tuple and total length of an IPv4 or IPv6
// packet (IPv6 extension headers are not followed: ports stay 0).
func parseIPHeader(p []byte) (k FlowKey, length int, ok bool) {
	if len(p) < 1 {
		return k, 0, false
	}
	var src, dst netip.Addr
	var l4 []byte
	switch p[0] >> 4 {
	case 4:
		ihl := int(p[0]&0xf) * 4
		if len(p) < 20 || ihl < 20 {
			return k, 0, false
		}
		length = int(binary.BigEndian.Uint16(p[2:4]))
		k.Proto = p[9]
		src, dst = netip.AddrFrom4([4]byte(p[12:16])), netip.AddrFrom4([4]byte(p[16:20]))
		if frag := binary.BigEndian.Uint16(p[6:8]) & 0x1fff; frag == 0 && len(p) >= ihl {
			l4 = p[ihl:]
		}
	case 6:
		if len(p) < 40 {
			return k, 0, false
		}
		length = int(binary.BigEndian.Uint16(p[4:6])) + 40
		k.Proto = p[6]
		src, dst = netip.AddrFrom16([16]byte(p[8:24])), netip.AddrFrom16([16]byte(p[24:40]))
		l4 = p[40:]
	default:
		return k, 0, false
	}
	var sp, dp uint16
	switch k.Proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP:
		if len(l4) >= 4 {
			sp, dp = binary.BigEndian.Uint16(l4[0:2]), binary.BigEndian.Uint16(l4[2:4])
		}
	}
	k.Src, k.Dst = netip.AddrPortFrom(src, sp), netip.AddrPortFrom(dst, dp)
	return k, length, true
}

// EnableConntrackAccounting turns on nf_conntrack_acct in the caller's
// network namespace, so that conntrack events carry packet and byte counts.
func EnableConntrackAccounting() error {
	if err := os.WriteFile("/proc/sys/net/netfilter/nf_conntrack_acct", []byte("1"), 0o644); err != nil {
		return fmt.Errorf("enabling conntrack accounting: %w", err)
	}
	return nil
}

// ListenConntrack calls out for every conntrack event (new, update,
// destroy) in the caller's network namespace until ctx ends. One goroutine
// reads; out runs on it and must not block. Events the socket could not hold
// are lost in the kernel (lost is not told: the socket ignores overflows so
// that a flood cannot close it).
func ListenConntrack(ctx context.Context, out func(ConnEvent)) error {
	c, err := conntrack.Dial(nil)
	if err != nil {
		return fmt.Errorf("conntrack netlink: %w", err)
	}
	_ = c.SetReadBuffer(flowSourceRecvBytes)
	_ = c.SetOption(netlink.NoENOBUFS, true)
	evs := make(chan conntrack.Event, 256)
	errc, err := c.Listen(evs, 1, []netfilter.NetlinkGroup{netfilter.GroupCTNew, netfilter.GroupCTUpdate, netfilter.GroupCTDestroy})
	if err != nil {
		c.Close()
		return fmt.Errorf("listening to conntrack events: %w", err)
	}
	// Close waits for the worker, which may be blocked handing over an
	// event: drain until it is done.
	defer func() {
		done := make(chan struct{})
		go func() { _ = c.Close(); close(done) }()
		for {
			select {
			case <-done:
				return
			case <-evs:
			case <-errc:
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return fmt.Errorf("conntrack events: %w", err)
		case ev := <-evs:
			if ev.Flow == nil {
				continue
			}
			f := ev.Flow
			t := f.TupleOrig
			out(ConnEvent{
				Key: FlowKey{Proto: t.Proto.Protocol,
					Src: netip.AddrPortFrom(t.IP.SourceAddress, t.Proto.SourcePort),
					Dst: netip.AddrPortFrom(t.IP.DestinationAddress, t.Proto.DestinationPort)},
				Destroy: ev.Type == conntrack.EventDestroy,
				Packets: f.CountersOrig.Packets + f.CountersReply.Packets,
				Bytes:   f.CountersOrig.Bytes + f.CountersReply.Bytes,
				Time:    time.Now(),
			})
		}
	}
}
