package dataplane

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/tabbynet/tabby/policy"
)

// RuleCounters reads the counters of the rules with an Origin in one
// netlink dump of Tabby's table (not a request per chain or rule), and
// sums them by origin. A rule is known by its hash comment, mapped to its
// origin through the last Apply; rules of an origin the last Apply did not
// write are left out. Thread-safe.
func (f *NFTFirewall) RuleCounters(ctx context.Context) ([]RuleCounter, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	byHash := map[string]*policy.Origin{}
	for _, c := range f.memo.want {
		if c.src == nil || c.src.Dispatch != nil {
			continue
		}
		for i, r := range c.src.Rules {
			if r.Origin != nil && i < len(c.hashes) {
				byHash[c.hashes[i]] = r.Origin
			}
		}
	}
	rules, err := f.gen.dumpRuleCounters(f.table.Name)
	if err != nil {
		return nil, err
	}
	return sumByOrigin(rules, byHash), nil
}

// sumByOrigin adds up the counters of rules (by hash) per origin, in the
// order origins first appear.
func sumByOrigin(rules []nftRuleCounter, byHash map[string]*policy.Origin) []RuleCounter {
	idx := map[string]int{}
	var out []RuleCounter
	for _, r := range rules {
		o := byHash[r.hash]
		if o == nil {
			continue
		}
		k := o.String()
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, RuleCounter{Origin: o})
		}
		out[i].Packets += r.packets
		out[i].Bytes += r.bytes
	}
	return out
}

// nftRuleCounter is one kernel rule's hash comment and counter.
type nftRuleCounter struct {
	hash           string
	packets, bytes uint64
}

// dumpRuleCounters dumps every rule of the inet table and returns those
// with a counter expression.
func (g *nlGen) dumpRuleCounters(table string) ([]nftRuleCounter, error) {
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_RULE_TABLE, Data: []byte(table + "\x00")}})
	if err != nil {
		return nil, err
	}
	req := netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETRULE), Flags: netlink.Request | netlink.Dump},
		Data:   append([]byte{unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0}, attrs...),
	}
	msgs, err := g.c.Execute(req)
	if err != nil {
		return nil, fmt.Errorf("dumping nftables rules: %w", err)
	}
	var out []nftRuleCounter
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		rc, ok, err := parseRuleCounter(m.Data[4:])
		if err != nil {
			return nil, fmt.Errorf("dumping nftables rules: %w", err)
		}
		if ok {
			out = append(out, rc)
		}
	}
	return out, nil
}

// parseRuleCounter reads a rule message's comment and counter.
func parseRuleCounter(b []byte) (rc nftRuleCounter, ok bool, err error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return rc, false, err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_RULE_USERDATA:
			c, _ := userdata.GetString(ad.Bytes(), userdata.TypeComment)
			rc.hash = strings.TrimPrefix(c, "tabby:")
		case unix.NFTA_RULE_EXPRESSIONS:
			ad.Nested(func(nd *netlink.AttributeDecoder) error {
				for nd.Next() {
					nd.Nested(func(ed *netlink.AttributeDecoder) error {
						if p, b, found := parseCounterExpr(ed); found {
							rc.packets, rc.bytes, ok = p, b, true
						}
						return nil
					})
				}
				return nil
			})
		}
	}
	return rc, ok, ad.Err()
}

// parseCounterExpr reads one expression; found when it is a counter.
func parseCounterExpr(ed *netlink.AttributeDecoder) (packets, bytes uint64, found bool) {
	ed.ByteOrder = binary.BigEndian
	var data []byte
	for ed.Next() {
		switch ed.Type() {
		case unix.NFTA_EXPR_NAME:
			found = ed.String() == "counter"
		case unix.NFTA_EXPR_DATA:
			data = ed.Bytes()
		}
	}
	if !found || data == nil {
		return 0, 0, false
	}
	cd, err := netlink.NewAttributeDecoder(data)
	if err != nil {
		return 0, 0, false
	}
	cd.ByteOrder = binary.BigEndian
	for cd.Next() {
		switch cd.Type() {
		case unix.NFTA_COUNTER_PACKETS:
			packets = cd.Uint64()
		case unix.NFTA_COUNTER_BYTES:
			bytes = cd.Uint64()
		}
	}
	return packets, bytes, true
}
