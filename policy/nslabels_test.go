package policy

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/tabbynet/tabby/api"
)

// TestEndpointsShareNamespaceLabels: the Compiler's parsed endpoints of a
// namespace hold one namespace label map between them when their
// namespaces' labels are equal (each endpoint brings its own copy), a
// namespace whose labels differ gets its own, and the table stays bounded.
func TestEndpointsShareNamespaceLabels(t *testing.T) {
	var eps []*api.WorkloadEndpoint
	for i := range 40 {
		ns, env := fmt.Sprintf("ns%d", i%2), "prod"
		if i == 39 {
			env = "dev" // the namespace's labels changed: its newest endpoint says so
		}
		eps = append(eps, testPod{name: fmt.Sprintf("p%d", i), ns: ns, node: "n2", ips: []string{fmt.Sprintf("10.244.2.%d", i)}}.endpoint())
		eps[i].Spec.NamespaceLabels = map[string]string{"env": env} // a map of its own, as decoded
	}
	cc := NewCompiler()
	cc.Compile(Input{Node: "n1", Endpoints: eps})
	maps := map[string]map[uintptr]int{} // namespace → distinct maps → endpoints
	for w, e := range cc.eps {
		want := map[string]string{"env": w.Spec.NamespaceLabels["env"], NamespaceNameLabel: w.Metadata.Namespace}
		if !reflect.DeepEqual(e.nsLabels, want) {
			t.Fatalf("%s: namespace labels %v, want %v", w.Metadata.Name, e.nsLabels, want)
		}
		ns := w.Metadata.Namespace
		if maps[ns] == nil {
			maps[ns] = map[uintptr]int{}
		}
		maps[ns][reflect.ValueOf(e.nsLabels).Pointer()]++
	}
	if len(maps["ns0"]) != 1 || len(maps["ns1"]) != 2 {
		t.Errorf("distinct namespace label maps: ns0 %d, ns1 %d; want 1 and 2 (one per label set)", len(maps["ns0"]), len(maps["ns1"]))
	}

	var tab nsLabelTable
	for i := range maxNsLabelSets + 10 {
		tab.get(fmt.Sprintf("ns%d", i%500), map[string]string{"v": fmt.Sprint(i)})
	}
	held := 0
	for ns, list := range tab.byNs {
		if len(list) > maxNsLabelSetsPerNs {
			t.Errorf("namespace %s: %d label sets held, want at most %d", ns, len(list), maxNsLabelSetsPerNs)
		}
		held += len(list)
	}
	if held != tab.n || held > maxNsLabelSets {
		t.Errorf("table holds %d label sets (counted %d), want at most %d", held, tab.n, maxNsLabelSets)
	}
}
