package main

import (
	"context"
	"net/netip"
	"testing"

	"github.com/tabbynet/tabby/ipam"
)

// LoadBalancer pools through tabbyctl: applied beside a pod pool, refused
// when they overlap another pool or mix uses, and shown with the Service
// holding each address.
func TestLoadBalancerPools(t *testing.T) {
	h := newHarness(t)
	pools := h.file("pools.yaml", `apiVersion: tabby.dev/v1
kind: IPPool
metadata: {name: pods}
spec: {cidr: 10.244.0.0/16}
---
apiVersion: tabby.dev/v1
kind: IPPool
metadata: {name: lb}
spec: {cidr: 198.19.0.0/29, allowedUses: [LoadBalancer]}
---
apiVersion: tabby.dev/v1
kind: IPPool
metadata: {name: lb6}
spec: {cidr: "fd00:198:19::/124", allowedUses: [LoadBalancer]}
`)
	h.ok("apply", "-f", pools)
	h.ok("get", "ippools", "lb", "-o", "yaml")
	h.ok("get", "ippools", "-o", "wide")
	for _, f := range []struct{ name, doc string }{
		{"lb-overlaps-lb.yaml", `apiVersion: tabby.dev/v1
kind: IPPool
metadata: {name: lb2}
spec: {cidr: 198.19.0.4/30, allowedUses: [LoadBalancer]}
`},
		{"lb-overlaps-pods.yaml", `apiVersion: tabby.dev/v1
kind: IPPool
metadata: {name: lb3}
spec: {cidr: 10.244.200.0/24, allowedUses: [LoadBalancer]}
`},
		{"lb-mixed.yaml", `apiVersion: tabby.dev/v1
kind: IPPool
metadata: {name: lb4}
spec: {cidr: 198.19.1.0/24, allowedUses: [Workload, LoadBalancer], natOutgoing: true}
`},
		{"pods-to-lb.yaml", `apiVersion: tabby.dev/v1
kind: IPPool
metadata: {name: pods}
spec: {cidr: 10.244.0.0/16, allowedUses: [LoadBalancer]}
`},
	} {
		h.fail("apply", "-f", h.file(f.name, f.doc))
	}
	ctx := context.Background()
	alloc := ipam.New(h.store)
	for _, r := range []ipam.LBRequest{
		{Service: ipam.LBService{Namespace: "shop", Name: "web"}, Families: []int{4, 6}},
		{Service: ipam.LBService{Namespace: "shop", Name: "api"}, Families: []int{4}, Addrs: []netip.Addr{netip.MustParseAddr("198.19.0.5")}},
	} {
		if _, err := alloc.AssignLB(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	h.ok("ipam", "show")
	h.ok("ipam", "show", "--ip", "198.19.0.5")
	h.ok("ipam", "show", "--ip", "198.19.0.6")
	h.fail("delete", "ippool", "lb")
	h.ok("ipam", "check")
	h.golden("lbpools")
}
