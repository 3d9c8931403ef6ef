package policy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/tabbynet/tabby/api"
)

// The endpoints a Compiler keeps between passes, and the two ways a pass
// learns them: the whole list (Compile), or the changes since the last
// pass (CompileChanges), which costs in proportion to the changes.

// EndpointChange is one change of the cluster's endpoints as the cluster
// view reports it: Old (nil for a creation) became New (nil for a
// deletion). A changed endpoint is a new object.
type EndpointChange struct {
	Old, New *api.WorkloadEndpoint
	// OldRemote and NewRemote are a change of an endpoint of another node
	// in compact form (Input.Remote). A change sets these or Old and New.
	OldRemote, NewRemote *api.RemoteEndpoint
}

// CompileChanges compiles like Compile, with in.Endpoints and in.Remote (ignored)
// replaced by the endpoints of the Compiler's last call with changes
// applied in order. The endpoints cost in proportion to the changes, not
// to how many there are. A change the last call's endpoints already hold
// may come again (a caller that read every endpoint after it started
// collecting changes): applying the changes of one key in order still ends
// at that key's last value.
//
// It reports false and compiles nothing when the Compiler holds no
// endpoints for in.Node (its first call, or a call for another node): the
// caller then calls Compile with every endpoint. The output is Compile's
// for the same endpoints, in any order, as long as no two share a
// namespace and name (the cluster view's keys).
func (cc *Compiler) CompileChanges(in Input, changes []EndpointChange) (*Ruleset, bool) {
	if !cc.started || cc.other.Node != in.Node {
		return nil, false
	}
	in.Endpoints, in.Remote = nil, nil
	cc.changes, cc.delta = changes, true
	defer func() { cc.changes, cc.delta = nil, false }()
	return compile(in, cc), true
}

// epEntry is an endpoint the Compiler holds, parsed: one allocation per
// endpoint of the cluster, its few warnings apart (Compiler.warned), so
// that it takes 112 bytes, not 96 and 64 in two (docs/scale.md, "Agent
// memory").
type epEntry struct {
	endpoint
	seen   uint64 // the last pass that listed it
	born   uint64 // the pass that added it
	gone   bool   // removed in the pass that added it
	warned bool   // it has warnings, in Compiler.warned
}

// ep is the parsed endpoint, whose address the sets keep.
func (e *epEntry) ep() *endpoint { return &e.endpoint }

// warnedEP is an endpoint with its warnings.
type warnedEP struct {
	ep       *endpoint
	warnings []string
}

// parseEndpoints fills c.local and the endpoints' warnings, and, without a
// Compiler, c.eps (with one, the sets read its endpoints).
func (c *compiler) parseEndpoints() {
	cc := c.cache
	switch {
	case cc == nil:
		var warned []warnedEP
		c.eps = make([]*endpoint, 0, len(c.in.Endpoints)+len(c.in.Remote))
		take := func(e *epEntry, ws []string) {
			c.eps = append(c.eps, e.ep())
			if e.policed {
				c.local = append(c.local, e.ep())
			}
			if len(ws) > 0 {
				warned = append(warned, warnedEP{e.ep(), ws})
			}
		}
		for _, w := range c.in.Endpoints {
			if w != nil {
				take(c.parse(w))
			}
		}
		for _, r := range c.in.Remote {
			if r != nil {
				take(c.parseRemote(r))
			}
		}
		c.endpointWarnings(warned)
		c.local = c.police(c.local)
	case cc.delta:
		cc.applyChanges(c)
	default:
		cc.list(c)
	}
}

// parse parses one endpoint, keeping its warnings apart.
func (c *compiler) parse(w *api.WorkloadEndpoint) (*epEntry, []string) {
	w0 := len(c.warnings)
	e := &epEntry{}
	c.parseEndpoint(&e.endpoint, w)
	return e, c.takeWarnings(e, w0)
}

// parseRemote parses an endpoint of another node in compact form.
func (c *compiler) parseRemote(r *api.RemoteEndpoint) (*epEntry, []string) {
	w0 := len(c.warnings)
	e := &epEntry{}
	c.parseRemoteEndpoint(&e.endpoint, r)
	return e, c.takeWarnings(e, w0)
}

// takeWarnings removes the warnings from w0 on, for e.
func (c *compiler) takeWarnings(e *epEntry, w0 int) []string {
	ws := slices.Clone(c.warnings[w0:])
	c.warnings = c.warnings[:w0]
	e.warned = len(ws) > 0
	return ws
}

