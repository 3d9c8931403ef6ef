package dataplane

import (
	"encoding/binary"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nlGen reads the nf_tables ruleset generation: a counter the kernel bumps
// on every committed batch in the namespace, by anyone. google/nftables
// (v0.3.0) decodes generation messages only in its monitor and has no
// request for one, so the request is here, on a socket of its own.
type nlGen struct {
	c *netlink.Conn
	// fault, when set, is returned instead of reading (tests).
	fault error
}

func dialGen(netnsFD int) (*nlGen, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netnsFD})
	if err != nil {
		return nil, fmt.Errorf("netfilter netlink: %w", err)
	}
	return &nlGen{c: c}, nil
}

func (g *nlGen) close() error { return g.c.Close() }

// id returns the current generation.
func (g *nlGen) id() (uint32, error) {
	if g.fault != nil {
		return 0, g.fault
	}
	req := netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	}
	msgs, err := g.c.Execute(req)
	if err != nil {
		return 0, fmt.Errorf("reading the nftables generation: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, err
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				return ad.Uint32(), nil
			}
		}
	}
	return 0, fmt.Errorf("reading the nftables generation: no id in the reply")
}
