package dataplane_test

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
	"github.com/tabbynet/tabby/policy"
)

// TestPrivilegedNFTablesStartsNoProcess is the kernel's word that the
// nftables backend starts no process: a pod's veth (Setup, the kernel half
// of a CNI ADD) and every kind of policy pass (first apply of a node with
// 200 pods, a pod added, a policy changed, a pod's labels changed, a pod
// removed, nothing changed, a full re-read of the kernel) run while the
// process-events connector reports every process this test creates. The
// iptables backend's Apply is the control: the watch must see its
// processes.
func TestPrivilegedNFTablesStartsNoProcess(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	w := newProcWatch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	if _, err := exec.LookPath("iptables-restore"); err == nil {
		ipns := testkit.NewNetNS(t, "tbdp-w16ipt")
		ipt, err := dataplane.NewIPTablesFirewall(dataplane.FirewallConfig{NetNS: ipns.Path})
		if err != nil {
			t.Fatal(err)
		}
		n := w.count(t, func() {
			if _, err := ipt.Apply(ctx, testState("10.244.1.7/32", false)); err != nil {
				t.Fatal(err)
			}
		})
		if n == 0 {
			t.Fatal("control: the iptables backend's Apply started no process the watch saw")
		}
		t.Logf("control: the iptables backend's Apply started %d processes", n)
		if err := ipt.Remove(ctx); err != nil {
			t.Error(err)
		}
	}

	node, wl := workloadNode(t)
	f := newNFT(t, node, 0)
	in := scaleInput(200)
	comp := policy.NewCompiler()
	apply := func(what string) {
		t.Helper()
		n := w.count(t, func() {
			if _, err := f.Apply(ctx, *comp.Compile(in)); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		})
		if n != 0 {
			t.Errorf("%s: %d processes started", what, n)
		}
		// What the Compiler and the render cache skipped is in the
		// kernel all the same (Diff renders from scratch).
		if d, err := f.Diff(ctx, *policy.Compile(in)); err != nil || len(d) > 0 {
			t.Errorf("%s: the kernel differs from a fresh compile: %v %v", what, d, err)
		}
	}
	apply("first apply")

	// A pod's ADD: its veth pair and routes, then the pass with its endpoint.
	pod := testkit.NewNetNS(t, "tbdp-w16pod")
	spec := podSpec(pod, "w16-noexec", "10.244.9.9/32")
	n := w.count(t, func() {
		setup(t, wl, spec)
		ep := &api.WorkloadEndpoint{
			Metadata: api.ObjectMeta{Name: "added", Namespace: "ns0", Labels: map[string]string{"app": "app3"}},
			Spec:     api.WorkloadEndpointSpec{Node: "n1", InterfaceName: spec.HostIfName, IPNetworks: []string{"10.244.9.9/32"}},
		}
		in.Endpoints = append(in.Endpoints[:len(in.Endpoints):len(in.Endpoints)], ep)
		if _, err := f.Apply(ctx, *comp.Compile(in)); err != nil {
			t.Fatal(err)
		}
	})
	if n != 0 {
		t.Errorf("pod ADD (Setup and policy pass): %d processes started", n)
	}

	in.NetworkPolicies[0] = withPort(in.NetworkPolicies[0], 7000)
	apply("policy changed")
	in.Endpoints[0] = withLabel(in.Endpoints[0], "app10")
	apply("labels changed")
	in.Endpoints = in.Endpoints[:len(in.Endpoints)-1]
	apply("pod removed")
	apply("nothing changed")
	// A fresh firewall reads the whole table back over netlink.
	f = newNFT(t, node, -1)
	apply("apply after a restart, reading the kernel")
	n = w.count(t, func() {
		if err := wl.Teardown(ctx, spec); err != nil {
			t.Fatal(err)
		}
		if err := f.Remove(ctx); err != nil {
			t.Fatal(err)
		}
	})
	if n != 0 {
		t.Errorf("pod DEL and Remove: %d processes started", n)
	}
}

// withPort is a copy of a NetworkPolicy whose first ingress port is port,
// as the cluster view delivers a changed policy: a new object.
func withPort(p *api.NetworkPolicy, port int32) *api.NetworkPolicy {
	cp := *p
	cp.Spec.Ingress = []api.NetworkPolicyIngressRule{p.Spec.Ingress[0]}
	cp.Spec.Ingress[0].Ports = []api.NetworkPolicyPort{p.Spec.Ingress[0].Ports[0]}
	v := api.IntOrString{IntVal: port}
	cp.Spec.Ingress[0].Ports[0].Port = &v
	return &cp
}

// withLabel is a copy of an endpoint with another app label.
func withLabel(ep *api.WorkloadEndpoint, app string) *api.WorkloadEndpoint {
	cp := *ep
	cp.Metadata.Labels = map[string]string{"app": app}
	return &cp
}
