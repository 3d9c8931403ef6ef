package dataplane_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/internal/testkit"
)

// hardened are the settings every workload host interface has, whatever
// the workload's families (docs/agent.md, "Workload interfaces").
func hardened(ifName string) map[string]string {
	return map[string]string{
		"net.ipv4.conf." + ifName + ".rp_filter":        "1",
		"net.ipv4.conf." + ifName + ".accept_redirects": "0",
		"net.ipv4.conf." + ifName + ".send_redirects":   "0",
		"net.ipv6.conf." + ifName + ".accept_ra":        "0",
		"net.ipv6.conf." + ifName + ".autoconf":         "0",
		"net.ipv6.conf." + ifName + ".accept_redirects": "0",
	}
}

// TestPrivilegedHostIfHardening wires an IPv4-only pod (Setup), an
// IPv6-only pod (Prepare, then Complete) and a dual-stack one, with the
// node's defaults for new interfaces set to the unsafe values (accept_ra,
// autoconf, redirects on): every host interface ends hardened in both
// families. Then something resets some settings: Check reports each, and
// RestoreHostIfSettings puts them back, names them, and finds nothing to do
// a second time.
func TestPrivilegedHostIfHardening(t *testing.T) {
	testkit.RequirePrivileged(t, "ip")
	ctx := context.Background()
	node, wl := workloadNode(t)
	set := func(key, val string) {
		t.Helper()
		run(t, "nsenter", "--net="+node.Path, "sh", "-c", "echo "+val+" > /proc/sys/"+strings.ReplaceAll(key, ".", "/"))
	}
	// New interfaces copy the "default" values: make them the unsafe ones,
	// so that a setting Tabby forgot shows.
	for key, val := range map[string]string{
		"net.ipv6.conf.default.accept_ra": "1", "net.ipv6.conf.default.autoconf": "1", "net.ipv6.conf.default.accept_redirects": "1",
		"net.ipv4.conf.default.accept_redirects": "1", "net.ipv4.conf.default.send_redirects": "1",
	} {
		set(key, val)
	}
	v4 := podSpec(testkit.NewNetNS(t, "tbdp-h4"), "h-v4", "10.244.30.1/32")
	v6 := podSpec(testkit.NewNetNS(t, "tbdp-h6"), "h-v6", "fd00:10:244:30::1/128")
	ds := podSpec(testkit.NewNetNS(t, "tbdp-hd"), "h-ds", "10.244.30.3/32", "fd00:10:244:30::3/128")
	setup(t, wl, v4)
	addrs := v6.Addrs
	v6.Addrs = nil
	p, err := wl.Prepare(ctx, v6)
	if err != nil {
		t.Fatal(err)
	}
	v6.Addrs = addrs
	if _, err := wl.Complete(ctx, v6, p); err != nil {
		t.Fatal(err)
	}
	setup(t, wl, ds)
	specs := []dataplane.WorkloadSpec{v4, v6, ds}
	t.Cleanup(func() {
		for _, s := range specs {
			if err := wl.Teardown(context.Background(), s); err != nil {
				t.Error(err)
			}
		}
	})
	for _, s := range specs {
		for key, want := range hardened(s.HostIfName) {
			if got := sysctlIn(t, node, key); got != want {
				t.Errorf("after ADD: %s = %s, want %s", key, got, want)
			}
		}
		if err := wl.Check(ctx, s); err != nil {
			t.Errorf("Check %s after ADD: %v", s.HostIfName, err)
		}
	}

	// Something resets them (a tool, a sysctl.d file applied with a
	// glob, an operator).
	var wantRestored []string
	for _, s := range []dataplane.WorkloadSpec{v4, v6} {
		for _, key := range []string{
			"net.ipv6.conf." + s.HostIfName + ".accept_ra", "net.ipv6.conf." + s.HostIfName + ".autoconf",
			"net.ipv6.conf." + s.HostIfName + ".accept_redirects", "net.ipv4.conf." + s.HostIfName + ".accept_redirects",
			"net.ipv4.conf." + s.HostIfName + ".send_redirects",
		} {
			set(key, "1")
			wantRestored = append(wantRestored, key+" was 1, now 0")
		}
		set("net.ipv4.conf."+s.HostIfName+".rp_filter", "0")
		wantRestored = append(wantRestored, "net.ipv4.conf."+s.HostIfName+".rp_filter was 0, now 1")
	}
	for _, s := range []dataplane.WorkloadSpec{v4, v6} {
		err := wl.Check(ctx, s)
		if err == nil {
			t.Fatalf("Check %s: no difference reported after the reset", s.HostIfName)
		}
		for _, want := range []string{"accept_ra is 1, want 0", "autoconf is 1, want 0", "send_redirects is 1, want 0", "rp_filter is 0, want 1"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Check %s: %v does not say %q", s.HostIfName, err, want)
			}
		}
	}
	restored, err := wl.RestoreHostIfSettings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(restored)
	slices.Sort(wantRestored)
	if !slices.Equal(restored, wantRestored) {
		t.Errorf("restored:\n%s\nwant:\n%s", strings.Join(restored, "\n"), strings.Join(wantRestored, "\n"))
	}
	for _, s := range specs {
		for key, want := range hardened(s.HostIfName) {
			if got := sysctlIn(t, node, key); got != want {
				t.Errorf("after restoring: %s = %s, want %s", key, got, want)
			}
		}
		if err := wl.Check(ctx, s); err != nil {
			t.Errorf("Check %s after restoring: %v", s.HostIfName, err)
		}
	}
	if again, err := wl.RestoreHostIfSettings(ctx); err != nil || len(again) > 0 {
		t.Errorf("second restore: %q, %v; want nothing", again, err)
	}
}

