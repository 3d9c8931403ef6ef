package agent

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/datastore/storetest"
)

// The policy owner polices the node's host endpoints: none at first
// (nothing policed), then the automatic one once the cluster enables it,
// with the node's labels and the agent's health port among the failsafes;
// a named endpoint whose interface the node lacks is reported, and stops
// being reported when the interface appears.
func TestPolicyOwnerHostEndpoints(t *testing.T) {
	ctx := context.Background()
	store := storetest.New(t)
	mustCreate(t, store, &api.Node{Metadata: api.ObjectMeta{Name: "node1", Labels: map[string]string{"role": "worker"}}})
	fw := &fake.Firewall{}
	view := startView(t, store)
	p := newPolicyOwner("node1", view, fw, quietLog())
	links := map[string]bool{"eth0": true}
	p.host = hostConfig{healthPort: 9099, linkExists: func(n string) bool { return links[n] }}
	if err := p.sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	if _, ok := fw.Rules("filter", "tabby-HOST-IN"); ok {
		t.Fatal("host endpoint chains without a host endpoint")
	}

	rev, err := store.Create(ctx, &api.ClusterConfiguration{Metadata: api.ObjectMeta{Name: "default"}, Spec: api.ClusterConfigurationSpec{AutoHostEndpoints: api.Enabled}})
	if err != nil {
		t.Fatal(err)
	}
	if err := view.WaitRevision(ctx, mustRev(t, rev)); err != nil {
		t.Fatal(err)
	}
	if err := p.sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	in, ok := fw.Rules("filter", "tabby-HOST-IN")
	if !ok || !slices.ContainsFunc(in, func(r string) bool { return strings.Contains(r, "-g tabby-hi-") }) {
		t.Fatalf("no dispatch to the automatic host endpoint:\n%s", strings.Join(fw.Lines(), "\n"))
	}
	hi := ""
	for _, l := range fw.Lines() {
		if strings.Contains(l, "tabby-hi-") && strings.Contains(l, "9099") {
			hi = l
		}
	}
	if hi == "" {
		t.Errorf("the health port is not a failsafe:\n%s", strings.Join(fw.Lines(), "\n"))
	}
	if st := p.hostEndpoints(); len(st) != 1 || st[0].Name != "node1-auto-hep" || st[0].State != api.HostEndpointPoliced {
		t.Errorf("status %+v", st)
	}

	hep := &api.HostEndpoint{Metadata: api.ObjectMeta{Name: "node1-eth9"}, Spec: api.HostEndpointSpec{Node: "node1", InterfaceName: "eth9"}}
	obj, err := store.Create(ctx, hep)
	if err != nil {
		t.Fatal(err)
	}
	if err := view.WaitRevision(ctx, mustRev(t, obj)); err != nil {
		t.Fatal(err)
	}
	if err := p.sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	want := []api.HostEndpointStatus{{Name: "node1-auto-hep", Interface: "*", State: api.HostEndpointPoliced},
		{Name: "node1-eth9", Interface: "eth9", State: api.HostEndpointNoInterface}}
	if st := p.hostEndpoints(); !slices.Equal(st, want) {
		t.Errorf("status %+v, want %+v", st, want)
	}
	if in, _ := fw.Rules("filter", "tabby-HOST-IN"); !slices.ContainsFunc(in, func(r string) bool { return strings.Contains(r, "-i eth9") }) {
		t.Errorf("the missing interface's rules are not in place:\n%s", strings.Join(in, "\n"))
	}
	links["eth9"] = true
	// The periodic pass notices.
	if err := p.sync(ctx, true); err != nil {
		t.Fatal(err)
	}
	if st := p.hostEndpoints(); st[1].State != api.HostEndpointPoliced {
		t.Errorf("interface appeared: status %+v", st)
	}
}

// watchLinks wakes the policy loop for an interface a host endpoint waits
// for, and only for such an interface.
func TestPolicyOwnerWatchLinks(t *testing.T) {
	store := storetest.New(t)
	p := newPolicyOwner("node1", startView(t, store), &fake.Firewall{}, quietLog())
	p.hostSt = []api.HostEndpointStatus{{Name: "node1-eth9", Interface: "eth9", State: api.HostEndpointNoInterface}}
	links := make(chan string)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.watchLinks(ctx, func(context.Context) (<-chan string, error) { return links, nil })
	}()
	links <- "eth1"
	links <- "eth1" // the first is handled once the second is taken
	select {
	case <-p.kick:
		t.Fatal("woken for an interface no host endpoint waits for")
	default:
	}
	links <- "eth9"
	close(links)
	<-done
	select {
	case <-p.kick:
	default:
		t.Error("not woken for eth9")
	}
	cancel()
}
