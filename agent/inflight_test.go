package agent

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/ipam"
)

// addDuringList runs add once, when the workload routes are first listed:
// an ADD wiring its pod after the routing pass read the endpoints but
// before it diffed the kernel's routes.
type addDuringList struct {
	*fake.Routes
	add func()
}

func (r *addDuringList) List(proto int) ([]dataplane.Route, error) {
	if proto == dataplane.RouteProtoWorkload && r.add != nil {
		add := r.add
		r.add = nil
		add()
	}
	return r.Routes.List(proto)
}

func TestRoutingPassKeepsRouteOfADDInFlight(t *testing.T) {
	ctx := context.Background()
	store := storetest.New(t)
	routes := fake.NewRoutes()
	hooked := &addDuringList{Routes: routes}
	cfg := Default()
	cfg.NodeName = "node1"
	a := New(cfg, testLogger(), Deps{Routes: hooked})
	a.store, a.ipam = store, ipam.New(store)
	wl := &trackedWorkloads{Workloads: fake.NewWorkloads(routes), a: a}
	spec := dataplane.WorkloadSpec{
		NetNS: "/var/run/netns/p1", IfName: "eth0", HostIfName: dataplane.HostIfName("ns1.p1"),
		Addrs: []netip.Prefix{netip.MustParsePrefix("10.244.0.5/32")},
	}
	hooked.add = func() {
		if _, err := wl.Setup(ctx, spec); err != nil {
			t.Errorf("setup: %v", err)
		}
	}
	if err := a.routingPass(ctx); err != nil {
		t.Fatal(err)
	}
	if got := routes.String(); !strings.Contains(got, "10.244.0.5/32 dev "+spec.HostIfName) {
		t.Errorf("the routing pass deleted the host route of an ADD in flight; routes:\n%s\nops: %q", got, routes.Ops())
	}
}
