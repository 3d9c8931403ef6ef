package dataplane_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
)

// Dual-stack and IPv6-only workloads on one node: each gets its /128 with
// no duplicate address detection pending, a default route through the
// host side's link-local address, and a /128 host route; pods reach each
// other over IPv6 (and the dual-stack ones over IPv4) at once, the first
// ping answered; a repeated Setup changes nothing; CHECK passes; Teardown
// leaves no route.
func TestPrivilegedWorkloadIPv6(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	if _, err := exec.LookPath("ping"); err != nil {
		t.Skip("ping not installed")
	}
	node, w := workloadNode(t)
	run(t, "ip", "-n", node.Name, "link", "add", "up6", "type", "veth", "peer", "name", "up6p")
	run(t, "ip", "-n", node.Name, "link", "set", "up6", "up")
	run(t, "ip", "-n", node.Name, "link", "set", "up6p", "up")
	run(t, "ip", "-n", node.Name, "route", "add", "default", "dev", "up6")

	pod1, pod2, pod3 := testkit.NewNetNS(t, "tbdp-ds1"), testkit.NewNetNS(t, "tbdp-ds2"), testkit.NewNetNS(t, "tbdp-v6only")
	specs := []dataplane.WorkloadSpec{
		podSpec(pod1, "default/ds1", "10.244.30.1/32", "fd00:10:244::1/128"),
		podSpec(pod2, "default/ds2", "10.244.30.2/32", "fd00:10:244::2/128"),
		podSpec(pod3, "default/v6only", "fd00:10:244::3/128"),
	}
	for _, s := range specs {
		setup(t, w, s)
	}
	t.Cleanup(func() {
		for _, s := range specs {
			if err := w.Teardown(context.Background(), s); err != nil {
				t.Error(err)
			}
		}
	})
	if got := sysctlIn(t, node, "net.ipv6.conf.all.forwarding"); got != "1" {
		t.Errorf("node net.ipv6.conf.all.forwarding = %s, want 1", got)
	}
	if got := sysctlIn(t, node, "net.ipv6.conf."+specs[0].HostIfName+".accept_dad"); got != "0" {
		t.Errorf("host side accept_dad = %s, want 0", got)
	}
	addrs := run(t, "ip", "-6", "-o", "-n", pod1.Name, "addr", "show", "dev", "eth0", "scope", "global")
	if !strings.Contains(addrs, "fd00:10:244::1/128") || strings.Contains(addrs, "tentative") {
		t.Errorf("pod address missing or tentative:\n%s", addrs)
	}
	routes := run(t, "ip", "-6", "-n", pod1.Name, "route", "show")
	if !strings.Contains(routes, "default via fe80::ecee:eeff:feee:eeee dev eth0") {
		t.Errorf("pod has no IPv6 default route through the host side:\n%s", routes)
	}
	hostRoutes := run(t, "ip", "-6", "-n", node.Name, "route", "show", "proto", "80")
	for _, s := range specs {
		for _, a := range s.Addrs {
			if a.Addr().Is6() && !strings.Contains(hostRoutes, a.Addr().String()+" dev "+s.HostIfName) {
				t.Errorf("no host route to %s via %s:\n%s", a, s.HostIfName, hostRoutes)
			}
		}
	}
	for _, c := range []struct {
		from testkit.NetNS
		to   string
	}{
		{pod1, "fd00:10:244::2"}, {pod2, "fd00:10:244::3"}, {pod3, "fd00:10:244::1"},
		{pod1, "10.244.30.2"}, {pod2, "10.244.30.1"},
	} {
		if out, err := exec.Command("nsenter", "--net="+c.from.Path, "ping", "-c1", "-W2", c.to).CombinedOutput(); err != nil {
			t.Errorf("first ping %s from %s: %v\n%s", c.to, c.from.Name, err, out)
		}
	}

	// A repeated Setup finds everything right and changes nothing; CHECK
	// agrees.
	before := run(t, "ip", "-6", "-n", node.Name, "route", "show", "table", "all") + run(t, "ip", "-6", "-n", pod1.Name, "route", "show", "table", "all")
	st := setup(t, w, specs[0])
	after := run(t, "ip", "-6", "-n", node.Name, "route", "show", "table", "all") + run(t, "ip", "-6", "-n", pod1.Name, "route", "show", "table", "all")
	if !st.Existed || before != after {
		t.Errorf("repeated Setup: existed %v; routes before:\n%s\nafter:\n%s", st.Existed, before, after)
	}
	for _, s := range specs {
		if err := w.Check(context.Background(), s); err != nil {
			t.Errorf("Check(%s): %v", s.HostIfName, err)
		}
	}
	// Dropping the IPv6 address from a dual-stack pod removes it and its
	// route, and keeps the IPv4 side working.
	v4only := specs[1]
	v4only.Addrs = v4only.Addrs[:1]
	setup(t, w, v4only)
	if a := run(t, "ip", "-6", "-n", pod2.Name, "addr", "show", "dev", "eth0", "scope", "global"); strings.Contains(a, "fd00:10:244::2") {
		t.Errorf("IPv6 address kept after it left the spec:\n%s", a)
	}
	if r := run(t, "ip", "-6", "-n", node.Name, "route", "show", "proto", "80"); strings.Contains(r, "fd00:10:244::2") {
		t.Errorf("host route to the removed IPv6 address kept:\n%s", r)
	}
	if out, err := exec.Command("nsenter", "--net="+pod1.Path, "ping", "-c1", "-W2", "10.244.30.2").CombinedOutput(); err != nil {
		t.Errorf("IPv4 after dropping IPv6: %v\n%s", err, out)
	}
	specs[1] = v4only

	for _, s := range specs {
		if err := w.Teardown(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	if r := run(t, "ip", "-n", node.Name, "-6", "route", "show", "proto", "80"); strings.TrimSpace(r) != "" {
		t.Errorf("IPv6 host routes left after Teardown:\n%s", r)
	}
}
