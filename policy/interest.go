package policy

import (
	"github.com/tabbynet/tabby/api"
)

// Interest says which endpoints a compiled Ruleset depends on, so that a
// change of any other endpoint needs no pass: this node's own endpoints,
// the endpoints whose addresses warn, and those a selector of one of the
// Ruleset's sets takes (the sets of a peer's pod and namespace selectors,
// and their named ports). An endpoint no such selector takes is in no
// set, and the rest of the Ruleset (chains, the other sets) is made of
// policies, pools, host endpoints and this node's endpoints only.
//
// An Interest is immutable and safe for concurrent use. It holds for the
// Ruleset it was taken with: once the policies (or this node's endpoints,
// which decide which policies apply here) change, only the Interest of the
// next compilation does.
type Interest struct {
	node string
	// Selections by namespace, and those of any namespace.
	byNamespace map[string][]selection
	anyNs       []selection
}

// Interest returns what the Ruleset of the Compiler's last call depends
// on; nil before its first call (a nil Interest wants every endpoint).
// The Interest is built again only when the sets changed.
func (cc *Compiler) Interest() *Interest {
	if !cc.started {
		return nil
	}
	if cc.interest != nil && cc.interestVersion == cc.setsVersion {
		return cc.interest
	}
	in := &Interest{node: cc.other.Node, byNamespace: map[string][]selection{}}
	seen := map[string]bool{}
	for _, s := range cc.sets {
		if s.def.fixed {
			continue
		}
		k := s.def.sel.key()
		if seen[k] {
			continue
		}
		seen[k] = true
		if s.def.sel.namespace == "" {
			in.anyNs = append(in.anyNs, s.def.sel)
		} else {
			in.byNamespace[s.def.sel.namespace] = append(in.byNamespace[s.def.sel.namespace], s.def.sel)
		}
	}
	cc.interest, cc.interestVersion = in, cc.setsVersion
	return in
}

// Wants reports whether the endpoint w, as an old or a new value of a
// change, may change the Ruleset the Interest was taken with. A nil w
// (the missing side of a creation or deletion) changes nothing.
func (in *Interest) Wants(w *api.WorkloadEndpoint) bool {
	if w == nil {
		return false
	}
	return in.wants(w.Spec.Node, w.Spec.IPNetworks, w.Metadata.Namespace, w.Metadata.Labels, w.Spec.NamespaceLabels)
}

// WantsRemote is Wants for an endpoint in compact form (Input.Remote).
func (in *Interest) WantsRemote(r *api.RemoteEndpoint) bool {
	if r == nil {
		return false
	}
	return in.wants(r.Node, r.IPNetworks, r.Namespace, r.Labels, r.NamespaceLabels)
}

func (in *Interest) wants(node string, ipNetworks []string, namespace string, labels, nsLabels map[string]string) bool {
	if in == nil || node == in.node {
		return true
	}
	for _, n := range ipNetworks {
		if _, problem := parseEndpointAddr(n); problem != "" {
			return true // its warning is part of the Ruleset
		}
	}
	ns := endpointNamespace(namespace)
	sels := in.byNamespace[ns]
	if len(sels) == 0 && len(in.anyNs) == 0 {
		return false
	}
	ep := endpoint{namespace: ns, labels: labels}
	for _, group := range [][]selection{sels, in.anyNs} {
		for _, s := range group {
			if s.namespaces != nil && ep.nsLabels == nil {
				ep.nsLabels = namespaceLabels(ns, nsLabels)
			}
			if s.matches(&ep) {
				return true
			}
		}
	}
	return false
}

// Selectors returns how many distinct selectors the Interest holds (for
// metrics and tests).
func (in *Interest) Selectors() int {
	if in == nil {
		return 0
	}
	n := len(in.anyNs)
	for _, s := range in.byNamespace {
		n += len(s)
	}
	return n
}
