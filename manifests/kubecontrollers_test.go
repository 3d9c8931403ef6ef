package manifests

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// TestKubeControllersDeployment: what tabby-kube-controllers depends on.
func TestKubeControllersDeployment(t *testing.T) {
	o := loadManifests(t)
	d := find[*appsv1.Deployment](t, o, "tabby-kube-controllers")
	pod := &d.Spec.Template.Spec
	if !pod.HostNetwork {
		t.Error("not on the host network: the controllers' own pod would wait for a record only they write")
	}
	if pod.ServiceAccountName != "tabby-kube-controllers" {
		t.Errorf("serviceAccountName %q", pod.ServiceAccountName)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 1 || *d.Spec.Replicas > 2 {
		t.Errorf("replicas %v, want 1 or 2 (one leads)", d.Spec.Replicas)
	}
	c := container(t, pod.Containers, "tabby-kube-controllers")
	if len(c.Command) != 1 || c.Command[0] != "/usr/local/bin/tabby-kube-controllers" {
		t.Errorf("command %v", c.Command)
	}
	cm := find[*corev1.ConfigMap](t, o, "tabby-config")
	for _, e := range c.Env {
		if ref := e.ValueFrom; ref != nil && ref.ConfigMapKeyRef != nil {
			if _, ok := cm.Data[ref.ConfigMapKeyRef.Key]; !ok || ref.ConfigMapKeyRef.Name != "tabby-config" {
				t.Errorf("env %s names %s/%s, which tabby-config lacks", e.Name, ref.ConfigMapKeyRef.Name, ref.ConfigMapKeyRef.Key)
			}
		}
	}
	for _, name := range []string{"POD_NAME", "POD_NAMESPACE", "TABBY_ETCD_ENDPOINTS"} {
		envOf(t, c, name)
	}
	// The role's Lease is the one the binary elects on by default.
	r := find[*rbacv1.Role](t, o, "tabby-kube-controllers")
	if r.Namespace != "tabby-system" || len(r.Rules) != 3 || r.Rules[1].ResourceNames[0] != "tabby-kube-controllers" {
		t.Errorf("lease role %+v", r)
	}
	// Secrets (BGP passwords, docs/bgp.md) are read in the controllers'
	// own namespace only: never through the ClusterRole.
	if sr := r.Rules[2]; len(sr.Resources) != 1 || sr.Resources[0] != "secrets" || strings.Join(sr.Verbs, ",") != "get,list,watch" {
		t.Errorf("secrets rule %+v", sr)
	}
	for _, rule := range find[*rbacv1.ClusterRole](t, o, "tabby-kube-controllers").Rules {
		if slices.Contains(rule.Resources, "secrets") {
			t.Errorf("the ClusterRole grants secrets: %+v", rule)
		}
	}
}
