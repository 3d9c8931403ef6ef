package agent

import (
	"fmt"
	"net/netip"
	"strings"
)

// NodeIPFlag is the value of --node-ip and --node-ip6 (Calico's IP and
// IP6): a CIDR, "autodetect" or "none". It writes through to a Config:
// for IPv4 "none" sets NoIPv4 (an IPv6-only node) and "autodetect" is the
// default; for IPv6 "autodetect" sets AutodetectIPv6 and "none" is the
// default. It implements pflag.Value.
type NodeIPFlag struct {
	Cfg *Config
	V6  bool
}

// The keywords of NodeIPFlag.
const (
	NodeIPAutodetect = "autodetect"
	NodeIPNone       = "none"
)

func (f NodeIPFlag) fields() (p *netip.Prefix, off, auto bool) {
	if f.V6 {
		return &f.Cfg.NodeIP6, !f.Cfg.AutodetectIPv6, f.Cfg.AutodetectIPv6
	}
	return &f.Cfg.NodeIP, f.Cfg.NoIPv4, !f.Cfg.NoIPv4
}

// String is the flag's value as Set reads it.
func (f NodeIPFlag) String() string {
	if f.Cfg == nil {
		return ""
	}
	p, off, _ := f.fields()
	switch {
	case p.IsValid():
		return p.String()
	case off:
		return NodeIPNone
	}
	return NodeIPAutodetect
}

// Type implements pflag.Value.
func (f NodeIPFlag) Type() string { return "cidr|autodetect|none" }

// Set parses a CIDR, "autodetect" or "none".
func (f NodeIPFlag) Set(s string) error {
	p, _, _ := f.fields()
	fam := "IPv4"
	if f.V6 {
		fam = "IPv6"
	}
	var auto, off bool
	var v netip.Prefix
	switch strings.ToLower(strings.TrimSpace(s)) {
	case NodeIPAutodetect, "":
		auto = true
	case NodeIPNone:
		off = true
	default:
		var err error
		if v, err = netip.ParsePrefix(s); err != nil || v.Addr().Is6() != f.V6 || v.Addr().Is4In6() {
			return fmt.Errorf("%q is not an %s CIDR, %s or %s", s, fam, NodeIPAutodetect, NodeIPNone)
		}
	}
	*p = v
	if f.V6 {
		f.Cfg.AutodetectIPv6 = auto
	} else {
		f.Cfg.NoIPv4 = off
	}
	return nil
}
