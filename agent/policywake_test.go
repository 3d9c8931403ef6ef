package agent

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/policy"
)

// TestPolicyOwnerWakesForWhatItsSetsTake replays endpoint changes on
// another node (and one on this node) against a policy with a pod
// selector peer, a namespace selector peer and a named port, and checks
// for each that it wakes the policy owner exactly when it may change this
// node's rules, and that the pass it causes (fed the changes, not the
// whole list) leaves the sets as a pass from scratch would.
func TestPolicyOwnerWakesForWhatItsSetsTake(t *testing.T) {
	ctx := context.Background()
	store := storetest.New(t)
	mustCreate(t, store, &api.IPPool{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16"}})
	web := testWEP("node1", "prod", "web", "cali0000000001", "10.244.1.1", map[string]string{"app": "web"})
	web.Spec.Ports = []api.EndpointPort{{Name: "http", Protocol: "TCP", Port: 8080}}
	mustCreate(t, store, web)
	http, tcp := api.FromString("http"), "TCP"
	mustCreate(t, store, &api.NetworkPolicy{Metadata: api.ObjectMeta{Namespace: "prod", Name: "web"}, Spec: api.NetworkPolicySpec{
		PodSelector: api.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
		Ingress: []api.NetworkPolicyIngressRule{
			{From: []api.NetworkPolicyPeer{{PodSelector: &api.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}}},
			{From: []api.NetworkPolicyPeer{{NamespaceSelector: &api.LabelSelector{MatchLabels: map[string]string{"team": "blue"}}}}},
			{Ports: []api.NetworkPolicyPort{{Protocol: &tcp, Port: &http}}},
		},
	}})
	fw := &fake.Firewall{}
	p := newPolicyOwner("node1", startView(t, store), fw, quietLog())
	if err := p.sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	remote := func(ns, pod, ip string, labels map[string]string) *api.WorkloadEndpoint {
		return testWEP("node2", ns, pod, "cali00000000"+pod[:2], ip, labels)
	}
	create := func(w *api.WorkloadEndpoint) func() error {
		return func() error { _, err := store.Create(ctx, w); return err }
	}
	relabel := func(ns, name string, labels map[string]string) func() error {
		return func() error {
			o, err := store.Get(ctx, api.KindWorkloadEndpoint, ns, name)
			if err != nil {
				return err
			}
			w := o.(*api.WorkloadEndpoint)
			w.Metadata.Labels = labels
			_, err = store.Update(ctx, w)
			return err
		}
	}
	blue := remote("blueteam", "b1", "10.244.2.4", map[string]string{"app": "x"})
	blue.Spec.NamespaceLabels = map[string]string{"team": "blue"}
	red := remote("redteam", "r1", "10.244.2.5", nil)
	red.Spec.NamespaceLabels = map[string]string{"team": "red"}
	web2 := remote("prod", "web2", "10.244.2.6", map[string]string{"app": "web"})
	web2.Spec.Ports = web.Spec.Ports
	tests := []struct {
		name   string
		change func() error
		wake   bool
		member string // an address some selector set holds after the pass
		gone   string // an address no selector set holds after the pass
	}{
		{"a client pod the pod selector takes", create(remote("prod", "c1", "10.244.2.1", map[string]string{"app": "client"})), true, "10.244.2.1/32", ""},
		{"a pod no selector takes", create(remote("prod", "db1", "10.244.2.2", map[string]string{"app": "db"})), false, "", "10.244.2.2/32"},
		{"the pod selector's labels in another namespace", create(remote("dev", "c2", "10.244.2.3", map[string]string{"app": "client"})), false, "", "10.244.2.3/32"},
		{"a namespace the namespace selector takes", create(blue), true, "10.244.2.4/32", ""},
		{"relabelled into the pod selector", relabel("prod", "node2-k8s-db1-eth0", map[string]string{"app": "client"}), true, "10.244.2.2/32", ""},
		{"relabelled out of it", relabel("prod", "node2-k8s-db1-eth0", map[string]string{"app": "db"}), true, "", "10.244.2.2/32"},
		{"relabelled, still out of it", relabel("prod", "node2-k8s-db1-eth0", map[string]string{"app": "db", "v": "2"}), false, "", "10.244.2.2/32"},
		{"a namespace the namespace selector does not take", create(red), false, "", "10.244.2.5/32"},
		{"a pod with the named port the policy's targets use", create(web2), true, "", ""},
		{"the client pod goes", func() error {
			return store.Delete(ctx, api.KindWorkloadEndpoint, "prod", "node2-k8s-c1-eth0", "")
		}, true, "", "10.244.2.1/32"},
		{"a pod of this node", create(testWEP("node1", "dev", "l1", "cali0000000009", "10.244.1.9", nil)), true, "", ""},
	}
	for _, tt := range tests {
		drain(p.sub.C())
		drain(p.kick)
		applies := fw.Applies()
		if err := tt.change(); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		waitStore(t, p, store)
		woke := false
		select {
		case <-p.sub.C():
			woke = true
		default:
		}
		if woke != tt.wake {
			t.Errorf("%s: woke the policy owner: %v, want %v", tt.name, woke, tt.wake)
		}
		if err := p.sync(ctx, false); err != nil {
			t.Fatalf("%s: pass: %v", tt.name, err)
		}
		if !tt.wake && fw.Applies() != applies {
			t.Errorf("%s: did not wake the owner, but its pass changed the rules", tt.name)
		}
		if tt.member != "" {
			policySetHolding(t, fw, tt.member)
		}
		if tt.gone != "" && slices.ContainsFunc(fw.Lines(), func(l string) bool {
			f := strings.Fields(l)
			return len(f) == 3 && f[0] == "add" && f[2] == tt.gone && strings.HasPrefix(f[1], "tabby-s-")
		}) {
			t.Errorf("%s: a selector set still holds %s", tt.name, tt.gone)
		}
		// The pass from the changes leaves what a pass from every
		// endpoint computes.
		want := policy.NewCompiler()
		if got := p.applied; !got.Equal(want.Compile(p.lastInput(t))) {
			t.Errorf("%s: the pass from the changes differs from one from scratch", tt.name)
		}
	}
}

// waitStore waits until the view has offered every write the store holds
// so far to its subscribers.
func waitStore(t *testing.T, p *policyOwner, store *datastore.Store) {
	t.Helper()
	_, rev, err := store.ListKV(context.Background(), "/tabby-none/")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.view.WaitRevision(context.Background(), rev); err != nil {
		t.Fatal(err)
	}
}

// lastInput is the input a pass from scratch would compile now.
func (p *policyOwner) lastInput(t *testing.T) policy.Input {
	t.Helper()
	in := p.input(p.hostInputs())
	in.Endpoints, in.Remote = p.view.Endpoints(), p.view.RemoteEndpoints()
	return in
}

// A change that the Interest of the pass running at the time does not want
// but the next one does (a policy came with it) wakes the owner again when
// that pass publishes its Interest.
func TestEndpointLogJudgesAgainWithTheNewInterest(t *testing.T) {
	local := testWEP("node1", "prod", "web", "cali0000000001", "10.244.1.1", map[string]string{"app": "web"})
	client := testWEP("node2", "prod", "c1", "cali0000000002", "10.244.2.1", map[string]string{"app": "client"})
	in := policy.Input{Node: "node1", Endpoints: []*api.WorkloadEndpoint{local}}
	cc := policy.NewCompiler()
	cc.Compile(in)
	l := endpointLog{node: "node1"}
	if l.record(nil, client) {
		t.Error("before the first compilation, a remote pod woke the owner")
	}
	if !l.publish(nil) {
		t.Error("a change came in before the first compilation, but publish asks for no pass")
	}
	l.take()
	if l.publish(cc.Interest()) {
		t.Error("nothing recorded, but publish asks for another pass")
	}
	if l.record(nil, client) {
		t.Error("a remote pod woke the owner although no policy exists")
	}
	in.NetworkPolicies = []*api.NetworkPolicy{{Metadata: api.ObjectMeta{Namespace: "prod", Name: "web"}, Spec: api.NetworkPolicySpec{
		PodSelector: api.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
		Ingress:     []api.NetworkPolicyIngressRule{{From: []api.NetworkPolicyPeer{{PodSelector: &api.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}}}},
	}}}
	cc.Compile(in)
	if !l.publish(cc.Interest()) {
		t.Error("the new Interest wants the recorded pod, but publish asks for no pass")
	}
	if changes, all := l.take(); all || len(changes) != 1 || changes[0].New != client {
		t.Errorf("take: %v %v", changes, all)
	}
	if !l.record(client, nil) {
		t.Error("the pod's deletion did not wake the owner under the new Interest")
	}
	if l.publish(cc.Interest()) {
		t.Error("the deletion woke the owner already, but publish asks for another pass")
	}
}
