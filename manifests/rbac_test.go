package manifests

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
)

// TestRBACIsMinimal: the agent talks to etcd, not to the API server, so
// tabby-node is granted nothing; any rule the manifests ever carry must be
// read-only and name no wildcard.
func TestRBACIsMinimal(t *testing.T) {
	if problems := rbacProblems(loadManifests(t)); len(problems) > 0 {
		t.Errorf("RBAC:\n%s", strings.Join(problems, "\n"))
	}
}

// TestRBACCheckCatchesExcess feeds the check what it must refuse.
func TestRBACCheckCatchesExcess(t *testing.T) {
	const stream = `
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: tabby-node}
rules:
  - {apiGroups: [""], resources: [nodes], verbs: [get, patch]}
  - {apiGroups: ["*"], resources: [pods], verbs: [list]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: tabby-node}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: tabby-node}
subjects: [{kind: ServiceAccount, name: tabby-node, namespace: tabby-system}]
`
	objs, err := decodeStrict([]byte(stream))
	if err != nil {
		t.Fatal(err)
	}
	got := rbacProblems(&objects{all: objs})
	want := []string{`grants "patch"`, "wildcard", "tabby-node is granted ClusterRole/tabby-node"}
	if len(got) != len(want) {
		t.Fatalf("problems %q, want %d", got, len(want))
	}
	for i := range want {
		if !strings.Contains(got[i], want[i]) {
			t.Errorf("problem %d = %q, want one containing %q", i, got[i], want[i])
		}
	}
}

// allowedWrite: the only writes Tabby needs, all tabby-kube-controllers':
// patching a node's status (NetworkUnavailable), its leader Lease, and for
// LoadBalancer IPAM a Service's status and events, and the Accepted
// condition on a ClusterNetworkPolicy's status.
func allowedWrite(role string, r rbacv1.PolicyRule, verb string) bool {
	is := func(group, resource string) bool {
		return slices.Equal(r.APIGroups, []string{group}) && slices.Equal(r.Resources, []string{resource})
	}
	switch role {
	case "ClusterRole/tabby-kube-controllers":
		return verb == "patch" && is("", "nodes/status") ||
			// LoadBalancer IPAM: the Service's status, and events on it.
			verb == "update" && is("", "services/status") ||
			(verb == "create" || verb == "patch") && is("", "events") ||
			verb == "update" && is("policy.networking.k8s.io", "clusternetworkpolicies/status")
	case "Role/tabby-system/tabby-kube-controllers":
		return is("coordination.k8s.io", "leases") && (verb == "create" ||
			verb == "update" && slices.Equal(r.ResourceNames, []string{"tabby-kube-controllers"}))
	}
	return false
}

func rbacProblems(o *objects) []string {
	var problems []string
	roles := map[string][]rbacv1.PolicyRule{}
	for _, r := range all[*rbacv1.ClusterRole](o) {
		roles["ClusterRole/"+r.Name] = r.Rules
	}
	for _, r := range all[*rbacv1.Role](o) {
		roles["Role/"+r.Namespace+"/"+r.Name] = r.Rules
	}
	readOnly := []string{"get", "list", "watch"}
	for _, name := range slices.Sorted(maps.Keys(roles)) {
		for _, r := range roles[name] {
			for _, v := range r.Verbs {
				if !slices.Contains(readOnly, v) && !allowedWrite(name, r, v) {
					problems = append(problems, fmt.Sprintf("%s: rule %v grants %q", name, r, v))
				}
			}
			for _, field := range [][]string{r.Verbs, r.Resources, r.APIGroups, r.NonResourceURLs} {
				if slices.Contains(field, "*") {
					problems = append(problems, fmt.Sprintf("%s: rule %v has a wildcard", name, r))
				}
			}
		}
	}
	// What the bindings grant the agent's account.
	var granted []string
	bind := func(ns string, ref rbacv1.RoleRef, subjects []rbacv1.Subject) {
		key := ref.Kind + "/" + ref.Name
		if ref.Kind == "Role" {
			key = "Role/" + ns + "/" + ref.Name
		}
		for _, s := range subjects {
			if s.Kind == rbacv1.ServiceAccountKind && s.Name == saName && s.Namespace == namespace {
				granted = append(granted, key)
			}
		}
	}
	for _, b := range all[*rbacv1.ClusterRoleBinding](o) {
		bind("", b.RoleRef, b.Subjects)
	}
	for _, b := range all[*rbacv1.RoleBinding](o) {
		bind(b.Namespace, b.RoleRef, b.Subjects)
	}
	for _, g := range granted {
		problems = append(problems, fmt.Sprintf("tabby-node is granted %s %v; the agent uses no Kubernetes API (add a rule only with the code that needs it)", g, roles[g]))
	}
	return problems
}
