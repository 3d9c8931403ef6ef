package dataplane_test

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/policy"
)

// TestPrivilegedNFTablesTraffic sends real TCP connections between two pods
// of one node through the nftables backend: a node namespace with two pod
// namespaces wired by Setup (veth pairs, /32 routes, proxy ARP), a server
// in one pod, a client in the other. A policy admitting the client lets
// the connection through; the same policy changed to admit another app
// drops it; changed back, it passes again. Every step is applied by a
// long-lived Compiler and checked against the kernel.
func TestPrivilegedNFTablesTraffic(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	node, _, client, server, cspec, sspec := twoPods(t, "w16")

	var l net.Listener
	if err := ns.WithNetNSPath(server.Path, func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp4", "10.244.20.2:8080")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("ok"))
			_ = c.Close()
		}
	}()
	connects := func() bool {
		t.Helper()
		ok := false
		if err := ns.WithNetNSPath(client.Path, func(ns.NetNS) error {
			c, err := net.DialTimeout("tcp4", "10.244.20.2:8080", 300*time.Millisecond)
			if err != nil {
				return nil
			}
			defer c.Close()
			buf := make([]byte, 2)
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			n, _ := c.Read(buf)
			ok = string(buf[:n]) == "ok"
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return ok
	}

	ep := func(name, app string, s dataplane.WorkloadSpec) *api.WorkloadEndpoint {
		return &api.WorkloadEndpoint{
			Metadata: api.ObjectMeta{Name: name, Namespace: "w16", Labels: map[string]string{"app": app}},
			Spec: api.WorkloadEndpointSpec{Node: "n1", InterfaceName: s.HostIfName,
				IPNetworks: []string{s.Addrs[0].String()}},
		}
	}
	allowFrom := func(app string) *api.NetworkPolicy {
		port := api.FromInt(8080)
		p := &api.NetworkPolicy{Metadata: api.ObjectMeta{Namespace: "w16", Name: "server-ingress"}, Spec: api.NetworkPolicySpec{
			PodSelector: api.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			Ingress: []api.NetworkPolicyIngressRule{{
				From:  []api.NetworkPolicyPeer{{PodSelector: &api.LabelSelector{MatchLabels: map[string]string{"app": app}}}},
				Ports: []api.NetworkPolicyPort{{Port: &port}},
			}},
		}}
		p.SetDefaults()
		return p
	}
	in := policy.Input{Node: "n1",
		Endpoints: []*api.WorkloadEndpoint{ep("client", "client", cspec), ep("server", "server", sspec)},
		Pools:     []*api.IPPool{{Metadata: api.ObjectMeta{Name: "p"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16"}}}}
	f := newNFT(t, node, 0)
	comp := policy.NewCompiler()
	apply := func() {
		t.Helper()
		if _, err := f.Apply(ctx, *comp.Compile(in)); err != nil {
			t.Fatal(err)
		}
		if d, err := f.Diff(ctx, *policy.Compile(in)); err != nil || len(d) > 0 {
			t.Fatalf("kernel differs from a fresh compile: %v %v", d, err)
		}
	}

	if !connects() {
		t.Fatal("no firewall: the connection failed")
	}
	apply()
	if !connects() {
		t.Fatal("no policy: the connection failed")
	}
	for i, step := range []struct {
		app  string
		want bool
	}{{"client", true}, {"other", false}, {"client", true}} {
		in.NetworkPolicies = []*api.NetworkPolicy{allowFrom(step.app)}
		apply()
		if got := connects(); got != step.want {
			t.Errorf("step %d, policy admits app=%s: connected %v, want %v", i, step.app, got, step.want)
		}
	}
	// The client relabelled out of the allowed set: its set member goes.
	in.Endpoints = slices.Clone(in.Endpoints)
	in.Endpoints[0] = ep("client", "stranger", cspec)
	apply()
	if connects() {
		t.Error("client relabelled: still connected")
	}
	if err := f.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if !connects() {
		t.Error("table removed: the connection failed")
	}
}
