package kube_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/storetest"
	"github.com/tabbynet/tabby/kube"
	"github.com/tabbynet/tabby/kube/kubetest"
)

func ptrTo[T any](v T) *T { return &v }

func slice(ns, svc, name string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
	}
}

func endpoint(addr, node string, ready *bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{addr}, NodeName: ptrTo(node), Conditions: discoveryv1.EndpointConditions{Ready: ready}}
}

// TestServiceRecord: the record of a Service and its EndpointSlices.
func TestServiceRecord(t *testing.T) {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIPs: []string{"10.96.0.10", "fd00:96::10"},
			ExternalIPs: []string{"198.19.8.5", "198.19.8.5", "not-an-ip"}, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "198.19.0.1"}, {Hostname: "lb.example"}}}}}
	es := []*discoveryv1.EndpointSlice{
		slice("shop", "web", "a", endpoint("10.244.1.5", "n2", nil), endpoint("10.244.0.5", "n1", ptrTo(false))),
		slice("shop", "web", "b", endpoint("10.244.2.5", "n3", ptrTo(true)), endpoint("10.244.1.6", "n2", ptrTo(true))),
	}
	got := kube.ServiceRecord(s, es)
	want := &api.Service{Metadata: api.ObjectMeta{Namespace: "shop", Name: "web", Annotations: map[string]string{api.AnnotationOrigin: api.OriginKubernetes}},
		Spec: api.ServiceSpec{Type: "LoadBalancer", ClusterIPs: []string{"10.96.0.10", "fd00:96::10"}, ExternalIPs: []string{"198.19.8.5"},
			LoadBalancerIPs: []string{"198.19.0.1"}, ExternalTrafficPolicy: api.TrafficPolicyLocal, EndpointNodes: []string{"n2", "n3"},
			EndpointAddresses: []string{"10.244.1.5", "10.244.1.6", "10.244.2.5"}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ServiceRecord (-want +got):\n%s", diff)
	}
	headless := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db"}, Spec: corev1.ServiceSpec{ClusterIP: "None"}}
	if r := kube.ServiceRecord(headless, nil); len(r.Spec.ClusterIPs) != 0 || r.Spec.ExternalTrafficPolicy != api.TrafficPolicyCluster {
		t.Errorf("headless record: %+v", r.Spec)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("the record does not validate: %v", err)
	}
}

// TestServiceRecordsAgainstRealAPIServer: with the manifests' RBAC, the
// controllers write a Service's record, follow its LoadBalancer status and
// its endpoints' readiness and nodes, and delete the record when the
// Service goes, also while no controller ran.
func TestServiceRecordsAgainstRealAPIServer(t *testing.T) {
	srv := kubetest.Start(t)
	ctx := context.Background()
	kc := srv.Client
	store := storetest.New(t)
	kubetest.ApplyControllersRBAC(t, kc, "../manifests/tabby-kube-controllers.yaml")
	ctrlClient := srv.As(t, "controllers")
	stop := startControllers(t, testConfig("a"), ctrlClient, store)
	mustCreate(t, "namespace", func() (*corev1.Namespace, error) {
		return kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{})
	})
	svc := mustCreate(t, "service", func() (*corev1.Service, error) {
		return kc.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
			// Another implementation's class: Tabby's LoadBalancer IPAM leaves
			// the status to it, and the record follows whatever it sets.
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
				LoadBalancerClass: new("example.com/other-lb"),
				ExternalIPs:       []string{"198.19.8.5"}, Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
	})
	rec := func(want func(s *api.Service) bool) func() (bool, string) {
		return func() (bool, string) {
			s, err := datastore.GetAs[*api.Service](ctx, store, api.KindService, "shop", "web")
			if err != nil {
				return false, err.Error()
			}
			return want(s), string(mustJSON(s.Spec))
		}
	}
	eventually(t, "the record", 10*time.Second, rec(func(s *api.Service) bool {
		return slices.Equal(s.Spec.ClusterIPs, svc.Spec.ClusterIPs) && slices.Equal(s.Spec.ExternalIPs, []string{"198.19.8.5"}) &&
			s.Local() && len(s.Spec.EndpointNodes) == 0 && len(s.Spec.LoadBalancerIPs) == 0
	}))
	if a, err := netip.ParseAddr(svc.Spec.ClusterIP); err != nil || !netip.MustParsePrefix("10.96.0.0/16").Contains(a) {
		t.Fatalf("cluster IP %q", svc.Spec.ClusterIP)
	}

	// The LoadBalancer IP the other allocator sets in the status.
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.0.1"}}
	if _, err := kc.CoreV1().Services("shop").UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the LoadBalancer IP", 10*time.Second, rec(func(s *api.Service) bool { return slices.Equal(s.Spec.LoadBalancerIPs, []string{"198.19.0.1"}) }))

	// Endpoints, as the EndpointSlice controller writes them.
	es := mustCreate(t, "endpointslice", func() (*discoveryv1.EndpointSlice, error) {
		return kc.DiscoveryV1().EndpointSlices("shop").Create(ctx, slice("shop", "web", "web-1",
			endpoint("10.244.0.5", "n1", ptrTo(true)), endpoint("10.244.1.5", "n2", ptrTo(false))), metav1.CreateOptions{})
	})
	eventually(t, "the ready endpoint's node", 10*time.Second, rec(func(s *api.Service) bool {
		return slices.Equal(s.Spec.EndpointNodes, []string{"n1"}) && slices.Equal(s.Spec.EndpointAddresses, []string{"10.244.0.5"})
	}))
	es.Endpoints = []discoveryv1.Endpoint{endpoint("10.244.0.5", "n1", ptrTo(false)), endpoint("10.244.1.5", "n2", ptrTo(true))}
	start := time.Now()
	if _, err := kc.DiscoveryV1().EndpointSlices("shop").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the endpoint moved", 10*time.Second, rec(func(s *api.Service) bool { return slices.Equal(s.Spec.EndpointNodes, []string{"n2"}) }))
	t.Logf("EndpointSlice update → record: %s", time.Since(start))
	if err := kc.DiscoveryV1().EndpointSlices("shop").Delete(ctx, "web-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "no endpoints", 10*time.Second, rec(func(s *api.Service) bool { return len(s.Spec.EndpointNodes) == 0 }))

	// Deleted while the controllers run, and while none runs.
	mustCreate(t, "service", func() (*corev1.Service, error) {
		return kc.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "db"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 5432}}}}, metav1.CreateOptions{})
	})
	eventually(t, "the second record", 10*time.Second, func() (bool, string) {
		_, err := store.Get(ctx, api.KindService, "shop", "db")
		return err == nil, errString(err)
	})
	if err := kc.CoreV1().Services("shop").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the record deleted", 10*time.Second, func() (bool, string) {
		_, err := store.Get(ctx, api.KindService, "shop", "web")
		return errors.Is(err, datastore.ErrNotFound), errString(err)
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := kc.CoreV1().Services("shop").Delete(ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	startControllers(t, testConfig("b"), ctrlClient, store)
	eventually(t, "the record of a Service deleted while no controller ran", 20*time.Second, func() (bool, string) {
		_, err := store.Get(ctx, api.KindService, "shop", "db")
		return errors.Is(err, datastore.ErrNotFound), errString(err)
	})
}
