package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/cni"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/datastore"
)

func flex(b bool) *cni.FlexBool { v := cni.FlexBool(b); return &v }

func resultAddrs(t *testing.T, ips []netip.Addr) (v4, v6 []netip.Addr) {
	t.Helper()
	for _, a := range ips {
		if a.Is4() {
			v4 = append(v4, a)
		} else {
			v6 = append(v6, a)
		}
	}
	return v4, v6
}

// A dual-stack network: one ADD gives the pod an address of each family
// under one handle, wires both, records both and returns both with their
// gateways; a repeat returns the same; DEL frees both. An IPv6-only
// network gives one IPv6 address; a runtime asking for an address of a
// family the network does not assign is refused.
func TestCNIAddDualStack(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t) // pool1: 10.244.0.0/24
	mustCreate(t, e.store, &api.IPPool{Metadata: api.ObjectMeta{Name: "v6"}, Spec: api.IPPoolSpec{CIDR: "fd00:10:244::/64"}})

	req, conf, args := addReq("ds1")
	conf.AssignIPv6 = flex(true)
	res, err := e.h.Add(ctx, req, conf, args)
	if err != nil {
		t.Fatal(err)
	}
	var got []netip.Addr
	for _, ipc := range res.IPs {
		a, _ := netip.AddrFromSlice(ipc.Address.IP)
		got = append(got, a.Unmap())
		gw, _ := netip.AddrFromSlice(ipc.Gateway)
		want := dataplane.GatewayAddr
		if a.Unmap().Is6() {
			want = dataplane.GatewayAddr6
		}
		if gw.Unmap() != want {
			t.Errorf("gateway of %s = %s, want %s", a, gw, want)
		}
	}
	v4, v6 := resultAddrs(t, got)
	if len(v4) != 1 || len(v6) != 1 || len(res.Routes) != 2 {
		t.Fatalf("result IPs %v, routes %v: want one address and one default route per family", got, res.Routes)
	}
	weps := e.endpoints(t)
	if len(weps) != 1 || !slices.Equal(weps[0].Spec.IPNetworks, []string{v4[0].String() + "/32", v6[0].String() + "/128"}) {
		t.Fatalf("endpoint ipNetworks %v, want both addresses", weps[0].Spec.IPNetworks)
	}
	held, err := e.h.ipam.AddressesByHandle(ctx, weps[0].Spec.IPAMHandle)
	if err != nil || len(held) != 2 {
		t.Fatalf("handle holds %v, %v; want both", held, err)
	}
	routes, _ := e.routes.List(dataplane.RouteProtoWorkload)
	if !slices.ContainsFunc(routes, func(r dataplane.Route) bool {
		return r.Dst == netip.PrefixFrom(v6[0], 128) && r.Type == dataplane.RouteUnicast
	}) {
		t.Errorf("no /128 host route to %s among %v", v6[0], routes)
	}
	again, err := e.h.Add(ctx, req, conf, args)
	if err != nil || len(again.IPs) != 2 || !again.IPs[1].Address.IP.Equal(res.IPs[1].Address.IP) {
		t.Errorf("repeated ADD: %v, %v", again, err)
	}
	if err := e.h.Check(ctx, req, conf, args, res); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if err := e.h.Del(ctx, req, conf, args); err != nil {
		t.Fatal(err)
	}
	if held, _ := e.h.ipam.AddressesByHandle(ctx, weps[0].Spec.IPAMHandle); len(held) != 0 || len(e.endpoints(t)) != 0 {
		t.Errorf("after DEL: handle holds %v, %d endpoints", held, len(e.endpoints(t)))
	}

	// IPv6 only, with the runtime's address and ipv6_pools.
	req, conf, args = addReq("v6only")
	conf.AssignIPv4, conf.AssignIPv6, conf.IPv6Pools = flex(false), flex(true), []string{"v6"}
	args.IPs = []netip.Addr{netip.MustParseAddr("fd00:10:244::99")}
	res, err = e.h.Add(ctx, req, conf, args)
	if err != nil || len(res.IPs) != 1 || res.IPs[0].Address.String() != "fd00:10:244::99/128" {
		t.Fatalf("IPv6-only ADD: %v, %v", res, err)
	}
	// The runtime asks for an IPv4 address on an IPv6-only network.
	req, conf, args = addReq("wrongfam")
	conf.AssignIPv4, conf.AssignIPv6 = flex(false), flex(true)
	args.IPs = []netip.Addr{netip.MustParseAddr("10.244.0.9")}
	if _, err := e.h.Add(ctx, req, conf, args); err == nil || !strings.Contains(err.Error()+detail(err), "assigns no IPv4 addresses") {
		t.Errorf("IPv4 address on an IPv6-only network: %v", err)
	}
	// ipv6_pools naming an IPv4 pool is refused by name.
	req, conf, args = addReq("wrongpool")
	conf.AssignIPv6, conf.IPv6Pools = flex(true), []string{"pool1"}
	if _, err := e.h.Add(ctx, req, conf, args); err == nil || !strings.Contains(err.Error()+detail(err), `"pool1" is an IPv4 pool`) {
		t.Errorf("ipv6_pools naming an IPv4 pool: %v", err)
	}
	if n := len(e.endpoints(t)); n != 1 {
		t.Errorf("%d endpoints, want only the IPv6-only pod's", n)
	}
	rep, err := e.alloc.Check(ctx)
	if err != nil || !rep.OK() {
		t.Errorf("ipam check: %+v %v", rep, err)
	}
}

