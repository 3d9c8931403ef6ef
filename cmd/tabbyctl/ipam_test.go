package main

import (
	"cmp"
	"context"
	"crypto/sha1"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/ipam"
)

const ipamCluster = `apiVersion: tabby.dev/v1
kind: IPPool
metadata: {name: pods}
spec: {cidr: 10.244.0.0/24, blockSize: 28}
---
apiVersion: tabby.dev/v1
kind: IPPool
metadata: {name: spare}
spec: {cidr: 10.245.0.0/24, blockSize: 28, disabled: true}
---
apiVersion: tabby.dev/v1
kind: Node
metadata: {name: node-1}
spec: {bgp: {ipv4Address: 198.18.0.11/24}}
---
apiVersion: tabby.dev/v1
kind: Node
metadata: {name: node-2}
spec: {bgp: {ipv4Address: 198.18.0.12/24}}
`

// pod is a pod for the IPAM and explain tests: its allocation and, unless
// leaked, its workload endpoint.
type pod struct {
	node, ns, name string
	labels         map[string]string
	addr           string        // "" = any address
	leaked         bool          // no workload endpoint
	age            time.Duration // of the allocation; 0 = an hour
}

// handleOf is the handle addPods gives a pod.
func handleOf(ns, name string) string {
	sum := sha1.Sum([]byte(ns + "." + name))
	return "tabby." + fmt.Sprintf("%x", sum[:8])
}

// addPods assigns addresses (dated an hour before fixedNow, so that they
// are past the leak grace) and writes the endpoints. It returns each pod's
// address by name.
func addPods(t *testing.T, h *harness, pods []pod) map[string]netip.Addr {
	t.Helper()
	ctx := context.Background()
	out := map[string]netip.Addr{}
	for _, p := range pods {
		age := cmp.Or(p.age, time.Hour)
		alloc := ipam.New(h.store, ipam.WithClock(func() time.Time { return fixedNow.Add(-age) }))
		sum := sha1.Sum([]byte(p.ns + "." + p.name))
		cid := fmt.Sprintf("%x", sum[:8])
		handle := "tabby." + cid
		req := ipam.AssignRequest{Node: p.node, Handle: handle, Attrs: ipam.Attributes{Node: p.node, Namespace: p.ns, Pod: p.name, ContainerID: cid}}
		if p.addr != "" {
			req.Addr = netip.MustParseAddr(p.addr)
		}
		as, err := alloc.Assign(ctx, req)
		if err != nil {
			t.Fatalf("assign %s: %v", p.name, err)
		}
		out[p.name] = as.Addr
		if p.leaked {
			continue
		}
		wep := &api.WorkloadEndpoint{
			Metadata: api.ObjectMeta{Name: p.node + "-k8s-" + p.name + "-eth0", Namespace: p.ns, Labels: p.labels},
			Spec: api.WorkloadEndpointSpec{
				Node: p.node, Orchestrator: "k8s", Pod: p.name, ContainerID: cid, Endpoint: "eth0",
				InterfaceName: fmt.Sprintf("cali%x", sum[:])[:15], MAC: "ee:ee:ee:ee:ee:ee",
				IPNetworks: []string{netip.PrefixFrom(as.Addr, 32).String()}, IPAMHandle: handle,
			},
		}
		if _, err := h.store.Create(ctx, wep); err != nil {
			t.Fatalf("creating endpoint of %s: %v", p.name, err)
		}
	}
	return out
}

