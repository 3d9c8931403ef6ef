package manifests

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// k8sManifests are the Kubernetes manifests of this directory.
var k8sManifests = []string{"tabby-etcd.yaml", "tabby-kube-controllers.yaml"}

// newObject returns an empty typed object for apiVersion/kind, or nil for a
// kind the manifests have no business containing.
func newObject(apiVersion, kind string) any {
	switch apiVersion + "/" + kind {
	case "v1/Namespace":
		return &corev1.Namespace{}
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}
	case "v1/Secret":
		return &corev1.Secret{}
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}
	case "v1/Service":
		return &corev1.Service{}
	case "apps/v1/DaemonSet":
		return &appsv1.DaemonSet{}
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}
	case "rbac.authorization.k8s.io/v1/ClusterRole":
		return &rbacv1.ClusterRole{}
	case "rbac.authorization.k8s.io/v1/ClusterRoleBinding":
		return &rbacv1.ClusterRoleBinding{}
	case "rbac.authorization.k8s.io/v1/Role":
		return &rbacv1.Role{}
	case "rbac.authorization.k8s.io/v1/RoleBinding":
		return &rbacv1.RoleBinding{}
	}
	return nil
}

// decodeStrict decodes a multi-document YAML stream into typed Kubernetes
// objects the way the API server's strict field validation does: duplicate
// keys, unknown fields and fields in the wrong case are errors.
func decodeStrict(data []byte) ([]any, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []any
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		j, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if t := bytes.TrimSpace(j); len(t) == 0 || bytes.Equal(t, []byte("null")) {
			i-- // only comments: not a document
			continue
		}
		var tm metav1.TypeMeta
		if err := kjson.UnmarshalCaseSensitivePreserveInts(j, &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		obj := newObject(tm.APIVersion, tm.Kind)
		if obj == nil {
			return nil, fmt.Errorf("document %d: unexpected kind %s/%s", i, tm.APIVersion, tm.Kind)
		}
		strict, err := kjson.UnmarshalStrict(j, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
		if err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i, tm.Kind, err)
		}
		if len(strict) > 0 {
			return nil, fmt.Errorf("document %d (%s): %w", i, tm.Kind, errors.Join(strict...))
		}
		out = append(out, obj)
	}
}

// objects is the decoded content of the Kubernetes manifests.
type objects struct {
	all []any
}

