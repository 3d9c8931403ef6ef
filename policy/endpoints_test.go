package policy

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
)

// endpointChanges are the changes that turn the endpoint list from into
// to, as the cluster view would report them (each object once).
func endpointChanges(from, to []*api.WorkloadEndpoint) []EndpointChange {
	var out []EndpointChange
	for _, w := range from {
		if !slices.Contains(to, w) {
			out = append(out, EndpointChange{Old: w})
		}
	}
	for _, w := range to {
		if !slices.Contains(from, w) {
			out = append(out, EndpointChange{New: w})
		}
	}
	return out
}

// uniqueEndpoints drops the second listing of an object (the cluster view
// lists each once; CompileChanges counts each once).
func uniqueEndpoints(eps []*api.WorkloadEndpoint) []*api.WorkloadEndpoint {
	var out []*api.WorkloadEndpoint
	for _, w := range eps {
		if !slices.Contains(out, w) {
			out = append(out, w)
		}
	}
	return out
}

// compactSplit gives other nodes' endpoints to a Compiler in compact form
// (Input.Remote), each object always as the same RemoteEndpoint, as an
// agent's cluster view does.
type compactSplit map[*api.WorkloadEndpoint]*api.RemoteEndpoint

func (s compactSplit) remote(w *api.WorkloadEndpoint) *api.RemoteEndpoint {
	r := s[w]
	if r == nil {
		r = w.Remote(0)
		s[w] = r
	}
	return r
}

// input splits in.Endpoints into whole (in.Node's) and compact ones.
func (s compactSplit) input(in Input) Input {
	out := in
	out.Endpoints, out.Remote = nil, nil
	for _, w := range in.Endpoints {
		if w.Spec.Node == in.Node {
			out.Endpoints = append(out.Endpoints, w)
		} else {
			out.Remote = append(out.Remote, s.remote(w))
		}
	}
	return out
}

// changes turns changes of whole endpoints into the view's for node.
func (s compactSplit) changes(node string, changes []EndpointChange) []EndpointChange {
	out := make([]EndpointChange, 0, len(changes))
	for _, c := range changes {
		w := c.Old
		if w == nil {
			w = c.New
		}
		if w.Spec.Node == node {
			out = append(out, c)
			continue
		}
		var rc EndpointChange
		if c.Old != nil {
			rc.OldRemote = s.remote(c.Old)
		}
		if c.New != nil {
			rc.NewRemote = s.remote(c.New)
		}
		out = append(out, rc)
	}
	return out
}

// TestCompileChangesEqualsCompile replays TestCompilerEqualsCompile's random
// changes through CompileChanges (sometimes with the last step's changes
// again in front, as a caller that read every endpoint after it started
// collecting changes sends them), a full list now and then, and checks
// after each step that the result is Compile's. It also checks the
// Interest: when every endpoint a step's changes touch is one the last
// Interest does not want, and nothing but endpoints changed, the Ruleset
// is the last one. In its compact variant the Compiler is given other
// nodes' endpoints in compact form (Input.Remote), as the agent's view
// holds them, and must still compile what Compile does from the whole
// ones.
func TestCompileChangesEqualsCompile(t *testing.T) {
	for _, compact := range []bool{false, true} {
		for seed := range uint64(8) {
			t.Run(fmt.Sprintf("compact=%t/%d", compact, seed), func(t *testing.T) { testCompileChanges(t, seed, compact) })
		}
	}
}

