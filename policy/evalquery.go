package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
)

// Query renders a path (a key of Paths) and a packet as URL query
// parameters, the form the agent's status API takes them in (GET
// /policy/evaluate).
func (p Packet) Query(path string) url.Values {
	q := url.Values{}
	q.Set("path", path)
	q.Set("src", p.Src.String())
	q.Set("dst", p.Dst.String())
	q.Set("proto", p.Proto)
	if p.SrcPort != 0 {
		q.Set("sport", strconv.Itoa(int(p.SrcPort)))
	}
	if p.DstPort != 0 {
		q.Set("dport", strconv.Itoa(int(p.DstPort)))
	}
	if p.Proto == "icmpv6" {
		q.Set("icmptype", strconv.Itoa(int(p.ICMPType)))
	}
	if p.In != "" {
		q.Set("in", p.In)
	}
	if p.Out != "" {
		q.Set("out", p.Out)
	}
	if p.Established {
		q.Set("established", "true")
	}
	return q
}

// evalProtos are the protocols a Packet may have.
var evalProtos = map[string]bool{"tcp": true, "udp": true, "sctp": true, "icmp": true, "icmpv6": true}

// maxIfaceName is the kernel's limit on interface names (IFNAMSIZ - 1).
const maxIfaceName = 15

// ParsePacketQuery is the inverse of Packet.Query. It reports every bad or
// unknown parameter, by name; a parameter given twice is an error.
func ParsePacketQuery(q url.Values) (path string, p Packet, err error) {
	var errs []error
	known := map[string]bool{"path": true, "src": true, "dst": true, "proto": true, "sport": true,
		"dport": true, "icmptype": true, "in": true, "out": true, "established": true}
	for k, v := range q {
		switch {
		case !known[k]:
			errs = append(errs, fmt.Errorf("%.40q: unknown parameter", k))
		case len(v) > 1:
			errs = append(errs, fmt.Errorf("%s: given %d times", k, len(v)))
		}
	}
	if path = q.Get("path"); Paths[path] == nil {
		errs = append(errs, fmt.Errorf("path: %.20q: want forward, input or output", path))
	}
	addr := func(name string) netip.Addr {
		a, err := netip.ParseAddr(q.Get(name))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %.60q: not an address", name, q.Get(name)))
		}
		return a.WithZone("")
	}
	p.Src, p.Dst = addr("src"), addr("dst")
	if p.Src.IsValid() && p.Dst.IsValid() && p.Src.Is4() != p.Dst.Is4() {
		errs = append(errs, fmt.Errorf("src, dst: %s and %s are of different families", p.Src, p.Dst))
	}
	if p.Proto = q.Get("proto"); !evalProtos[p.Proto] {
		errs = append(errs, fmt.Errorf("proto: %.20q: want tcp, udp, sctp, icmp or icmpv6", p.Proto))
	}
	num := func(name string, max int) uint16 {
		s := q.Get(name)
		if s == "" {
			return 0
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > max {
			errs = append(errs, fmt.Errorf("%s: %.20q: want 0 to %d", name, s, max))
		}
		return uint16(n)
	}
	p.SrcPort, p.DstPort = num("sport", 65535), num("dport", 65535)
	p.ICMPType = uint8(num("icmptype", 255))
	p.In, p.Out = q.Get("in"), q.Get("out")
	for _, f := range []struct{ name, v string }{{"in", p.In}, {"out", p.Out}} {
		if len(f.v) > maxIfaceName {
			errs = append(errs, fmt.Errorf("%s: %.20q…: longer than %d characters", f.name, f.v, maxIfaceName))
		}
	}
	switch e := q.Get("established"); e {
	case "", "false":
	case "true":
		p.Established = true
	default:
		errs = append(errs, fmt.Errorf("established: %.20q: want true or false", e))
	}
	return path, p, errors.Join(errs...)
}

// NodeTrace is a node's answer to an evaluation: EvalPath's traces over
// the Ruleset the node's agent last applied.
type NodeTrace struct {
	Node     string  `json:"node"`
	Path     string  `json:"path"`
	Accepted bool    `json:"accepted"`
	Traces   []Trace `json:"traces"`
}
