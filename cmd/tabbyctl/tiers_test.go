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

// TestTiersBadInputNothingChanged: every refused tier change leaves the
// store as it was — a refused manifest stores none of its objects, a
// reorder or deletion that would leave a stored policy's Pass in the last
// tier is refused, and `delete -f` of a tier with its policies deletes
// them all or nothing.
func TestTiersBadInputNothingChanged(t *testing.T) {
	h := newHarness(t)
	const passLast = `apiVersion: tabby.dev/v1
kind: Tier
metadata: {name: last}
---
apiVersion: tabby.dev/v1
kind: GlobalNetworkPolicy
metadata: {name: p}
spec: {tier: last, ingress: [{action: Pass}]}
`
	if err := h.fail("apply", "-f", h.file("pass.yaml", passLast)); err == nil || !strings.Contains(err.Error(), "nothing was changed") {
		t.Fatalf("apply with Pass in the last tier: %v", err)
	}
	if out := h.ok("get", "tiers"); strings.Contains(out, "last") {
		t.Errorf("a refused manifest stored its tier:\n%s", out)
	}

	// A tier in the middle holding a Pass: fine.
	h.ok("apply", "-f", h.file("mid.yaml", `apiVersion: tabby.dev/v1
kind: Tier
metadata: {name: mid}
spec: {order: 5000, defaultAction: Pass}
---
apiVersion: tabby.dev/v1
kind: GlobalNetworkPolicy
metadata: {name: q}
spec: {tier: mid, ingress: [{action: Pass}]}
`))
	// Moving the tier to the end would leave q's Pass with nothing to pass to.
	err := h.fail("apply", "-f", h.file("move.yaml", `apiVersion: tabby.dev/v1
kind: Tier
metadata: {name: mid}
spec: {order: 20000000, defaultAction: Pass}
`))
	if err == nil || !strings.Contains(err.Error(), "GlobalNetworkPolicy q: spec.ingress[0].action: Pass in tier mid, the last tier") {
		t.Errorf("moving a tier with a Pass to the end: %v", err)
	}
	if out := h.ok("get", "tiers"); !strings.Contains(strings.Join(strings.Fields(out), " "), "mid 5000 Pass") {
		t.Errorf("the refused reorder changed the tier:\n%s", out)
	}

	// Deleting the tier after q's would leave q's Pass last as well.
	h.ok("apply", "-f", h.file("end.yaml", `apiVersion: tabby.dev/v1
kind: Tier
metadata: {name: end}
spec: {order: 30000000}
`))
	h.ok("apply", "-f", h.file("move2.yaml", `apiVersion: tabby.dev/v1
kind: Tier
metadata: {name: mid}
spec: {order: 20000000, defaultAction: Pass}
`))
	if err := h.fail("delete", "tier", "end"); err == nil || !strings.Contains(err.Error(), "GlobalNetworkPolicy q: spec.ingress[0].action: Pass in tier mid, the last tier") {
		t.Errorf("deleting the tier after a Pass: %v", err)
	}

	// delete -f of a tier and its policy, the tier first as it was applied.
	both := h.file("both.yaml", `apiVersion: tabby.dev/v1
kind: Tier
metadata: {name: solo}
spec: {order: 6000}
---
apiVersion: tabby.dev/v1
kind: GlobalNetworkPolicy
metadata: {name: r}
spec: {tier: solo, ingress: [{action: Deny}]}
`)
	h.ok("apply", "-f", both)
	h.ok("delete", "-f", both)
	if out := h.ok("get", "tiers"); strings.Contains(out, "solo") {
		t.Errorf("delete -f left the tier:\n%s", out)
	}
	// A tier whose policies are not all in the manifest: nothing deleted.
	h.ok("apply", "-f", both)
	h.ok("apply", "-f", h.file("other.yaml", `apiVersion: tabby.dev/v1
kind: GlobalNetworkPolicy
metadata: {name: s}
spec: {tier: solo, ingress: [{action: Deny}]}
`))
	if err := h.fail("delete", "-f", both); err == nil || !strings.Contains(err.Error(), "1 policy still name it") || !strings.Contains(err.Error(), "nothing was deleted") {
		t.Errorf("delete -f of a tier still in use: %v", err)
	}
	if out := h.ok("get", "globalnetworkpolicies"); !strings.Contains(out, "r") {
		t.Errorf("a refused delete -f deleted policy r:\n%s", out)
	}
}
