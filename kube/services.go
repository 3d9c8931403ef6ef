package kube

import (
	"context"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	listersdiscoveryv1 "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// kindService queues a Service whose record (api.Service) may need
// writing: its own events and those of its EndpointSlices.
const kindService = "service"

// serviceSync keeps one api.Service record per Kubernetes Service: the
// addresses BGP may advertise, the external traffic policy and the nodes
// with a ready endpoint (docs/bgp.md, "Services"). The agents advertise
// from these records; this controller is the only reader of Services and
// EndpointSlices.
type serviceSync struct {
	services listerscorev1.ServiceLister
	slices   listersdiscoveryv1.EndpointSliceLister
}

// watchServices adds the Service and EndpointSlice informers to c. The
// informer factory shares one informer per type, so another part of the
// controller watching Services costs nothing more.
func (c *controller) watchServices() {
	svcs := c.factory.Core().V1().Services()
	eps := c.factory.Discovery().V1().EndpointSlices()
	c.svc = serviceSync{services: svcs.Lister(), slices: eps.Lister()}
	add := func(inf cache.SharedIndexInformer, enqueue func(any)) {
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    enqueue,
			UpdateFunc: func(_, o any) { enqueue(o) },
			DeleteFunc: enqueue,
		})
		c.synced = append(c.synced, inf.HasSynced)
	}
	add(svcs.Informer(), func(o any) { c.enqueueObj(kindService, o) })
	add(eps.Informer(), func(o any) {
		if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = d.Obj
		}
		if es, ok := o.(*discoveryv1.EndpointSlice); ok {
			if svc := es.Labels[discoveryv1.LabelServiceName]; svc != "" {
				c.queue.Add(key{kindService, es.Namespace, svc})
			}
		}
	})
}

// syncService writes the record of the Service ns/name, or deletes it
// when the Service is gone; a record that would not change is not
// written (the view holds what is stored).
func (c *controller) syncService(ctx context.Context, ns, name string) error {
	s, err := c.svc.services.Services(ns).Get(name)
	if isNotFound(err) {
		c.reportRefused(ns, name, nil, nil)
		if _, ok := c.view.Service(ns, name); !ok {
			return nil
		}
		err := c.store.Delete(ctx, api.KindService, ns, name, "")
		if err != nil && !errors.Is(err, datastore.ErrNotFound) {
			return fmt.Errorf("deleting the record of service %s/%s: %w", ns, name, err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	es, err := c.svc.slices.EndpointSlices(ns).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: name}))
	if err != nil {
		return err
	}
	rec := ServiceRecord(s, es)
	c.reportRefused(ns, name, s, rec)
	if cur, ok := c.view.Service(ns, name); ok && equalSpec(cur, rec) {
		return nil
	}
	if _, err := c.store.Apply(ctx, rec); err != nil {
		return fmt.Errorf("writing the record of service %s/%s: %w", ns, name, err)
	}
	return nil
}

func equalSpec(cur, rec *api.Service) bool {
	a, b := *cur, *rec
	a.SetDefaults()
	b.SetDefaults()
	return a.Spec.Type == b.Spec.Type && a.Spec.ExternalTrafficPolicy == b.Spec.ExternalTrafficPolicy &&
		slices.Equal(a.Spec.ClusterIPs, b.Spec.ClusterIPs) && slices.Equal(a.Spec.ExternalIPs, b.Spec.ExternalIPs) &&
		slices.Equal(a.Spec.LoadBalancerIPs, b.Spec.LoadBalancerIPs) && slices.Equal(a.Spec.EndpointNodes, b.Spec.EndpointNodes) &&
		slices.Equal(a.Spec.EndpointAddresses, b.Spec.EndpointAddresses) &&
		a.Metadata.Annotations[api.AnnotationOrigin] == b.Metadata.Annotations[api.AnnotationOrigin]
}

// ServiceRecord is the record of Service s with EndpointSlices es (those
// labelled with its name). An endpoint counts when it is ready (a nil
// ready condition means ready, as the EndpointSlice API says); its node
// is its nodeName. Addresses that are not IP addresses (a headless
// Service's "None") are left out. It is pure.
func ServiceRecord(s *corev1.Service, es []*discoveryv1.EndpointSlice) *api.Service {
	rec := &api.Service{
		Metadata: api.ObjectMeta{Namespace: s.Namespace, Name: s.Name,
			Annotations: map[string]string{api.AnnotationOrigin: api.OriginKubernetes}},
		Spec: api.ServiceSpec{Type: string(s.Spec.Type), ExternalTrafficPolicy: api.TrafficPolicyCluster},
	}
	if s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		rec.Spec.ExternalTrafficPolicy = api.TrafficPolicyLocal
	}
	clusterIPs := s.Spec.ClusterIPs
	if len(clusterIPs) == 0 && s.Spec.ClusterIP != "" {
		clusterIPs = []string{s.Spec.ClusterIP}
	}
	rec.Spec.ClusterIPs = addrList(clusterIPs)
	rec.Spec.ExternalIPs = addrList(s.Spec.ExternalIPs)
	var lb []string
	for _, in := range s.Status.LoadBalancer.Ingress {
		lb = append(lb, in.IP)
	}
	rec.Spec.LoadBalancerIPs = addrList(lb)
	var nodes, addrs []string
	for _, sl := range es {
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			if ep.NodeName != nil && *ep.NodeName != "" {
				nodes = append(nodes, *ep.NodeName)
			}
			addrs = append(addrs, ep.Addresses...)
		}
	}
	slices.Sort(nodes)
	rec.Spec.EndpointNodes = slices.Compact(nodes)
	rec.Spec.EndpointAddresses = addrList(addrs)
	return rec
}

// addrList keeps the entries that are IP addresses, canonical, sorted,
// once each.
func addrList(in []string) []string {
	var out []string
	for _, a := range api.ServiceAddrs(in) {
		out = append(out, a.String())
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// sweepServices queues every Service and every record, so that the
// record of a Service deleted while no controller ran goes too.
func (c *controller) sweepServices() {
	if svcs, err := c.svc.services.List(labels.Everything()); err == nil {
		for _, s := range svcs {
			c.queue.Add(key{kindService, s.Namespace, s.Name})
		}
	}
	for _, r := range c.view.Services() {
		c.queue.Add(key{kindService, r.Metadata.Namespace, r.Metadata.Name})
	}
}
