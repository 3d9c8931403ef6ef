package fake_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/dataplane/fake"
)

func spec(ns, host string, addrs ...string) dataplane.WorkloadSpec {
	s := dataplane.WorkloadSpec{NetNS: ns, IfName: "eth0", HostIfName: host}
	for _, a := range addrs {
		s.Addrs = append(s.Addrs, netip.MustParsePrefix(a))
	}
	return s
}

func TestWorkloadsLifecycle(t *testing.T) {
	ctx := context.Background()
	r := fake.NewRoutes(dataplane.Route{Dst: netip.MustParsePrefix("198.18.0.0/24"), Dev: "eth0", Proto: 2})
	w := fake.NewWorkloads(r)
	a := spec("/run/netns/a", "cali00000000001", "10.244.0.5/32")
	b := spec("/run/netns/b", "cali00000000002", "10.244.0.6/32", "10.244.0.7/32")
	b.MAC = "0A:58:0A:F4:00:06"

	stA, err := w.Setup(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	stB, err := w.Setup(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if stB.ContainerMAC != "0a:58:0a:f4:00:06" || stA.HostMAC != dataplane.HostMAC || stA.HostIfIndex == stB.HostIfIndex {
		t.Errorf("statuses %+v %+v", stA, stB)
	}
	wantRoutes := strings.Join([]string{
		"10.244.0.5/32 dev cali00000000001 scope link proto 80",
		"10.244.0.6/32 dev cali00000000002 scope link proto 80",
		"10.244.0.7/32 dev cali00000000002 scope link proto 80",
		"198.18.0.0/24 dev eth0 scope link proto 2",
	}, "\n") + "\n"
	if diff := cmp.Diff(wantRoutes, r.String()); diff != "" {
		t.Errorf("routes (-want +got):\n%s", diff)
	}
	wantLinks := "cali00000000001 <-> eth0 netns /run/netns/a 10.244.0.5/32 mtu 1500\n" +
		"cali00000000002 <-> eth0 netns /run/netns/b 10.244.0.6/32 10.244.0.7/32 mtu 1500 mac 0a:58:0a:f4:00:06\n"
	if diff := cmp.Diff(wantLinks, w.String()); diff != "" {
		t.Errorf("workloads (-want +got):\n%s", diff)
	}

	// The agent's proto 80 sync keeps the workload routes it is told about.
	r.ResetOps()
	block := dataplane.Route{Dst: netip.MustParsePrefix("10.244.0.0/26"), Type: dataplane.RouteBlackhole, Proto: 80}
	desired := append(append([]dataplane.Route{block}, dataplane.HostRoutes(a)...), dataplane.HostRoutes(b)...)
	if err := dataplane.SyncRoutes(r, 80, desired); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"replace blackhole 10.244.0.0/26 proto 80"}, r.Ops()); diff != "" {
		t.Errorf("sync ops (-want +got):\n%s", diff)
	}
	if err := r.Delete(block); err != nil {
		t.Fatal(err)
	}

	// Idempotent; the repeat says the pair existed.
	wantA := stA
	wantA.Existed = true
	if st, err := w.Setup(ctx, a); err != nil || st != wantA {
		t.Errorf("second Setup = %+v, %v; want %+v", st, err, wantA)
	}
	if diff := cmp.Diff([]string{"setup cali00000000001", "setup cali00000000002"}, w.Ops()); diff != "" {
		t.Errorf("ops (-want +got):\n%s", diff)
	}

	// Check sees a route removed behind its back; Setup repairs it.
	if err := r.Delete(dataplane.Route{Dst: netip.MustParsePrefix("10.244.0.7/32"), Dev: "cali00000000002", Proto: 80}); err != nil {
		t.Fatal(err)
	}
	if err := w.Check(ctx, b); err == nil || !strings.Contains(err.Error(), "10.244.0.7/32") {
		t.Errorf("Check = %v, want missing route", err)
	}
	if _, err := w.Setup(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := w.Check(ctx, b); err != nil {
		t.Errorf("Check after repair: %v", err)
	}
	c := b
	c.MTU = 9000
	if err := w.Check(ctx, c); err == nil {
		t.Error("Check of a different spec = nil")
	}

	// Another workload with the same container interface is refused.
	dup := spec("/run/netns/a", "cali00000000003", "10.244.0.8/32")
	if _, err := w.Setup(ctx, dup); err == nil {
		t.Error("Setup of a second eth0 in the same netns succeeded")
	}

	for range 2 {
		if err := w.Teardown(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Teardown(ctx, spec("", "cali0000000000f")); err != nil {
		t.Errorf("Teardown of an unknown workload: %v", err)
	}
	wantRoutes = "10.244.0.5/32 dev cali00000000001 scope link proto 80\n198.18.0.0/24 dev eth0 scope link proto 2\n"
	if diff := cmp.Diff(wantRoutes, r.String()); diff != "" {
		t.Errorf("routes after Teardown (-want +got):\n%s", diff)
	}
	w.RemoveLink("cali00000000001")
	if r.String() != "198.18.0.0/24 dev eth0 scope link proto 2\n" || w.String() != "" {
		t.Errorf("after RemoveLink: routes %q workloads %q", r.String(), w.String())
	}
}

func TestWorkloadsFailures(t *testing.T) {
	ctx := context.Background()
	r := fake.NewRoutes(dataplane.Route{Dst: netip.MustParsePrefix("10.244.0.9/32"), Dev: "eth0", Proto: 4})
	w := fake.NewWorkloads(r)
	s := spec("/run/netns/a", "cali00000000001", "10.244.0.5/32", "10.244.0.9/32")

	// A foreign route for the second address: nothing of the call remains.
	if _, err := w.Setup(ctx, s); !errors.Is(err, dataplane.ErrForeignRoute) {
		t.Fatalf("Setup = %v, want ErrForeignRoute", err)
	}
	if w.String() != "" || r.String() != "10.244.0.9/32 dev eth0 scope link proto 4\n" {
		t.Errorf("left after failed Setup: workloads %q routes %q", w.String(), r.String())
	}

	s.Addrs = s.Addrs[:1]
	w.SetFail("Setup", fake.ErrInjected)
	if _, err := w.Setup(ctx, s); !errors.Is(err, fake.ErrInjected) {
		t.Errorf("Setup = %v, want injected", err)
	}
	w.SetFail("Setup", nil)
	w.FailOn["Teardown cali00000000001"] = fake.ErrInjected
	if _, err := w.Setup(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := w.Teardown(ctx, s); !errors.Is(err, fake.ErrInjected) {
		t.Errorf("Teardown = %v, want injected", err)
	}
	if len(w.Specs()) != 1 {
		t.Errorf("failed Teardown removed the workload")
	}
	if _, err := w.Setup(ctx, spec("/run/netns/a", "cali1", "10.244.0.0/24")); err == nil {
		t.Error("Setup with an invalid spec succeeded")
	}
}

func TestRoutesFake(t *testing.T) {
	r := fake.NewRoutes()
	bh := dataplane.Route{Dst: netip.MustParsePrefix("10.244.0.0/26"), Type: dataplane.RouteBlackhole, Proto: 80}
	if err := r.Replace(bh); err != nil {
		t.Fatal(err)
	}
	// Delete matches the protocol and type like the kernel: these are no-ops.
	for _, rt := range []dataplane.Route{
		{Dst: bh.Dst, Type: dataplane.RouteBlackhole, Proto: 81},
		{Dst: bh.Dst, Dev: "cali1", Proto: 80},
	} {
		if err := r.Delete(rt); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Delete(dataplane.Route{Dst: bh.Dst, Proto: 3}); !errors.Is(err, dataplane.ErrForeignRoute) {
		t.Errorf("Delete proto 3 = %v, want ErrForeignRoute", err)
	}
	if err := r.Replace(dataplane.Route{Dst: bh.Dst, Dev: "x", Proto: 3}); !errors.Is(err, dataplane.ErrForeignRoute) {
		t.Errorf("Replace proto 3 = %v, want ErrForeignRoute", err)
	}
	if got := r.String(); got != "blackhole 10.244.0.0/26 proto 80\n" {
		t.Errorf("table = %q", got)
	}
	if err := r.Delete(bh); err != nil || r.String() != "" {
		t.Errorf("Delete = %v, table %q", err, r.String())
	}
}
