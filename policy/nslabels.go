package policy

import "maps"

// nsLabelTable shares the namespace label maps endpoints are matched
// against (the namespace's labels plus NamespaceNameLabel): the pods of a
// namespace have equal ones, and a small Go map costs ≈ 300 bytes. Held by
// every parsed endpoint of the cluster, one map each was a fifth of the
// agent's heap at 30,000 endpoints (docs/scale.md, "Agent memory"). The
// maps are read-only. The table is bounded: a namespace keeps its last
// few label sets, and the whole table is forgotten when it holds too
// many; endpoints keep the maps they were given, so forgetting only costs
// sharing, never correctness.
type nsLabelTable struct {
	byNs map[string][]nsLabelEntry
	n    int
}

type nsLabelEntry struct {
	src, merged map[string]string
}

const (
	maxNsLabelSets      = 4096 // in the table
	maxNsLabelSetsPerNs = 8    // per namespace (labels that changed often)
)

// get returns namespaceLabels(ns, src), shared with the earlier calls
// for ns with labels equal to src.
func (t *nsLabelTable) get(ns string, src map[string]string) map[string]string {
	list := t.byNs[ns]
	for _, e := range list {
		if maps.Equal(e.src, src) {
			return e.merged
		}
	}
	if t.byNs == nil || t.n >= maxNsLabelSets {
		t.byNs, t.n, list = map[string][]nsLabelEntry{}, 0, nil
	}
	if len(list) >= maxNsLabelSetsPerNs {
		t.n -= len(list)
		list = nil
	}
	m := namespaceLabels(ns, src)
	t.byNs[ns] = append(list, nsLabelEntry{src: src, merged: m})
	t.n++
	return m
}

// nsLabels is the table of this pass's Compiler, which keeps it across
// passes, or, without one, of this pass.
func (c *compiler) nsLabels() *nsLabelTable {
	if c.cache != nil {
		return &c.cache.nsLabels
	}
	if c.nsTable == nil {
		c.nsTable = &nsLabelTable{}
	}
	return c.nsTable
}
