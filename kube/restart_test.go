package kube_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/kube/kubetest"
)

// The only replica stops; while none runs, pods, namespaces and policies
// change in Kubernetes. The restarted replica catches up on every change
// (nothing lost), releases the address of the pod deleted meanwhile only
// after the grace, and releases or deletes nothing that is still live or
// that it did not write (nothing released wrongly). A pod recorded by
// controllers from before the copies under the nodes (its copy missing)
// gets its copy written with its record, at the record's revision.
func TestControllersRestartCatchUp(t *testing.T) {
	srv := kubetest.Start(t)
	ctx := context.Background()
	kc := srv.Client
	store := storetest.New(t)
	alloc := ipam.New(store)
	if _, err := store.Create(ctx, &api.IPPool{Metadata: api.ObjectMeta{Name: "pool1"}, Spec: api.IPPoolSpec{CIDR: "10.244.0.0/16"}}); err != nil {
		t.Fatal(err)
	}
	kubetest.ApplyControllersRBAC(t, kc, "../manifests/tabby-kube-controllers.yaml")
	ctrlClient := srv.As(t, "controllers")
	stop := startControllers(t, testConfig("a"), ctrlClient, store)

	mustCreate(t, "namespace", func() (*corev1.Namespace, error) {
		return kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "r14",
			Labels: map[string]string{"team": "red"}}}, metav1.CreateOptions{})
	})
	for _, name := range []string{"live", "gone", "old"} {
		mustCreate(t, "pod", func() (*corev1.Pod, error) {
			return kc.CoreV1().Pods("r14").Create(ctx, pod("r14", name, "n1", map[string]string{"app": name}), metav1.CreateOptions{})
		})
	}
	for _, name := range []string{"p-kept", "p-deleted"} {
		mustCreate(t, "policy", func() (*networkingv1.NetworkPolicy, error) {
			return kc.NetworkingV1().NetworkPolicies("r14").Create(ctx, &networkingv1.NetworkPolicy{
				ObjectMeta: metav1.ObjectMeta{Namespace: "r14", Name: name},
				Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "live"}}},
			}, metav1.CreateOptions{})
		})
	}
	// A policy written with tabbyctl, which the controllers must leave alone.
	own := &api.NetworkPolicy{Metadata: api.ObjectMeta{Name: "own", Namespace: "r14"},
		Spec: api.NetworkPolicySpec{PodSelector: api.LabelSelector{MatchLabels: map[string]string{"app": "live"}}}}
	own.SetDefaults()
	if _, err := store.Create(ctx, own); err != nil {
		t.Fatal(err)
	}
	live := endpointFor(t, store, alloc, "r14", "live", "n1")
	gone := endpointFor(t, store, alloc, "r14", "gone", "n1")
	liveOK := func(want func(w *api.WorkloadEndpoint) bool) func() (bool, string) {
		return func() (bool, string) {
			w, err := datastore.GetAs[*api.WorkloadEndpoint](ctx, store, api.KindWorkloadEndpoint, "r14", live.Metadata.Name)
			if err != nil {
				return false, err.Error()
			}
			return want(w), string(mustJSON(w))
		}
	}
	policyIs := func(name string, present bool) func() (bool, string) {
		return func() (bool, string) {
			_, err := store.Get(ctx, api.KindNetworkPolicy, "r14", name)
			if present {
				return err == nil, errString(err)
			}
			return errors.Is(err, datastore.ErrNotFound), errString(err)
		}
	}
	eventually(t, "first sync", 15*time.Second, liveOK(func(w *api.WorkloadEndpoint) bool {
		return w.Metadata.Labels["app"] == "live" && w.Spec.NamespaceLabels["team"] == "red"
	}))
	eventually(t, "translated policies", 15*time.Second, policyIs("k8s.p-deleted", true))
	eventually(t, "translated policies", 15*time.Second, policyIs("k8s.p-kept", true))

	if err := stop(); err != nil {
		t.Fatalf("stopping the controllers: %v", err)
	}
	// While no replica runs. The copy of "old" goes, as if controllers
	// that wrote no copies had recorded it.
	oldCopy := datastore.KubeNodePodKey("n1", "r14", "old")
	if _, err := store.Txn(ctx, nil, []datastore.Op{{Key: oldCopy, Delete: true}}); err != nil {
		t.Fatal(err)
	}
	p, err := kc.CoreV1().Pods("r14").Get(ctx, "live", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Labels = map[string]string{"app": "live", "changed": "while-down"}
	if _, err := kc.CoreV1().Pods("r14").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	n, err := kc.CoreV1().Namespaces().Get(ctx, "r14", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Labels["team"] = "blue"
	if _, err := kc.CoreV1().Namespaces().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kc.NetworkingV1().NetworkPolicies("r14").Delete(ctx, "p-deleted", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, "policy", func() (*networkingv1.NetworkPolicy, error) {
		return kc.NetworkingV1().NetworkPolicies("r14").Create(ctx, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: "r14", Name: "p-new"},
			Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{}},
		}, metav1.CreateOptions{})
	})
	if err := kc.CoreV1().Pods("r14").Delete(ctx, "gone", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	// Down for longer than the grace: the grace still counts from when
	// the restarted replica first sees the orphan, not from the deletion.
	down := testConfig("x").GCGrace + 500*time.Millisecond
	time.Sleep(down)
	if addrs, _ := alloc.AddressesByHandle(ctx, gone.Spec.IPAMHandle); len(addrs) != 1 {
		t.Fatalf("the deleted pod's address was released with no controller running: %v", addrs)
	}

	restarted := time.Now()
	startControllers(t, testConfig("a"), ctrlClient, store)
	eventually(t, "label changes made while down", 20*time.Second, liveOK(func(w *api.WorkloadEndpoint) bool {
		return w.Metadata.Labels["changed"] == "while-down" && w.Spec.NamespaceLabels["team"] == "blue"
	}))
	eventually(t, "policy deleted while down", 20*time.Second, policyIs("k8s.p-deleted", false))
	eventually(t, "policy created while down", 20*time.Second, policyIs("k8s.p-new", true))
	eventually(t, "pod record of the deleted pod removed", 20*time.Second, func() (bool, string) {
		_, err := store.GetKV(ctx, datastore.KubePodKey("r14", "gone"))
		return errors.Is(err, datastore.ErrNotFound), errString(err)
	})
	eventually(t, "its copy under its node removed", 20*time.Second, func() (bool, string) {
		_, err := store.GetKV(ctx, datastore.KubeNodePodKey("n1", "r14", "gone"))
		return errors.Is(err, datastore.ErrNotFound), errString(err)
	})
	eventually(t, "the deleted pod's address released", 30*time.Second, func() (bool, string) {
		addrs, err := alloc.AddressesByHandle(ctx, gone.Spec.IPAMHandle)
		return err == nil && len(addrs) == 0, errString(err)
	})
	if took := time.Since(restarted); took < testConfig("x").GCGrace {
		t.Errorf("released %s after the restart, before the grace %s", took, testConfig("x").GCGrace)
	}
	// Nothing live or foreign touched.
	if addrs, err := alloc.AddressesByHandle(ctx, live.Spec.IPAMHandle); err != nil || len(addrs) != 1 {
		t.Errorf("the live pod's address: %v, %v", addrs, err)
	}
	for _, name := range []string{"k8s.p-kept", "own"} {
		if _, err := store.Get(ctx, api.KindNetworkPolicy, "r14", name); err != nil {
			t.Errorf("policy %s: %v", name, err)
		}
	}
	if _, err := store.GetKV(ctx, datastore.KubePodKey("r14", "live")); err != nil {
		t.Errorf("live pod's record: %v", err)
	}
	if _, err := store.GetKV(ctx, datastore.KubeNodePodKey("n1", "r14", "live")); err != nil {
		t.Errorf("live pod's record under its node: %v", err)
	}
	eventually(t, "the old pod's copy written with its record", 20*time.Second, func() (bool, string) {
		c, err := store.GetKV(ctx, oldCopy)
		if err != nil {
			return false, err.Error()
		}
		r, err := store.GetKV(ctx, datastore.KubePodKey("r14", "old"))
		if err != nil {
			return false, err.Error()
		}
		return c.ModRevision == r.ModRevision, fmt.Sprintf("copy at revision %d, record at %d", c.ModRevision, r.ModRevision)
	})
}