func loadManifests(t *testing.T) *objects {
	t.Helper()
	o := &objects{}
	for _, name := range k8sManifests {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := decodeStrict(b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		o.all = append(o.all, objs...)
	}
	return o
}

// find returns the one object of type T with that name, failing the test
// if there is not exactly one.
func find[T any](t *testing.T, o *objects, name string) T {
	t.Helper()
	var found []T
	for _, obj := range o.all {
		if v, ok := obj.(T); ok && metaOf(obj).Name == name {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("%d objects of type %T named %q, want 1", len(found), zero, name)
	}
	return found[0]
}

func all[T any](o *objects) []T {
	var out []T
	for _, obj := range o.all {
		if v, ok := obj.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func metaOf(obj any) *metav1.ObjectMeta {
	return obj.(metav1.ObjectMetaAccessor).GetObjectMeta().(*metav1.ObjectMeta)
}

func TestDecodeStrictRejects(t *testing.T) {
	const ds = "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: x\nspec:\n  template:\n    spec:\n"
	tests := []struct{ name, doc, wantErr string }{
		{"unknown field", ds + "      hostNetwrok: true\n", "hostNetwrok"},
		{"field in the wrong case", ds + "      hostnetwork: true\n", "hostnetwork"},
		{"duplicate key", ds + "      hostNetwork: true\n      hostNetwork: false\n", "hostNetwork"},
		{"wrong type", ds + "      hostNetwork: \"yes\"\n", "hostNetwork"},
		{"unknown kind", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n", "unexpected kind v1/Pod"},
		{"bad quantity", ds + "      containers:\n        - name: c\n          resources:\n            requests:\n              cpu: lots\n", "quantities"},
		{"second document", "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n---\n" +
			"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: b\n  lables: {}\n", "document 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeStrict([]byte(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("err = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
	objs, err := decodeStrict([]byte("# comment only\n---\n" + ds + "      hostNetwork: true\n"))
	if err != nil || len(objs) != 1 || !objs[0].(*appsv1.DaemonSet).Spec.Template.Spec.HostNetwork {
		t.Errorf("valid stream: %v, %v", objs, err)
	}
}

// TestManifestsDecodeStrictly: every YAML file below manifests/ decodes,
// the Kubernetes ones into k8s.io/api types (the Tabby ones are checked in
// routereflectors_test.go), and every object has a valid name.
func TestManifestsDecodeStrictly(t *testing.T) {
	o := loadManifests(t)
	type ref struct{ Kind, Namespace, Name string }
	var got []ref
	for _, obj := range o.all {
		m := metaOf(obj)
		kind := strings.TrimPrefix(fmt.Sprintf("%T", obj), "*")
		got = append(got, ref{kind, m.Namespace, m.Name})
		if errs := validation.IsDNS1123Subdomain(m.Name); len(errs) > 0 {
			t.Errorf("%s %q: %s", kind, m.Name, strings.Join(errs, "; "))
		}
	}
	want := []ref{
		{"v1.Namespace", "", "tabby-system"},
		{"v1.ServiceAccount", "tabby-system", "tabby-node"},
		{"v1.ConfigMap", "tabby-system", "tabby-config"},
		{"v1.DaemonSet", "tabby-system", "tabby-node"},
		{"v1.ServiceAccount", "tabby-system", "tabby-kube-controllers"},
		{"v1.ClusterRole", "", "tabby-kube-controllers"},
		{"v1.ClusterRoleBinding", "", "tabby-kube-controllers"},
		{"v1.Role", "tabby-system", "tabby-kube-controllers"},
		{"v1.RoleBinding", "tabby-system", "tabby-kube-controllers"},
		{"v1.Deployment", "tabby-system", "tabby-kube-controllers"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("objects:\n got %v\nwant %v", got, want)
	}

	// Names the API server would refuse, beyond what decoding sees.
	uninstall, err := os.ReadFile("tabby-uninstall.yaml")
	if err != nil {
		t.Fatal(err)
	}
	more, err := decodeStrict(uninstall)
	if err != nil {
		t.Fatal(err)
	}
	for _, ds := range all[*appsv1.DaemonSet](&objects{all: append(o.all, more...)}) {
		pod := ds.Spec.Template.Spec
		var names []string
		for _, c := range append(pod.InitContainers, pod.Containers...) {
			names = append(names, c.Name)
			for _, e := range c.Env {
				if errs := validation.IsEnvVarName(e.Name); len(errs) > 0 {
					t.Errorf("%s: env %q: %s", ds.Name, e.Name, strings.Join(errs, "; "))
				}
			}
		}
		for _, v := range pod.Volumes {
			names = append(names, v.Name)
		}
		for _, n := range names {
			if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
				t.Errorf("%s: container or volume %q: %s", ds.Name, n, strings.Join(errs, "; "))
			}
		}
	}

	// Every YAML file is accounted for by some test.
	known := map[string]bool{"tabby-etcd.yaml": true, "tabby-kube-controllers.yaml": true, "tabby-uninstall.yaml": true, filepath.Join("route-reflectors", "bgp.yaml"): true,
		// checked by TestNetworkPolicyAPICRD
		filepath.Join("network-policy-api", "policy.networking.k8s.io_clusternetworkpolicies.yaml"): true,
		// checked by TestEtcdProxyManifest
		filepath.Join("etcd-proxy", "tabby-etcd-proxy.yaml"): true,
		// checked by TestRelayManifest
		filepath.Join("relay", "tabby-relay.yaml"): true, filepath.Join("relay", "tabby-node-relay-patch.yaml"): true}
	err = filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ext := filepath.Ext(path); (ext == ".yaml" || ext == ".yml") && !known[path] {
			t.Errorf("%s is checked by no test", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
