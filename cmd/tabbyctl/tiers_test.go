package main

import (
	"strings"
	"testing"
)

func TestTiersCommands(t *testing.T) {
	h := newHarness(t)
	out := h.ok("get", "tiers")
	for _, want := range []string{"kube-admin      1000       Pass", "default         1000000    Deny", "kube-baseline   10000000   Pass"} {
		if !strings.Contains(strings.Join(strings.Fields(out), " "), strings.Join(strings.Fields(want), " ")) {
			t.Errorf("get tiers: no %q in\n%s", want, out)
		}
	}
	err := h.fail("delete", "tier", "default")
	if err == nil || !strings.Contains(err.Error(), "built-in tier") {
		t.Errorf("delete tier default: %v", err)
	}
	err = h.fail("apply", "-f", h.file("lost.yaml", `apiVersion: tabby.dev/v1
kind: GlobalNetworkPolicy
metadata: {name: lost}
spec: {tier: nope, ingress: [{action: Deny}]}
`))
	if err == nil || !strings.Contains(err.Error(), `spec.tier: tier "nope" does not exist`) || !strings.Contains(err.Error(), "nothing was changed") {
		t.Errorf("apply with a missing tier: %v", err)
	}
	err = h.fail("apply", "-f", h.file("pass.yaml", `apiVersion: tabby.dev/v1
kind: Tier
metadata: {name: last}
---
apiVersion: tabby.dev/v1
kind: GlobalNetworkPolicy
metadata: {name: p}
spec: {tier: last, ingress: [{action: Pass}]}
`))
	if err == nil || !strings.Contains(err.Error(), "spec.ingress[0].action: Pass in tier last, the last tier") {
		t.Errorf("apply with Pass in the last tier: %v", err)
	}
	out = h.ok("apply", "-f", h.file("ok.yaml", `apiVersion: tabby.dev/v1
kind: Tier
metadata: {name: security}
spec: {order: 1000, defaultAction: Pass}
---
apiVersion: tabby.dev/v1
kind: GlobalNetworkPolicy
metadata: {name: p}
spec: {tier: security, ingress: [{action: Pass}]}
`))
	if !strings.Contains(out, "warning: Tier security: spec.order: 1000 is also tier kube-admin's order") {
		t.Errorf("apply with an order tie: no warning in\n%s", out)
	}
	if err := h.fail("delete", "tier", "security"); err == nil || !strings.Contains(err.Error(), "1 policy still name it") {
		t.Errorf("delete a tier in use: %v", err)
	}
	out = h.ok("get", "tiers", "-o", "wide")
	if !strings.Contains(strings.Join(strings.Fields(out), " "), "security 1000 Pass 1 0") {
		t.Errorf("get tiers -o wide:\n%s", out)
	}
}