func testCompileChanges(t *testing.T, seed uint64, compact bool) {
	split := compactSplit{}
	view := func(in Input) Input { return in }
	viewChanges := func(_ string, c []EndpointChange) []EndpointChange { return c }
	if compact {
		view, viewChanges = split.input, split.changes
	}
	r := rand.New(rand.NewPCG(seed, 29))
	in := benchInput(60, 30)
	in.Endpoints = slices.Clone(in.Endpoints)
	in.NetworkPolicies = slices.Clone(in.NetworkPolicies[:20])
	cc := NewCompiler()
	last := cc.Compile(view(in))
	var prev []EndpointChange
	next, skipped := 1000, 0
	for step := range 200 {
		before := in
		what := mutate(r, &in, &next)
		in.Endpoints = uniqueEndpoints(in.Endpoints)
		changes := viewChanges(in.Node, endpointChanges(before.Endpoints, in.Endpoints))
		interest := cc.Interest()
		var got *Ruleset
		switch {
		case r.IntN(10) == 0:
			got = cc.Compile(view(in))
		case r.IntN(3) == 0:
			got = compileChanges(t, cc, view(in), append(slices.Clone(prev), changes...))
		default:
			got = compileChanges(t, cc, view(in), changes)
		}
		prev = changes
		want := Compile(in)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d (%s): CompileChanges differs from Compile (-got +want):\n%s", step, what, cmp.Diff(got.Lines(), want.Lines()))
		}
		if compact && step%20 == 0 {
			if got := Compile(view(in)); !reflect.DeepEqual(got, want) {
				t.Fatalf("step %d (%s): Compile of compact endpoints differs from Compile (-got +want):\n%s", step, what, cmp.Diff(got.Lines(), want.Lines()))
			}
		}
		endpointsOnly := in.Node == before.Node && reflect.DeepEqual(in.NetworkPolicies, before.NetworkPolicies) &&
			reflect.DeepEqual(in.GlobalPolicies, before.GlobalPolicies) && reflect.DeepEqual(in.Pools, before.Pools)
		wanted := slices.ContainsFunc(changes, func(c EndpointChange) bool {
			return interest.Wants(c.Old) || interest.Wants(c.New) || interest.WantsRemote(c.OldRemote) || interest.WantsRemote(c.NewRemote)
		})
		if endpointsOnly && len(changes) > 0 && !wanted {
			skipped++
			if !got.Equal(last) {
				t.Fatalf("step %d (%s): the Interest wanted none of %d changes, but the Ruleset changed (-new +last):\n%s",
					step, what, len(changes), cmp.Diff(got.Lines(), last.Lines()))
			}
		}
		last = got
	}
	if skipped == 0 {
		t.Error("no step changed only endpoints the Interest does not want: the check never ran")
	}
}

func compileChanges(t *testing.T, cc *Compiler, in Input, changes []EndpointChange) *Ruleset {
	t.Helper()
	rs, ok := cc.CompileChanges(in, changes)
	if !ok {
		return cc.Compile(in) // another node: the caller lists every endpoint
	}
	return rs
}

// BenchmarkInterestWants is the policy owner's filter for another node's
// pod: 31 selections (the agent benchmark's role sets), an endpoint none
// takes and one a selection takes.
func BenchmarkInterestWants(b *testing.B) {
	in := Input{Node: "n1"}
	for i := range 31 {
		in.Endpoints = append(in.Endpoints, &api.WorkloadEndpoint{
			Metadata: api.ObjectMeta{Name: fmt.Sprintf("l%d", i), Namespace: "default", Labels: map[string]string{"app": fmt.Sprintf("svc-%d", i)}},
			Spec:     api.WorkloadEndpointSpec{Node: "n1", InterfaceName: fmt.Sprintf("cali%011x", i), IPNetworks: []string{fmt.Sprintf("10.244.0.%d/32", i+1)}},
		})
		in.NetworkPolicies = append(in.NetworkPolicies, ingressFrom("default", fmt.Sprintf("p%d", i), sel("app", fmt.Sprintf("svc-%d", i)),
			[]api.NetworkPolicyPeer{{PodSelector: sel("role", fmt.Sprintf("r-%d", i))}}))
	}
	cc := NewCompiler()
	cc.Compile(in)
	interest := cc.Interest()
	remote := func(role string) *api.WorkloadEndpoint {
		return &api.WorkloadEndpoint{Metadata: api.ObjectMeta{Name: "x", Namespace: "default", Labels: map[string]string{"app": "svc-7", "role": role}},
			Spec: api.WorkloadEndpointSpec{Node: "n2", InterfaceName: "cali00000000099", IPNetworks: []string{"10.244.9.9/32"}}}
	}
	for _, tc := range []struct {
		name string
		w    *api.WorkloadEndpoint
		want bool
	}{{"none", remote("r-40"), false}, {"one", remote("r-30"), true}} {
		b.Run(tc.name, func(b *testing.B) {
			if interest.Selectors() != 31 || interest.Wants(tc.w) != tc.want {
				b.Fatalf("%d selectors, Wants %v", interest.Selectors(), !tc.want)
			}
			for b.Loop() {
				interest.Wants(tc.w)
			}
		})
	}
}