func TestIPAM(t *testing.T) {
	h := newHarness(t)
	if _, err := h.run(ipamCluster, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	h.ok("ipam", "show")
	addrs := addPods(t, h, []pod{
		{node: "node-1", ns: "shop", name: "web-0"},
		{node: "node-1", ns: "shop", name: "db-0"},
		{node: "node-2", ns: "default", name: "api-0"},
		{node: "node-1", ns: "default", name: "gone-0", leaked: true},
	})
	// node-2 takes an address from node-1's block: borrowed.
	borrowed := addrs["web-0"].Next().Next().Next().Next().String()
	addrs2 := addPods(t, h, []pod{{node: "node-2", ns: "default", name: "borrower-0", addr: borrowed}})
	if got := addrs2["borrower-0"].String(); got != borrowed {
		t.Fatalf("borrower got %s, want %s", got, borrowed)
	}
	// An empty handle record, as a crash of an older writer could leave.
	if _, err := h.store.PutKV(context.Background(), "ipam/handles/stale", []byte(`{"handle":"stale","node":"node-1","addrs":[]}`), 0); err != nil {
		t.Fatal(err)
	}

	h.ok("ipam", "show")
	h.ok("ipam", "show", "--show-blocks", "--show-borrowed")
	h.ok("ipam", "show", "--ip", addrs["web-0"].String())
	h.ok("ipam", "show", "--ip", borrowed)
	h.ok("ipam", "show", "--ip", addrs["gone-0"].String())
	h.ok("ipam", "show", "--ip", "10.244.0.250")
	h.ok("ipam", "show", "--ip", "192.0.2.1")
	h.fail("ipam", "show", "--ip", "10.244.0")

	report := h.dir + "/report.json"
	h.fail("ipam", "check", "-o", report)
	h.show(report)
	h.fail("ipam", "release", "--ip", addrs["web-0"].String())
	h.fail("ipam", "release", "--ip", addrs["web-0"].String(), "--handle", handleOf("shop", "web-0"))
	h.fail("ipam", "release")
	h.ok("ipam", "release", "--from-report", report)
	h.ok("ipam", "release", "--from-report", report) // nothing left to do
	h.ok("ipam", "check")

	// Remove api-0's endpoint: with the default grace its address is a leak,
	// with a longer grace not yet.
	if err := h.store.Delete(context.Background(), api.KindWorkloadEndpoint, "default", "node-2-k8s-api-0-eth0", ""); err != nil {
		t.Fatal(err)
	}
	h.ok("ipam", "check", "--leak-grace", "2h")
	h.fail("ipam", "check")
	// The handle is required, and must be the holder's.
	h.fail("ipam", "release", "--ip", addrs["api-0"].String())
	h.fail("ipam", "release", "--ip", addrs["api-0"].String(), "--handle", handleOf("shop", "db-0"))
	h.ok("ipam", "release", "--ip", addrs["api-0"].String()+",10.244.0.250", "--handle", handleOf("default", "api-0"))
	h.ok("ipam", "release", "--ip", addrs["db-0"].String(), "--force")
	h.fail("ipam", "check") // db-0's endpoint now uses an unallocated address

	// A young leak: only a check with a short grace finds it, and releasing
	// from that report checks again with the report's grace.
	young := addPods(t, h, []pod{{node: "node-2", ns: "default", name: "young-0", leaked: true, age: 10 * time.Second}})
	report2 := h.dir + "/young.json"
	h.fail("ipam", "check", "--leak-grace", "5s", "-o", report2)
	h.ok("ipam", "release", "--from-report", report2, "--leak-grace", "1m")
	h.ok("ipam", "release", "--from-report", report2)
	h.ok("ipam", "show", "--ip", young["young-0"].String())
	h.golden("ipam")
}

// A dual-stack cluster: an IPv6 pool beside the IPv4 one, pods holding one
// address of each family under one handle. ipam show counts the IPv6 pool
// as 2^64 addresses, shows its /122 blocks and finds an IPv6 address;
// ipam check finds nothing wrong.
func TestIPAMDualStack(t *testing.T) {
	h := newHarness(t)
	cluster := ipamCluster + `---
apiVersion: tabby.dev/v1
kind: IPPool
metadata: {name: pods6}
spec: {cidr: "fd00:10:244::/64"}
`
	if _, err := h.run(cluster, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	alloc := ipam.New(h.store, ipam.WithClock(func() time.Time { return fixedNow.Add(-time.Hour) }))
	var v6 []netip.Addr
	for i, node := range []string{"node-1", "node-1", "node-2"} {
		name := fmt.Sprintf("dual-%d", i)
		sum := sha1.Sum([]byte("default." + name))
		cid := fmt.Sprintf("%x", sum[:8])
		handle := "tabby." + cid
		var nets []string
		for _, fam := range []int{4, 6} {
			as, err := alloc.Assign(ctx, ipam.AssignRequest{Node: node, Handle: handle, Family: fam,
				Attrs: ipam.Attributes{Node: node, Namespace: "default", Pod: name, ContainerID: cid}})
			if err != nil {
				t.Fatalf("assign IPv%d for %s: %v", fam, name, err)
			}
			nets = append(nets, netip.PrefixFrom(as.Addr, as.Addr.BitLen()).String())
			if fam == 6 {
				v6 = append(v6, as.Addr)
			}
		}
		wep := &api.WorkloadEndpoint{
			Metadata: api.ObjectMeta{Name: node + "-k8s-" + name + "-eth0", Namespace: "default"},
			Spec: api.WorkloadEndpointSpec{
				Node: node, Orchestrator: "k8s", Pod: name, ContainerID: cid, Endpoint: "eth0",
				InterfaceName: fmt.Sprintf("cali%x", sum[:])[:15], MAC: "ee:ee:ee:ee:ee:ee",
				IPNetworks: nets, IPAMHandle: handle,
			},
		}
		if _, err := h.store.Create(ctx, wep); err != nil {
			t.Fatal(err)
		}
	}
	h.ok("ipam", "show")
	h.ok("ipam", "show", "--show-blocks")
	h.ok("ipam", "show", "--ip", v6[2].String())
	h.ok("ipam", "check")
	h.golden("ipam-dualstack")
}