// endpointWarnings adds the warnings of the endpoints that have any, by
// endpoint name, so that they do not depend on the order of the input.
func (c *compiler) endpointWarnings(warned []warnedEP) {
	slices.SortStableFunc(warned, func(a, b warnedEP) int {
		return cmp.Or(cmp.Compare(a.ep.name(), b.ep.name()), slices.Compare(a.warnings, b.warnings))
	})
	for _, e := range warned {
		c.warnings = append(c.warnings, e.warnings...)
	}
}

// police sorts the policed endpoints by interface (then name) and keeps
// the first of two endpoints claiming one interface, so that each
// interface has one chain.
func (c *compiler) police(local []*endpoint) []*endpoint {
	slices.SortStableFunc(local, func(a, b *endpoint) int {
		return cmp.Or(cmp.Compare(a.iface(), b.iface()), cmp.Compare(a.name(), b.name()))
	})
	return slices.CompactFunc(local, func(a, b *endpoint) bool {
		if a.iface() == b.iface() {
			c.warnf("endpoints %s and %s share interface %s: %s not policed", a.name(), b.name(), a.iface(), b.name())
			return true
		}
		return false
	})
}

// list takes the whole list of endpoints: the ones it does not hold are
// parsed, the ones not listed any more removed.
func (cc *Compiler) list(c *compiler) {
	cc.pass++
	var warned []warnedEP
	var local []*endpoint
	dup := false
	// visit takes a listed entry; ws are its warnings when it has any.
	visit := func(e *epEntry, ws []string) {
		if e.seen == cc.pass {
			dup = true // listed twice: it counts twice, as Compile counts it
		}
		e.seen = cc.pass
		if e.warned {
			warned = append(warned, warnedEP{e.ep(), ws})
		}
		if e.policed {
			local = append(local, e.ep())
		}
	}
	for _, w := range c.in.Endpoints {
		if w == nil {
			continue
		}
		e := cc.eps[w]
		if e == nil {
			e = cc.add(c, w)
		}
		var ws []string
		if e.warned {
			ws = cc.warned[w]
		}
		visit(e, ws)
	}
	for _, r := range c.in.Remote {
		if r == nil {
			continue
		}
		e := cc.remote[r]
		if e == nil {
			e = cc.addRemote(c, r)
		}
		var ws []string
		if e.warned {
			ws = cc.warnedRemote[r]
		}
		visit(e, ws)
	}
	for w, e := range cc.eps {
		if e.seen != cc.pass {
			cc.remove(w, e)
		}
	}
	for r, e := range cc.remote {
		if e.seen != cc.pass {
			cc.removeRemote(r, e)
		}
	}
	c.endpointWarnings(warned)
	if dup {
		c.local = c.police(local)
		return
	}
	cc.policeLocal(c)
}

// applyChanges applies CompileChanges's changes to the endpoints held.
func (cc *Compiler) applyChanges(c *compiler) {
	cc.pass++
	for _, ch := range cc.changes {
		if ch.Old != nil && ch.Old != ch.New {
			if e := cc.eps[ch.Old]; e != nil {
				cc.remove(ch.Old, e)
			}
		}
		if ch.New != nil && cc.eps[ch.New] == nil {
			cc.add(c, ch.New)
		}
		if ch.OldRemote != nil && ch.OldRemote != ch.NewRemote {
			if e := cc.remote[ch.OldRemote]; e != nil {
				cc.removeRemote(ch.OldRemote, e)
			}
		}
		if ch.NewRemote != nil && cc.remote[ch.NewRemote] == nil {
			cc.addRemote(c, ch.NewRemote)
		}
	}
	cc.added = slices.DeleteFunc(cc.added, func(e *epEntry) bool { return e.gone })
	warned := make([]warnedEP, 0, len(cc.warned)+len(cc.warnedRemote))
	for w, ws := range cc.warned {
		warned = append(warned, warnedEP{cc.eps[w].ep(), ws})
	}
	for r, ws := range cc.warnedRemote {
		warned = append(warned, warnedEP{cc.remote[r].ep(), ws})
	}
	c.endpointWarnings(warned)
	cc.policeLocal(c)
}

// policeLocal sets c.local to the held policed endpoints, policed as
// police does, sorting them again only when they changed.
func (cc *Compiler) policeLocal(c *compiler) {
	if cc.localDirty {
		local := make([]*endpoint, 0, len(cc.local))
		for _, e := range cc.local {
			local = append(local, e.ep())
		}
		w0 := len(c.warnings)
		cc.sortedLocal = c.police(local)
		cc.localWarnings = slices.Clone(c.warnings[w0:])
		c.warnings = c.warnings[:w0]
		cc.localDirty = false
	}
	c.local = cc.sortedLocal
	c.warnings = append(c.warnings, cc.localWarnings...)
}

