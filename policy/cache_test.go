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

// TestCompilerEqualsCompile replays random sequences of cluster changes —
// pods added, removed, relabelled, readdressed, renamed ports; policies
// added, removed and changed (selectors, peers, ports, named ports, ipBlocks,
// types); global policies reordered; pools; the node's name; malformed
// inputs that warn — and checks after each step that a long-lived Compiler
// returns exactly what Compile computes from scratch, warnings included.
// Changed objects are new objects, as the cluster view delivers them.
func TestCompilerEqualsCompile(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 16))
			in := benchInput(60, 30)
			in.Endpoints = slices.Clone(in.Endpoints)
			in.NetworkPolicies = slices.Clone(in.NetworkPolicies[:20])
			cc := NewCompiler()
			next := 1000
			for step := range 150 {
				what := mutate(r, &in, &next)
				got, want := cc.Compile(in), Compile(in)
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("step %d (%s): Compiler differs from Compile (-got +want):\n%s", step, what, cmp.Diff(got.Lines(), want.Lines()))
				}
				if !got.Equal(want) || !want.Equal(got) {
					t.Fatalf("step %d (%s): Equal reports a difference between equal rulesets", step, what)
				}
			}
		})
	}
}

// mutate makes one random change to in and names it.
func mutate(r *rand.Rand, in *Input, next *int) string {
	pick := func(n int) int { return r.IntN(n) }
	app := func() string { return fmt.Sprintf("app%d", pick(22)) }
	ns := func() string { return fmt.Sprintf("ns%d", pick(11)) }
	newEP := func() *api.WorkloadEndpoint {
		*next++
		node := []string{"n1", "n2"}[pick(2)]
		w := &api.WorkloadEndpoint{
			Metadata: api.ObjectMeta{Name: fmt.Sprintf("w%d", *next), Namespace: ns(), Labels: map[string]string{"app": app()}},
			Spec: api.WorkloadEndpointSpec{Node: node, InterfaceName: fmt.Sprintf("cali%011x", *next),
				IPNetworks: []string{fmt.Sprintf("10.244.%d.%d/32", 4+pick(3), 1+pick(250))}},
		}
		if pick(3) == 0 {
			w.Spec.Ports = []api.EndpointPort{{Name: "http", Protocol: "TCP", Port: uint16(8000 + pick(3))}}
		}
		switch pick(12) {
		case 0:
			w.Spec.IPNetworks = append(w.Spec.IPNetworks, "not-an-address")
		case 1:
			w.Spec.InterfaceName = "eth9"
		case 2:
			w.Spec.IPNetworks = append(w.Spec.IPNetworks, fmt.Sprintf("10.244.7.%d", pick(4)))
		case 3, 4, 5:
			// Dual-stack.
			w.Spec.IPNetworks = append(w.Spec.IPNetworks, fmt.Sprintf("fd00:10:244:%d::%x/128", 4+pick(3), 1+pick(250)))
		case 6:
			// IPv6 only, with two addresses.
			w.Spec.IPNetworks = []string{fmt.Sprintf("fd00:10:244:7::%x/128", 1+pick(250)), fmt.Sprintf("fd00:10:244:7::%x", 1+pick(4))}
		}
		return w
	}
	newNP := func(namespace, name string) *api.NetworkPolicy {
		peer := api.NetworkPolicyPeer{PodSelector: sel("app", app())}
		switch pick(4) {
		case 0:
			peer.NamespaceSelector = sel(NamespaceNameLabel, ns())
		case 1:
			peer = api.NetworkPolicyPeer{IPBlock: &api.IPBlock{CIDR: "10.244.0.0/16", Except: []string{fmt.Sprintf("10.244.%d.0/24", pick(8))}}}
			if pick(2) == 0 {
				peer.IPBlock = &api.IPBlock{CIDR: "fd00:10:244::/48", Except: []string{fmt.Sprintf("fd00:10:244:%d::/64", pick(8))}}
			}
		}
		port := api.FromInt(int32(8000 + pick(3)))
		if pick(3) == 0 {
			port = api.FromString("http")
		}
		p := ingressFrom(namespace, name, sel("app", app()), []api.NetworkPolicyPeer{peer}, api.NetworkPolicyPort{Protocol: ptr("TCP"), Port: &port})
		if pick(3) == 0 {
			p.Spec.Egress = []api.NetworkPolicyEgressRule{{To: []api.NetworkPolicyPeer{peer}, Ports: []api.NetworkPolicyPort{{Protocol: ptr("TCP"), Port: &port}}}}
			p.Spec.PolicyTypes = []api.PolicyType{api.PolicyTypeIngress, api.PolicyTypeEgress}
		}
		if pick(8) == 0 {
			p.Spec.Ingress[0].From[0].IPBlock = &api.IPBlock{CIDR: "bad"}
			p.Spec.Ingress[0].From[0].PodSelector = nil
			p.Spec.Ingress[0].From[0].NamespaceSelector = nil
		}
		return p
	}
	replaceAt := func(s []*api.WorkloadEndpoint, i int, w *api.WorkloadEndpoint) []*api.WorkloadEndpoint {
		s = slices.Clone(s)
		s[i] = w
		return s
	}
	switch k := pick(14); {
	case k == 0 && len(in.Endpoints) > 1:
		i := pick(len(in.Endpoints))
		in.Endpoints = slices.Delete(slices.Clone(in.Endpoints), i, i+1)
		return "pod removed"
	case k <= 1:
		w := newEP()
		if len(in.Endpoints) > 0 && pick(5) == 0 {
			// Another object with a name or an interface already taken.
			o := in.Endpoints[pick(len(in.Endpoints))]
			if pick(2) == 0 {
				w.Spec.Node, w.Spec.InterfaceName = o.Spec.Node, o.Spec.InterfaceName
				in.Endpoints = append(slices.Clone(in.Endpoints), w)
				return "pod added on a taken interface"
			}
			w.Metadata.Name, w.Metadata.Namespace = o.Metadata.Name, o.Metadata.Namespace
			in.Endpoints = append(slices.Clone(in.Endpoints), w)
			return "pod added with a taken name"
		}
		in.Endpoints = append(slices.Clone(in.Endpoints), w)
		return "pod added"
	case k == 2:
		i := pick(len(in.Endpoints))
		cp := *in.Endpoints[i]
		cp.Metadata.Labels = map[string]string{"app": app()}
		in.Endpoints = replaceAt(in.Endpoints, i, &cp)
		return "pod relabelled"
	case k == 3:
		i := pick(len(in.Endpoints))
		cp := *in.Endpoints[i]
		cp.Spec.IPNetworks = []string{fmt.Sprintf("10.244.%d.%d/32", 4+pick(3), 1+pick(250))}
		if pick(2) == 0 {
			cp.Spec.IPNetworks = append(cp.Spec.IPNetworks, fmt.Sprintf("fd00:10:244:%d::%x/128", 4+pick(3), 1+pick(250)))
		}
		cp.Spec.Ports = []api.EndpointPort{{Name: "http", Protocol: "TCP", Port: uint16(9000 + pick(3))}}
		in.Endpoints = replaceAt(in.Endpoints, i, &cp)
		return "pod readdressed"
	case k == 4 && len(in.NetworkPolicies) > 0:
		i := pick(len(in.NetworkPolicies))
		in.NetworkPolicies = slices.Delete(slices.Clone(in.NetworkPolicies), i, i+1)
		return "policy removed"
	case k <= 5:
		*next++
		in.NetworkPolicies = append(slices.Clone(in.NetworkPolicies), newNP(ns(), fmt.Sprintf("np%d", *next)))
		return "policy added"
	case k <= 7 && len(in.NetworkPolicies) > 0:
		i := pick(len(in.NetworkPolicies))
		old := in.NetworkPolicies[i]
		in.NetworkPolicies = slices.Clone(in.NetworkPolicies)
		in.NetworkPolicies[i] = newNP(old.Metadata.Namespace, old.Metadata.Name)
		return "policy changed"
	case k == 8:
		*next++
		g := gnp(fmt.Sprintf("g%d", pick(4)), float64(pick(3)), api.GlobalNetworkPolicySpec{
			Selector: sel("app", app()),
			Ingress:  []api.Rule{{Action: []string{api.ActionAllow, api.ActionDeny, "Log"}[pick(3)], Source: api.EntityRule{Selector: sel("app", app())}}},
			Egress:   []api.Rule{{Action: api.ActionDeny, Protocol: ptr("TCP"), Destination: api.EntityRule{Ports: []api.IntOrString{api.FromString("http"), api.FromString("80:90")}}}},
		})
		if pick(2) == 0 {
			g.Spec.Ingress[0].Source.Nets = [][]string{{"10.244.0.0/16"}, {"fd00:10:244::/48"}, {"10.244.0.0/16", "fd00:10:244::/48"}}[pick(3)]
			g.Spec.Ingress[0].Source.NotNets = [][]string{nil, {"fd00:10:244:5::/64"}}[pick(2)]
		}
		if pick(3) == 0 {
			g.Spec.Order = nil
		}
		gs := slices.DeleteFunc(slices.Clone(in.GlobalPolicies), func(x *api.GlobalNetworkPolicy) bool { return x.Metadata.Name == g.Metadata.Name })
		in.GlobalPolicies = append(gs, g)
		return "global policy set"
	case k == 9 && len(in.GlobalPolicies) > 0:
		in.GlobalPolicies = in.GlobalPolicies[1:]
		return "global policy removed"
	case k == 10:
		pools := slices.Clone(in.Pools)
		cidr := fmt.Sprintf("10.%d.0.0/16", 100+pick(3))
		if pick(2) == 0 {
			cidr = fmt.Sprintf("fd00:%x::/48", 100+pick(3))
		}
		pools = append(pools, &api.IPPool{Metadata: api.ObjectMeta{Name: fmt.Sprintf("p%d", pick(3))}, Spec: api.IPPoolSpec{CIDR: cidr, NATOutgoing: pick(2) == 0}})
		if len(pools) > 3 {
			pools = pools[1:]
		}
		in.Pools = pools
		return "pools"
	case k == 11 && pick(4) == 0:
		in.Node = []string{"n1", "n2"}[pick(2)]
		return "node " + in.Node
	case k == 12:
		eps := slices.Clone(in.Endpoints)
		r.Shuffle(len(eps), func(i, j int) { eps[i], eps[j] = eps[j], eps[i] })
		in.Endpoints = eps
		return "endpoints reordered"
	case k == 13 && len(in.Endpoints) > 0:
		// The same object listed twice.
		in.Endpoints = append(slices.Clone(in.Endpoints), in.Endpoints[pick(len(in.Endpoints))])
		return "an endpoint listed twice"
	}
	return "nothing"
}