// BenchmarkPrivilegedHostIfHardening prices the hardening against the
// Setup it is part of, in one run: "setup" is Setup of a new IPv4-only
// pair (hardening included); "harden6" is the IPv6 part alone, as ADD
// writes it on a new pair (the IPv4 part rides in Setup's one netlink
// request); "restore-50" is one resync pass of RestoreHostIfSettings over
// 50 workload interfaces with nothing to put back.
func BenchmarkPrivilegedHostIfHardening(b *testing.B) {
	testkit.RequirePrivileged(b, "ip")
	ctx := context.Background()
	node, w := workloadNode(b)
	pod := testkit.NewNetNS(b, "tbdp-hb")
	spec := podSpec(pod, "default/bench", "10.244.40.1/32")
	spec.SkipHostRoutes = true
	b.Run("setup", func(b *testing.B) {
		for b.Loop() {
			if _, err := w.Setup(ctx, spec); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := w.Teardown(ctx, spec); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	b.Run("harden6", func(b *testing.B) {
		if _, err := w.Setup(ctx, spec); err != nil {
			b.Fatal(err)
		}
		defer func() { _ = w.Teardown(ctx, spec) }()
		for b.Loop() {
			if err := dataplane.HardenIPv6(node.Path, spec.HostIfName); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("restore-50", func(b *testing.B) {
		var specs []dataplane.WorkloadSpec
		for i := range 50 {
			s := podSpec(testkit.NewNetNS(b, "tbdp-hr"), fmt.Sprintf("default/r%d", i), fmt.Sprintf("10.244.41.%d/32", i+1))
			s.SkipHostRoutes = true
			setup(b, w, s)
			specs = append(specs, s)
		}
		defer func() {
			for _, s := range specs {
				_ = w.Teardown(ctx, s)
			}
		}()
		for b.Loop() {
			if got, err := w.RestoreHostIfSettings(ctx); err != nil || len(got) > 0 {
				b.Fatalf("restore: %q, %v", got, err)
			}
		}
	})
}
