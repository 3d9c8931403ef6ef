package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/agent/attach"
	"github.com/tabbynet/tabby/agent/routetable"
	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/cni"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/dataplane/fake"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/syncer"
)

type handlerEnv struct {
	h      *cniHandler
	alloc  *ipam.Allocator
	store  *datastore.Store
	view   *syncer.Syncer
	wl     *fake.Workloads
	routes *fake.Routes
}

func newHandlerEnv(t *testing.T) *handlerEnv {
	t.Helper()
	ctx := context.Background()
	store := storetest.New(t)
	pool := &api.IPPool{Metadata: api.ObjectMeta{Name: "pool1"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/24", BlockSize: 28}}
	if _, err := store.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	routes := fake.NewRoutes()
	wl := fake.NewWorkloads(routes)
	v := startView(t, store)
	alloc := ipam.New(store)
	h := newCNIHandler(t.Context(), "node1", store, alloc, wl, v, newRouteOwner("node1", v, routetable.New(routes, 0), testLogger()), slog.New(slog.NewTextHandler(io.Discard, nil)))
	return &handlerEnv{h: h, alloc: alloc, store: store, view: v, wl: wl, routes: routes}
}

func addReq(id string) (*cni.Request, *cni.NetConf, *cni.Args) {
	req := &cni.Request{Command: "ADD", ContainerID: id, Netns: "/var/run/netns/" + id, IfName: "eth0"}
	conf := &cni.NetConf{}
	conf.Name = "k8s-pod-network"
	conf.CNIVersion = "1.0.0"
	args := &cni.Args{PodNamespace: "ns1", PodName: "pod-" + id, Labels: map[string]string{"app": "web"}}
	return req, conf, args
}

func (e *handlerEnv) endpoints(t *testing.T) []*api.WorkloadEndpoint {
	t.Helper()
	objs, _, err := e.store.List(context.Background(), api.KindWorkloadEndpoint, "")
	if err != nil {
		t.Fatal(err)
	}
	var out []*api.WorkloadEndpoint
	for _, o := range objs {
		out = append(out, o.(*api.WorkloadEndpoint))
	}
	return out
}

func TestCNIAddRepeatDel(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t)
	req, conf, args := addReq("c1")
	res, err := e.h.Add(ctx, req, conf, args)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if len(res.IPs) != 1 || len(res.Interfaces) != 2 {
		t.Fatalf("result: %+v", res)
	}
	ip, _ := netip.AddrFromSlice(res.IPs[0].Address.IP)
	if !netip.MustParsePrefix("10.244.0.0/24").Contains(ip.Unmap()) {
		t.Errorf("address %v outside the pool", ip)
	}
	if res.Interfaces[0].Mac != dataplane.HostMAC || res.Interfaces[1].Sandbox != req.Netns || *res.IPs[0].Interface != 1 {
		t.Errorf("interfaces: %+v %+v", res.Interfaces[0], res.Interfaces[1])
	}
	weps := e.endpoints(t)
	if len(weps) != 1 || weps[0].Spec.IPNetworks[0] != ip.Unmap().String()+"/32" || weps[0].Metadata.Labels["app"] != "web" {
		t.Fatalf("endpoints: %+v", weps)
	}
	if weps[0].Spec.InterfaceName != newWorkloadID(req, args).hostIfName() {
		t.Errorf("endpoint interface %q", weps[0].Spec.InterfaceName)
	}

	// A repeated ADD returns the same result and duplicates nothing.
	res2, err := e.h.Add(ctx, req, conf, args)
	if err != nil {
		t.Fatalf("repeated ADD: %v", err)
	}
	if res2.IPs[0].Address.String() != res.IPs[0].Address.String() {
		t.Errorf("repeated ADD gave %v, first gave %v", res2.IPs[0].Address, res.IPs[0].Address)
	}
	if n := len(e.endpoints(t)); n != 1 {
		t.Errorf("%d endpoints after repeated ADD", n)
	}
	addrs, err := e.h.ipam.AddressesByHandle(ctx, ipamHandle(conf.Name, req.ContainerID))
	if err != nil || len(addrs) != 1 {
		t.Errorf("handle holds %v, %v", addrs, err)
	}

	if err := e.h.Check(ctx, req, conf, args, res); err != nil {
		t.Errorf("CHECK after ADD: %v", err)
	}

	for i := range 2 {
		if err := e.h.Del(ctx, req, conf, args); err != nil {
			t.Fatalf("DEL #%d: %v", i+1, err)
		}
	}
	if n := len(e.endpoints(t)); n != 0 {
		t.Errorf("%d endpoints after DEL", n)
	}
	if s := e.routes.String(); s != "" {
		t.Errorf("routes left after DEL:\n%s", s)
	}
	addrs, _ = e.h.ipam.AddressesByHandle(ctx, ipamHandle(conf.Name, req.ContainerID))
	if len(addrs) != 0 {
		t.Errorf("addresses left after DEL: %v", addrs)
	}
	if err := e.h.Check(ctx, req, conf, args, res); err == nil {
		t.Error("CHECK after DEL found nothing wrong")
	}
}

func TestCNIAddRollbackAtEveryStep(t *testing.T) {
	ctx := context.Background()
	for _, step := range []string{"request", "assign", "prepare", "prior", "dataplane-setup", "dataplane-prepare", "dataplane-complete", "complete", "routes", "endpoint", "policy"} {
		t.Run(step, func(t *testing.T) {
			e := newHandlerEnv(t)
			injected := fmt.Errorf("injected failure after %s", step)
			switch step {
			case "dataplane-setup":
				e.wl.SetFail("Setup", injected)
			case "dataplane-prepare":
				e.wl.SetFail("Prepare", injected)
			case "dataplane-complete":
				e.wl.SetFail("Complete", injected)
			default:
				e.h.runner.Fault = func(s string) error {
					if s == step {
						return injected
					}
					return nil
				}
			}
			req, conf, args := addReq("c1")
			if _, err := e.h.Add(ctx, req, conf, args); err == nil {
				t.Fatal("ADD succeeded despite the injected failure")
			}
			if n := len(e.endpoints(t)); n != 0 {
				t.Errorf("%d endpoints left", n)
			}
			if s := e.routes.String(); s != "" {
				t.Errorf("routes left:\n%s", s)
			}
			if s := e.wl.String(); s != "" {
				t.Errorf("links left:\n%s", s)
			}
			addrs, err := e.h.ipam.AddressesByHandle(ctx, ipamHandle(conf.Name, req.ContainerID))
			if err != nil || len(addrs) != 0 {
				t.Errorf("addresses left: %v %v", addrs, err)
			}
			rep, err := e.alloc.Check(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !rep.OK() {
				t.Errorf("ipam check after rollback: %+v", rep)
			}
			// The failure gone, the same ADD works.
			e.h.runner.Fault = nil
			for _, op := range []string{"Setup", "Prepare", "Complete"} {
				e.wl.SetFail(op, nil)
			}
			if _, err := e.h.Add(ctx, req, conf, args); err != nil {
				t.Errorf("ADD after the failure: %v", err)
			}
		})
	}
}

// TestCNIAddIPAMFailureRemovesPreparedPair: the veth pair is made while
// IPAM works; when IPAM then fails, the pair goes and nothing else is left.
func TestCNIAddIPAMFailureRemovesPreparedPair(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t)
	req, conf, args := addReq("c1")
	args.IPs = []netip.Addr{netip.MustParseAddr("10.99.0.5")} // in no pool
	if _, err := e.h.Add(ctx, req, conf, args); err == nil {
		t.Fatal("ADD of an address in no pool succeeded")
	}
	host := newWorkloadID(req, args).hostIfName()
	if d := cmp.Diff([]string{"prepare " + host, "teardown " + host}, e.wl.Ops()); d != "" {
		t.Errorf("dataplane calls (-want +got):\n%s", d)
	}
	if s := e.wl.String(); s != "" {
		t.Errorf("links left:\n%s", s)
	}
	if n := len(e.endpoints(t)); n != 0 {
		t.Errorf("%d endpoints left", n)
	}
	rep, err := e.alloc.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Errorf("ipam check: %+v", rep)
	}
}

