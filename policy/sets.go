package policy

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/tabbynet/tabby/api"
)

// NamespaceNameLabel is the label every Kubernetes namespace carries with
// its own name; namespaceSelectors may use it although endpoints do not
// list it in spec.namespaceLabels.
const NamespaceNameLabel = "kubernetes.io/metadata.name"

// endpoint is a WorkloadEndpoint with its parsed fields.
type endpoint struct {
	// The endpoint parsed: one of wep and rem (another node's endpoint
	// in compact form, Input.Remote) is set.
	wep       *api.WorkloadEndpoint
	rem       *api.RemoteEndpoint
	namespace string
	labels    map[string]string
	// nsLabels are shared by the endpoints of a namespace (nsLabelTable).
	nsLabels map[string]string
	addrs    []netip.Addr
	local    bool
	policed  bool // local, with a usable interface name
}

// name is namespace/name, for messages and ordering. It is not kept: the
// Compiler holds every endpoint of the cluster, and few are ever named.
func (ep *endpoint) name() string {
	if ep.rem != nil {
		return ep.namespace + "/" + ep.rem.Name
	}
	return ep.namespace + "/" + ep.wep.Metadata.Name
}

// iface is the endpoint's host interface ("" in compact form).
func (ep *endpoint) iface() string {
	if ep.wep == nil {
		return ""
	}
	return ep.wep.Spec.InterfaceName
}

// ports are the endpoint's named ports.
func (ep *endpoint) ports() []api.EndpointPort {
	if ep.rem != nil {
		return ep.rem.Ports
	}
	return ep.wep.Spec.Ports
}

// selection picks endpoints: those in namespace (any when ""), whose
// namespace's labels match namespaces (any when nil) and whose labels match
// pods (any when nil).
type selection struct {
	namespace  string
	pods       *api.LabelSelector
	namespaces *api.LabelSelector
}

func (s selection) matches(ep *endpoint) bool {
	if s.namespace != "" && ep.namespace != s.namespace {
		return false
	}
	if s.namespaces != nil && !s.namespaces.Matches(ep.nsLabels) {
		return false
	}
	if s.pods != nil && !s.pods.Matches(ep.labels) {
		return false
	}
	return true
}

// key identifies the selection; equal keys select the same endpoints.
func (s selection) key() string {
	sel := func(l *api.LabelSelector) string {
		if l == nil {
			return "*"
		}
		return "{" + l.String() + "}"
	}
	return fmt.Sprintf("ns=%s pods=%s namespaces=%s", s.namespace, sel(s.pods), sel(s.namespaces))
}

// shortHash is n characters of a lowercase base32 SHA-256 of s.
func shortHash(s string, n int) string {
	sum := sha256.Sum256([]byte(s))
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:]))[:n]
}

// setName names an IPv4 set of the given kind ('s' selector, 'n' nets,
// 'p' named port) by a hash of its identity: "tabby-s-" and 20 characters.
func setName(kind byte, identity string) string {
	return Prefix + string(kind) + "-" + shortHash(identity, 20)
}

// familySetName names a set of a family: setName's for IPv4, "tabby-s6-"
// and 19 characters of a hash for IPv6.
func familySetName(kind byte, f Family, identity string) string {
	if f == IPv6 {
		return Prefix + string(kind) + "6-" + shortHash(identity, 19)
	}
	return setName(kind, identity)
}

// selectorSet returns the name of the SetTypeNet set holding the addresses
// of family f of the endpoints sel picks, creating it on first use.
func (c *compiler) selectorSet(sel selection, f Family) string {
	name := familySetName('s', f, sel.key())
	if _, ok := c.sets[name]; ok {
		return name
	}
	if c.cache.liveSet(c, name, setDef{sel: sel, fam: f}) {
		return name
	}
	var members []netip.Prefix
	for _, ep := range c.eps {
		if sel.matches(ep) {
			for _, a := range ep.addrs {
				if FamilyOf(a) == f {
					members = append(members, netip.PrefixFrom(a, f.Bits()))
				}
			}
		}
	}
	c.addNetSet(name, f, members)
	return name
}

// netSet returns the name of the SetTypeNet set holding nets minus except,
// all of family f.
func (c *compiler) netSet(f Family, nets, except []netip.Prefix) string {
	var id []string
	for _, n := range nets {
		id = append(id, n.String())
	}
	id = append(id, "except")
	for _, n := range except {
		id = append(id, n.String())
	}
	name := familySetName('n', f, strings.Join(id, " "))
	if _, ok := c.sets[name]; ok {
		return name
	}
	if c.cache.liveSet(c, name, setDef{fixed: true, fam: f}) {
		return name
	}
	c.addNetSet(name, f, netsExcept(nets, except))
	c.cache.storeFixedSet(c.sets[name])
	return name
}