func (cc *Compiler) add(c *compiler, w *api.WorkloadEndpoint) *epEntry {
	e, ws := c.parse(w)
	e.born = cc.pass
	cc.eps[w] = e
	if e.policed {
		cc.local[w] = e
		cc.localDirty = true
	}
	if len(ws) > 0 {
		cc.warned[w] = ws
	}
	cc.added = append(cc.added, e)
	return e
}

// addRemote is add for an endpoint in compact form, which is never
// policed here (it has no interface).
func (cc *Compiler) addRemote(c *compiler, r *api.RemoteEndpoint) *epEntry {
	e, ws := c.parseRemote(r)
	e.born = cc.pass
	cc.remote[r] = e
	if len(ws) > 0 {
		cc.warnedRemote[r] = ws
	}
	cc.added = append(cc.added, e)
	return e
}

func (cc *Compiler) remove(w *api.WorkloadEndpoint, e *epEntry) {
	delete(cc.eps, w)
	delete(cc.warned, w)
	if e.policed {
		delete(cc.local, w)
		cc.localDirty = true
	}
	cc.dropped(e)
}

func (cc *Compiler) removeRemote(r *api.RemoteEndpoint, e *epEntry) {
	delete(cc.remote, r)
	delete(cc.warnedRemote, r)
	cc.dropped(e)
}

// dropped notes a removed endpoint for the sets.
func (cc *Compiler) dropped(e *epEntry) {
	if e.born == cc.pass {
		e.gone = true // came and went in this pass: the sets never saw it
		return
	}
	cc.removed = append(cc.removed, e.ep())
}

// parseEndpoint parses one endpoint into ep; its warnings go to
// c.warnings.
func (c *compiler) parseEndpoint(ep *endpoint, w *api.WorkloadEndpoint) {
	ns := endpointNamespace(w.Metadata.Namespace)
	*ep = endpoint{wep: w}
	c.fillEndpoint(ep, ns, w.Metadata.Labels, w.Spec.NamespaceLabels, w.Spec.Node, w.Spec.IPNetworks)
}

// parseRemoteEndpoint is parseEndpoint for an endpoint in compact form.
func (c *compiler) parseRemoteEndpoint(ep *endpoint, r *api.RemoteEndpoint) {
	*ep = endpoint{rem: r}
	c.fillEndpoint(ep, endpointNamespace(r.Namespace), r.Labels, r.NamespaceLabels, r.Node, r.IPNetworks)
}

// fillEndpoint sets the parsed fields of ep, whose source is set.
func (c *compiler) fillEndpoint(ep *endpoint, ns string, labels, nsLabels map[string]string, node string, ipNetworks []string) {
	ep.namespace, ep.labels, ep.nsLabels = ns, labels, c.nsLabels().get(ns, nsLabels)
	ep.local = node == c.in.Node
	for _, n := range ipNetworks {
		a, problem := parseEndpointAddr(n)
		if problem != "" {
			c.warnf("endpoint %s: %s", ep.name(), problem)
			continue
		}
		ep.addrs = append(ep.addrs, a)
	}
	slices.SortFunc(ep.addrs, netip.Addr.Compare)
	ep.addrs = slices.Compact(ep.addrs)
	if !ep.local {
		return
	}
	switch iface := ep.iface(); {
	case !strings.HasPrefix(iface, WorkloadIfacePrefix) || len(iface) <= len(WorkloadIfacePrefix):
		c.warnf("endpoint %s: interface %q does not start with %q: not policed", ep.name(), iface, WorkloadIfacePrefix)
	case len(iface) > 15:
		c.warnf("endpoint %s: interface %q is longer than 15 characters: not policed", ep.name(), iface)
	default:
		ep.policed = true
	}
}

func endpointNamespace(ns string) string {
	if ns == "" {
		return "default"
	}
	return ns
}

// parseEndpointAddr parses one of an endpoint's addresses (a prefix or a
// bare address), or says what is wrong with it.
func parseEndpointAddr(n string) (netip.Addr, string) {
	p, err := netip.ParsePrefix(n)
	if err != nil {
		a, aerr := netip.ParseAddr(n)
		if aerr != nil {
			return netip.Addr{}, fmt.Sprintf("address %q: %v", n, err)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if p.Addr().Is4In6() || p.Addr().Zone() != "" {
		return netip.Addr{}, fmt.Sprintf("address %q is IPv4-mapped or has a zone", n)
	}
	return p.Addr(), ""
}
