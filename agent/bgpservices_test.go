package agent

import (
	"context"
	"encoding/json"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/agent/routetable"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/syncer/syncertest"
)

// serviceScript feeds a view one object at a time.
type serviceScript struct {
	t   *testing.T
	src syncertest.Script
	rev int64
}

func (s *serviceScript) put(obj api.Object) int64 {
	s.t.Helper()
	obj.SetDefaults()
	key, err := datastore.ResourceKey(api.KindOf(obj), obj.GetMeta().Namespace, obj.GetMeta().Name)
	if err != nil {
		s.t.Fatal(err)
	}
	b, err := json.Marshal(obj)
	if err != nil {
		s.t.Fatal(err)
	}
	s.rev++
	s.src <- datastore.Event{Type: datastore.EventPut, KV: datastore.KV{Key: key, Value: b, ModRevision: s.rev}, Revision: s.rev}
	return s.rev
}

func lbService(name, policy string, nodes []string, lb ...string) *api.Service {
	return &api.Service{Metadata: api.ObjectMeta{Namespace: "default", Name: name},
		Spec: api.ServiceSpec{Type: "LoadBalancer", ClusterIPs: []string{"10.96.0.10"}, LoadBalancerIPs: lb, ExternalTrafficPolicy: policy, EndpointNodes: nodes}}
}

// TestServiceAdvertisementsFollowRecords: the owner advertises what the
// Service records and the configuration allow, blackholes it (the Service
// route class), is woken by a record change that concerns its node and
// not by one that does not, refuses and reports an address outside the
// ranges, and never installs a learned route to a Service address.
func TestServiceAdvertisementsFollowRecords(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	src := make(syncertest.Script)
	v := syncertest.Start(t, src, quietLog(), false)
	routes := fake.NewRoutes()
	sp := newFakeSpeaker()
	b := newBGPOwner("node1", netip.MustParsePrefix("198.18.0.11/24"), v, routetable.New(routes, 0), sp, nil, 0, newMetrics(), quietLog())
	src <- datastore.Event{Type: datastore.EventResync, Revision: 1}
	s := &serviceScript{t: t, src: src, rev: 1}
	s.put(&api.BGPConfiguration{Metadata: api.ObjectMeta{Name: api.SingletonName}, Spec: api.BGPConfigurationSpec{
		ServiceClusterIPs:      []api.ServiceCIDR{{CIDR: "10.96.0.0/16"}},
		ServiceLoadBalancerIPs: []api.ServiceCIDR{{CIDR: "198.19.0.0/24"}},
	}})
	// node1's own configuration narrows the LoadBalancer range.
	s.put(&api.BGPConfiguration{Metadata: api.ObjectMeta{Name: api.NodeConfigName("node1")}, Spec: api.BGPConfigurationSpec{
		ServiceLoadBalancerIPs: []api.ServiceCIDR{{CIDR: "198.19.0.0/25"}},
	}})
	s.put(lbService("web", "Cluster", []string{"node2"}, "198.19.0.1"))
	s.put(lbService("db", "Local", []string{"node2"}, "198.19.0.2"))
	rev := s.put(lbService("far", "Cluster", nil, "198.19.0.200")) // outside node1's range
	if err := v.WaitRevision(ctx, rev); err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix
	check := func(want ...netip.Prefix) {
		t.Helper()
		if err := b.pass(ctx); err != nil {
			t.Fatal(err)
		}
		_, adv := sp.snapshot()
		if diff := cmp.Diff(want, adv, prefixComparer); diff != "" {
			t.Errorf("advertised (-want +got):\n%s", diff)
		}
		rs, err := routes.List(dataplane.RouteProtoWorkload)
		if err != nil {
			t.Fatal(err)
		}
		var holes []netip.Prefix
		for _, r := range rs {
			if r.Type == dataplane.RouteBlackhole {
				holes = append(holes, r.Dst)
			}
		}
		slices.SortFunc(holes, netip.Prefix.Compare)
		if diff := cmp.Diff(want, holes, prefixComparer); diff != "" {
			t.Errorf("service blackholes (-want +got):\n%s", diff)
		}
	}
	check(p("10.96.0.0/16"), p("198.19.0.1/32"))
	if got := gaugeValue(t, b.metrics, "tabby_routes_installed", "service"); got != 2 {
		t.Errorf("tabby_routes_installed{kind=\"service\"} = %v, want 2", got)
	}

	st := b.serviceStatusLocked()
	if i := slices.IndexFunc(st, func(s api.ServiceAdvertisementStatus) bool { return s.Service == "default/far" }); i < 0 || !st[i].Refused ||
		st[i].Reason != "198.19.0.200 is outside serviceLoadBalancerIPs [198.19.0.0/25]" {
		t.Errorf("status of default/far: %+v", st)
	}

	// The Local Service's endpoints move between other nodes: nothing
	// here wakes.
	before := b.sub.Matched()
	rev = s.put(lbService("db", "Local", []string{"node3"}, "198.19.0.2"))
	if err := v.WaitRevision(ctx, rev); err != nil {
		t.Fatal(err)
	}
	if got := b.sub.Matched(); got != before {
		t.Errorf("an endpoint moving between other nodes woke the owner (%d → %d)", before, got)
	}
	// Its endpoint lands here: the owner wakes and advertises it.
	drain(b.sub.C())
	rev = s.put(lbService("db", "Local", []string{"node3", "node1"}, "198.19.0.2"))
	select {
	case <-b.sub.C():
	case <-ctx.Done():
		t.Fatal("an endpoint arriving on this node did not wake the owner")
	}
	if err := v.WaitRevision(ctx, rev); err != nil {
		t.Fatal(err)
	}
	check(p("10.96.0.0/16"), p("198.19.0.1/32"), p("198.19.0.2/32"))
	// The last local endpoint goes: withdrawn.
	rev = s.put(lbService("db", "Local", []string{"node3"}, "198.19.0.2"))
	if err := v.WaitRevision(ctx, rev); err != nil {
		t.Fatal(err)
	}
	check(p("10.96.0.0/16"), p("198.19.0.1/32"))

	// Another node's advertisement of a Service address, learned (a
	// reflector passing it on, a router sending it back), is not
	// installed; a pod block is.
	nh := []netip.Addr{netip.MustParseAddr("198.18.0.12")}
	b.learned = []bgp.LearnedRoute{{Prefix: p("198.19.0.2/32"), NextHops: nh}, {Prefix: p("10.96.0.0/16"), NextHops: nh}, {Prefix: p("10.244.1.0/26"), NextHops: nh}}
	if _, err := b.syncLearned(); err != nil {
		t.Fatal(err)
	}
	learned, err := routes.List(dataplane.RouteProtoBGP)
	if err != nil {
		t.Fatal(err)
	}
	if len(learned) != 1 || learned[0].Dst != p("10.244.1.0/26") {
		t.Errorf("learned routes installed: %v, want the pod block only", learned)
	}
}

var prefixComparer = cmp.Comparer(func(x, y netip.Prefix) bool { return x == y })

// serviceStatusLocked is serviceStatus under b.mu.
func (b *bgpOwner) serviceStatusLocked() []api.ServiceAdvertisementStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.serviceStatus()
}

// gaugeValue reads one labelled gauge of m's registry.
func gaugeValue(t *testing.T, m *metrics, name, label string) float64 {
	t.Helper()
	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetValue() == label {
					return mt.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{%s}", name, label)
	return 0
}