func TestCNIDelOfOldSandboxKeepsNewOne(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t)
	req1, conf, args := addReq("old")
	args.PodName = "web-0"
	if _, err := e.h.Add(ctx, req1, conf, args); err != nil {
		t.Fatal(err)
	}
	req2, _, _ := addReq("new")
	if _, err := e.h.Add(ctx, req2, conf, args); err != nil {
		t.Fatal(err)
	}
	if err := e.h.Del(ctx, req1, conf, args); err != nil {
		t.Fatal(err)
	}
	weps := e.endpoints(t)
	if len(weps) != 1 || weps[0].Spec.ContainerID != "new" {
		t.Fatalf("endpoints: %+v", weps)
	}
	if e.routes.String() == "" {
		t.Error("the new sandbox's host route is gone")
	}
	if addrs, _ := e.h.ipam.AddressesByHandle(ctx, ipamHandle(conf.Name, "old")); len(addrs) != 0 {
		t.Errorf("old sandbox still holds %v", addrs)
	}
}

func TestCNIDelWithoutAnything(t *testing.T) {
	e := newHandlerEnv(t)
	req, conf, args := addReq("never-added")
	req.Netns = ""
	if err := e.h.Del(context.Background(), req, conf, args); err != nil {
		t.Fatalf("DEL of an unknown container: %v", err)
	}
}