// namedPortSet returns the name of the SetTypeAddrPort set holding
// address (of family f), protocol and port of every endpoint sel picks that
// names a port name for proto.
func (c *compiler) namedPortSet(sel selection, f Family, proto, port string) string {
	proto = strings.ToLower(proto)
	name := familySetName('p', f, sel.key()+" port="+proto+"/"+port)
	if _, ok := c.sets[name]; ok {
		return name
	}
	if c.cache.liveSet(c, name, setDef{sel: sel, fam: f, named: true, proto: proto, port: port}) {
		return name
	}
	var members []AddrPort
	for _, ep := range c.eps {
		if sel.matches(ep) {
			members = append(members, namedPortMembers(ep, f, proto, port)...)
		}
	}
	slices.SortFunc(members, AddrPort.Compare)
	c.sets[name] = &Set{Name: name, Type: SetTypeAddrPort, Family: f, AddrPorts: slices.Compact(members)}
	return name
}

// namedPortMembers are the address (of family f), protocol and port
// triples of ep's port named port for proto (lowercase).
func namedPortMembers(ep *endpoint, f Family, proto, port string) []AddrPort {
	var out []AddrPort
	for _, p := range ep.ports() {
		pp := p.Protocol
		if pp == "" {
			pp = api.ProtocolTCP
		}
		if p.Name != port || strings.ToLower(pp) != proto || p.Port == 0 {
			continue
		}
		for _, a := range ep.addrs {
			if FamilyOf(a) == f {
				out = append(out, AddrPort{Addr: a, Proto: proto, Port: uint16(p.Port)})
			}
		}
	}
	return out
}

// addNetSet records a SetTypeNet set; members are made canonical (masked,
// sorted, covered ones dropped).
func (c *compiler) addNetSet(name string, f Family, members []netip.Prefix) {
	c.sets[name] = &Set{Name: name, Type: SetTypeNet, Family: f, Nets: netsExcept(members, nil)}
}

func (c *compiler) sortedSets() []Set {
	out := make([]Set, 0, len(c.sets))
	for _, k := range slices.Sorted(maps.Keys(c.sets)) {
		out = append(out, *c.sets[k])
	}
	return out
}

// netsExcept returns the prefixes covering nets but none of except, with
// no overlaps, sorted. ipset's hash:net cannot hold /0, so a /0 is split
// into its two halves. Both families may be mixed; a prefix only ever
// covers prefixes of its own family.
func netsExcept(nets, except []netip.Prefix) []netip.Prefix {
	var cur []netip.Prefix
	for _, n := range nets {
		n = n.Masked()
		if n.Bits() == 0 {
			lo := netip.PrefixFrom(n.Addr(), 1)
			cur = append(cur, lo, sibling(lo))
			continue
		}
		cur = append(cur, n)
	}
	for _, e := range except {
		e = e.Masked()
		var next []netip.Prefix
		for _, p := range cur {
			switch {
			case contains(e, p):
				// removed entirely
			case contains(p, e):
				next = append(next, subtract(p, e)...)
			default:
				next = append(next, p)
			}
		}
		cur = next
	}
	slices.SortFunc(cur, netip.Prefix.Compare)
	// Drop prefixes covered by an earlier (shorter or equal) one.
	var out []netip.Prefix
	for _, p := range cur {
		if len(out) > 0 && contains(out[len(out)-1], p) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// contains reports whether a covers all of b.
func contains(a, b netip.Prefix) bool {
	return a.Addr().BitLen() == b.Addr().BitLen() && a.Bits() <= b.Bits() && a.Contains(b.Addr())
}

// subtract returns p without e, where p strictly contains e: the sibling of
// each of e's ancestors below p.
func subtract(p, e netip.Prefix) []netip.Prefix {
	if p == e {
		return nil
	}
	var out []netip.Prefix
	for b := p.Bits() + 1; b <= e.Bits(); b++ {
		out = append(out, sibling(netip.PrefixFrom(e.Addr(), b).Masked()))
	}
	return out
}

// sibling returns the other half of p's parent.
func sibling(p netip.Prefix) netip.Prefix {
	bit := p.Bits() - 1
	if p.Addr().Is4() {
		a := p.Addr().As4()
		a[bit/8] ^= 0x80 >> (bit % 8)
		return netip.PrefixFrom(netip.AddrFrom4(a), p.Bits())
	}
	a := p.Addr().As16()
	a[bit/8] ^= 0x80 >> (bit % 8)
	return netip.PrefixFrom(netip.AddrFrom16(a), p.Bits())
}