// A dual-stack pod's address annotations, as tabby-kube-controllers record
// them: ipv6pools picks the IPv6 pool (pod over namespace), ipAddrs takes
// one address of each family, two of one family are refused, and an
// unknown IPv6 pool is named.
func TestCNIAddDualStackAnnotations(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t) // pool1: 10.244.0.0/24
	mustCreate(t, e.store, &api.IPPool{Metadata: api.ObjectMeta{Name: "v6a"}, Spec: api.IPPoolSpec{CIDR: "fd00:10:244::/64"}})
	mustCreate(t, e.store, &api.IPPool{Metadata: api.ObjectMeta{Name: "v6b"}, Spec: api.IPPoolSpec{CIDR: "fd00:10:245::/64"}})
	putJSON(t, e.store, datastore.KubeMarkerKey, api.KubeMarker{Identity: "test"})
	if err := e.view.WaitRevision(ctx, storeRev(t, e.store)); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		pod, ns map[string]string
		want    []string // prefixes the addresses start with, IPv4 first
		wantErr string
	}{
		{name: "namespace IPv6 pool", ns: map[string]string{"cni.projectcalico.org/ipv6pools": `["v6b"]`}, want: []string{"10.244.0.", "fd00:10:245:"}},
		{name: "pod IPv6 pool wins", pod: map[string]string{"tabby.dev/ipv6pools": `["fd00:10:244::/64"]`},
			ns: map[string]string{"cni.projectcalico.org/ipv6pools": `["v6b"]`}, want: []string{"10.244.0.", "fd00:10:244:"}},
		{name: "one address of each family", pod: map[string]string{"cni.projectcalico.org/ipAddrs": `["10.244.0.91", "fd00:10:245::91"]`},
			want: []string{"10.244.0.91", "fd00:10:245::91"}},
		{name: "two IPv6 addresses", pod: map[string]string{"cni.projectcalico.org/ipAddrs": `["fd00:10:245::92", "fd00:10:245::93"]`},
			wantErr: "a pod gets one address of each family"},
		{name: "unknown IPv6 pool", pod: map[string]string{"cni.projectcalico.org/ipv6pools": `["nope6"]`}, wantErr: `unknown IP pool "nope6" (ipv6pools)`},
		{name: "IPv4 pool as IPv6 pool", pod: map[string]string{"cni.projectcalico.org/ipv6pools": `["pool1"]`}, wantErr: `"pool1" is an IPv4 pool`},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, conf, args := addReq(fmt.Sprintf("ann%d", i))
			conf.AssignIPv6 = flex(true)
			ns := fmt.Sprintf("ns%d", i)
			args.PodNamespace = ns
			putJSON(t, e.store, datastore.KubeNamespaceKey(ns), api.KubeNamespace{Name: ns, Annotations: tt.ns})
			putJSON(t, e.store, datastore.KubePodKey(ns, args.PodName), api.KubePod{Namespace: ns, Name: args.PodName, Annotations: tt.pod})
			res, err := e.h.Add(ctx, req, conf, args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error()+detail(err), tt.wantErr) {
					t.Fatalf("ADD error %v, want one saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(res.IPs) != len(tt.want) {
				t.Fatalf("ADD gave %d addresses, want %d", len(res.IPs), len(tt.want))
			}
			for k, ipc := range res.IPs {
				a, _ := netip.AddrFromSlice(ipc.Address.IP)
				if !strings.HasPrefix(a.Unmap().String(), tt.want[k]) {
					t.Errorf("address %d = %s, want %s…", k, a.Unmap(), tt.want[k])
				}
			}
			if err := e.h.Del(ctx, req, conf, args); err != nil {
				t.Fatal(err)
			}
		})
	}
	rep, err := e.alloc.Check(ctx)
	if err != nil || !rep.OK() {
		t.Errorf("ipam check: %+v %v", rep, err)
	}
}

// When the second family's assignment fails, the first family's address
// is released with the rest of ADD (it used to stay assigned).
func TestCNIAddDualStackSecondFamilyFails(t *testing.T) {
	ctx := context.Background()
	e := newHandlerEnv(t) // pool1: 10.244.0.0/24, no IPv6 pool
	req, conf, args := addReq("ds-fail")
	conf.AssignIPv6 = flex(true)
	if _, err := e.h.Add(ctx, req, conf, args); err == nil {
		t.Fatal("ADD of a dual-stack pod without an IPv6 pool succeeded")
	}
	if held, err := e.h.ipam.AddressesByHandle(ctx, ipamHandle(conf.Name, req.ContainerID)); err != nil || len(held) != 0 {
		t.Errorf("the handle holds %v (%v) after the failed ADD", held, err)
	}
	if s := e.wl.String(); s != "" {
		t.Errorf("links left:\n%s", s)
	}
	rep, err := e.alloc.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Errorf("ipam check: %+v", rep)
	}
}