var _ = errors.New

// CHECK right after a successful ADD finds nothing wrong, for every kind
// of attachment ADD makes: an address from IPAM, and one without IPAM
// (ipAddrsNoIpam), which IPAM knows nothing of and the endpoint records.
func TestCNICheckAfterAddNoIPAM(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t)
	putJSON(t, e.store, datastore.KubeMarkerKey, api.KubeMarker{Identity: "test"})
	req, conf, args := addReq("noipam")
	conf.FeatureControl.IPAddrsNoIPAM = true
	putJSON(t, e.store, datastore.KubeNamespaceKey(args.PodNamespace), api.KubeNamespace{Name: args.PodNamespace})
	putJSON(t, e.store, datastore.KubePodKey(args.PodNamespace, args.PodName), api.KubePod{Namespace: args.PodNamespace, Name: args.PodName,
		Annotations: map[string]string{"cni.projectcalico.org/ipAddrsNoIpam": `["10.244.200.9"]`}})
	res, err := e.h.Add(ctx, req, conf, args)
	if err != nil {
		t.Fatalf("ADD: %v (%s)", err, detail(err))
	}
	if got := res.IPs[0].Address.IP.String(); got != "10.244.200.9" {
		t.Fatalf("address %s, want the annotation's", got)
	}
	if err := e.h.Check(ctx, req, conf, args, res); err != nil {
		t.Errorf("CHECK after ADD without IPAM: %v (%s)", err, detail(err))
	}
	// A wrong previous result is still a difference.
	res.IPs[0].Address.IP = netip.MustParseAddr("10.244.200.10").AsSlice()
	if err := e.h.Check(ctx, req, conf, args, res); err == nil {
		t.Error("CHECK against a wrong previous result found nothing")
	}
	if err := e.h.Del(ctx, req, conf, args); err != nil {
		t.Fatal(err)
	}
	if n := len(e.endpoints(t)); n != 0 || e.wl.String() != "" || e.routes.String() != "" {
		t.Errorf("after DEL: %d endpoints, links %q, routes %q", n, e.wl.String(), e.routes.String())
	}
}

// deadlineAddrs fails every IPAM call that comes without a deadline.
type deadlineAddrs struct {
	attach.Addresses
	t *testing.T
}

func (d deadlineAddrs) check(ctx context.Context, call string) {
	if _, ok := ctx.Deadline(); !ok {
		d.t.Errorf("IPAM %s without a deadline", call)
	}
}

func (d deadlineAddrs) Assign(ctx context.Context, req ipam.AssignRequest) (ipam.Assignment, error) {
	d.check(ctx, "Assign")
	return d.Addresses.Assign(ctx, req)
}

func (d deadlineAddrs) ReleaseHandle(ctx context.Context, handle string) error {
	d.check(ctx, "ReleaseHandle")
	return d.Addresses.ReleaseHandle(ctx, handle)
}

func (d deadlineAddrs) AddressesByHandle(ctx context.Context, handle string) ([]netip.Addr, error) {
	d.check(ctx, "AddressesByHandle")
	return d.Addresses.AddressesByHandle(ctx, handle)
}

// Every IPAM call of every verb is bounded (storeCallTimeout), with no
// deadline on the request's context.
func TestCNIIPAMCallsBounded(t *testing.T) {
	e := newHandlerEnv(t)
	e.h.ipam = boundedAddresses{deadlineAddrs{e.alloc, t}}
	ctx := context.Background()
	req, conf, args := addReq("c1")
	res, err := e.h.Add(ctx, req, conf, args)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.h.Check(ctx, req, conf, args, res); err != nil {
		t.Error(err)
	}
	if err := e.h.Del(ctx, req, conf, args); err != nil {
		t.Error(err)
	}
}
