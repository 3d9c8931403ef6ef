package kube

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/syncer"
)

// LoadBalancer IPAM: type LoadBalancer Services of Tabby's class (or of
// none) get one address per family from the LoadBalancer pools, recorded
// in etcd by ipam.AssignLB, and shown in status.loadBalancer.ingress.
// What cannot be given (a pool exhausted, an address outside every pool or
// held by another Service) is a Warning event on the Service and a log
// line; the Service is tried again when a pool changes or an address is
// released. See docs/ipam.md.

const kindLBService = "lb-service"

// Event reasons on Services.
const (
	ReasonLBAssigned     = "LoadBalancerIPAssigned"
	ReasonLBFailed       = "LoadBalancerIPFailed"
	ReasonLBReleased     = "LoadBalancerIPReleased"
	eventSourceComponent = "tabby-kube-controllers"
)

// lbState is the LoadBalancer IPAM part of the controller.
type lbState struct {
	services listerscorev1.ServiceLister
	events   record.EventRecorder
	stop     func()

	mu sync.Mutex
	// failed holds, per "<ns>/<name>", the last problem reported, so that
	// an unchanged problem is not reported again on every pass, and the
	// Services to try again when addresses may have become free.
	failed map[string]string
}

// initLB adds the Service informer and the event recorder.
func (c *controller) initLB() {
	svcs := c.factory.Core().V1().Services()
	c.lb.services = svcs.Lister()
	c.lb.failed = map[string]string{}
	_, _ = svcs.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { c.enqueueObj(kindLBService, o) },
		UpdateFunc: func(_, o any) { c.enqueueObj(kindLBService, o) },
		DeleteFunc: func(o any) { c.enqueueObj(kindLBService, o) },
	})
	c.synced = append(c.synced, svcs.Informer().HasSynced)
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.kc.CoreV1().Events("")})
	c.lb.events = b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: eventSourceComponent})
	c.lb.stop = b.Shutdown
}

// runLB reconciles every LoadBalancer Service once, in a fixed order
// (oldest first, then by namespace and name) so that two Services showing
// the same address after a restart settle the same way every time: the
// one holding the record keeps it, else the older one. Records of Services
// that are gone are released. Then, until ctx ends, it queues the Services
// that failed whenever an IP pool changes. Call after the informers and
// the view synced, before the workers start.
func (c *controller) runLB(ctx context.Context) (stop func()) {
	c.lbStartPass(ctx)
	pools := syncer.Watch[api.IPPool](c.view, "kube-controllers-lb", nil)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-pools.C():
				pools.Take()
				c.queueFailedLB()
			}
		}
	}()
	return func() { cancel(); <-done; c.lb.stop() }
}

func (c *controller) lbStartPass(ctx context.Context) {
	svcs, err := c.lb.services.List(labels.Everything())
	if err != nil {
		c.log.Error("listing Services", "err", err)
		return
	}
	slices.SortFunc(svcs, func(x, y *corev1.Service) int {
		if c := x.CreationTimestamp.Compare(y.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(x.Namespace+"/"+x.Name, y.Namespace+"/"+y.Name)
	})
	for _, s := range svcs {
		if !wantsTabbyLB(s) {
			continue
		}
		if err := c.syncLB(ctx, s.Namespace, s.Name); err != nil {
			c.log.Warn("LoadBalancer Service at start; retrying", "namespace", s.Namespace, "name", s.Name, "err", err)
			c.queue.AddRateLimited(key{kindLBService, s.Namespace, s.Name})
		}
	}
	c.sweepLB(ctx)
}

// sweepLB releases the addresses of Services Kubernetes no longer has, and
// queues every LoadBalancer Service.
func (c *controller) sweepLB(ctx context.Context) {
	held, err := c.ipam.LBServices(ctx)
	if err != nil {
		c.log.Warn("listing LoadBalancer address records", "err", err)
	}
	for _, h := range held {
		c.queue.Add(key{kindLBService, h.Namespace, h.Name})
	}
	if svcs, err := c.lb.services.List(labels.Everything()); err == nil {
		for _, s := range svcs {
			if wantsTabbyLB(s) {
				c.queue.Add(key{kindLBService, s.Namespace, s.Name})
			}
		}
	}
}

func (c *controller) queueFailedLB() {
	c.lb.mu.Lock()
	defer c.lb.mu.Unlock()
	for k := range c.lb.failed {
		ns, name, _ := strings.Cut(k, "/")
		c.queue.Add(key{kindLBService, ns, name})
	}
}

// syncLB gives a LoadBalancer Service its addresses and status, or
// releases what a Service that is gone, or no longer of type LoadBalancer
// for Tabby, holds.
func (c *controller) syncLB(ctx context.Context, ns, name string) error {
	ref := ipam.LBService{Namespace: ns, Name: name}
	s, err := c.lb.services.Services(ns).Get(name)
	if isNotFound(err) {
		c.setLBFailed(ref, "")
		return c.releaseLB(ctx, ref, nil)
	}
	if err != nil {
		return err
	}
	if !wantsTabbyLB(s) {
		c.setLBFailed(ref, "")
		return c.releaseLB(ctx, ref, s)
	}
	req, err := lbRequest(s)
	if err != nil {
		c.reportLB(s, err)
		return c.showOnlyHeld(ctx, s) // nothing to retry until the Service changes
	}
	allocs, err := c.ipam.AssignLB(ctx, req)
	if err != nil && preferDualStack(s) && len(req.Families) > 1 && secondFamilyOnly(err, req.Families[1]) {
		// PreferDualStack: the second family only where a pool has a
		// free address of it.
		req.Families = req.Families[:1]
		allocs, err = c.ipam.AssignLB(ctx, req)
	}
	switch {
	case errors.Is(err, ipam.ErrExhausted), errors.Is(err, ipam.ErrNotInPool), errors.Is(err, ipam.ErrInUse), errors.Is(err, ipam.ErrNoPool):
		c.reportLB(s, err)
		return c.showOnlyHeld(ctx, s) // tried again when a pool changes or an address is freed
	case err != nil:
		return err
	}
	c.setLBFailed(ref, "")
	want := ingressFor(allocs)
	if sameIngress(s.Status.LoadBalancer.Ingress, want) {
		return nil
	}
	u := s.DeepCopy()
	u.Status.LoadBalancer.Ingress = want
	if _, err := c.kc.CoreV1().Services(ns).UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("setting the LoadBalancer status of Service %s: %w", ref, err)
	}
	ips := make([]string, len(want))
	for i, w := range want {
		ips[i] = w.IP
	}
	c.lb.events.Eventf(s, corev1.EventTypeNormal, ReasonLBAssigned, "Assigned LoadBalancer address %s", strings.Join(ips, ", "))
	c.log.Info("assigned LoadBalancer addresses", "namespace", ns, "name", name, "addresses", ips)
	return nil
}

// secondFamilyOnly reports whether err is about the family alone: no
// enabled LoadBalancer pool of it, or none with a free address.
func secondFamilyOnly(err error, family int) bool {
	var ex *ipam.LBExhaustedError
	var np *ipam.LBNoPoolError
	switch {
	case errors.As(err, &ex):
		return ex.Family == family
	case errors.As(err, &np):
		return np.Family == family
	}
	return false
}

// releaseLB releases what the Service holds and, when the Service still
// exists (s != nil: its type or class changed), clears the addresses it
// shows that were Tabby's. Freed addresses wake the Services waiting for
// one.
func (c *controller) releaseLB(ctx context.Context, ref ipam.LBService, s *corev1.Service) error {
	held, err := c.ipam.LBHeld(ctx, ref)
	if err != nil || len(held) == 0 {
		return err
	}
	if s != nil {
		// Status first: should the release then fail, the retry still
		// knows which addresses were Tabby's.
		u := s.DeepCopy()
		u.Status.LoadBalancer.Ingress = slices.DeleteFunc(u.Status.LoadBalancer.Ingress, func(in corev1.LoadBalancerIngress) bool {
			return slices.ContainsFunc(held, func(h ipam.LBAllocation) bool { return h.Addr.String() == in.IP })
		})
		if len(u.Status.LoadBalancer.Ingress) != len(s.Status.LoadBalancer.Ingress) {
			if _, err := c.kc.CoreV1().Services(ref.Namespace).UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil && !isNotFound(err) {
				return fmt.Errorf("clearing the LoadBalancer status of Service %s: %w", ref, err)
			}
		}
	}
	if err := c.ipam.ReleaseLB(ctx, ref); err != nil {
		return err
	}
	ips := make([]string, len(held))
	for i, h := range held {
		ips[i] = h.Addr.String()
	}
	if s != nil {
		c.lb.events.Eventf(s, corev1.EventTypeNormal, ReasonLBReleased, "Released LoadBalancer address %s: the Service is of type %s now", strings.Join(ips, ", "), s.Spec.Type)
	}
	c.log.Info("released LoadBalancer addresses", "namespace", ref.Namespace, "name", ref.Name, "addresses", ips)
	c.queueFailedLB()
	return nil
}

// showOnlyHeld removes from the status of a Service that got no new
// address the addresses it does not hold (shown from before records were
// lost, and held by another Service now), so that no address is shown by
// two Services.
func (c *controller) showOnlyHeld(ctx context.Context, s *corev1.Service) error {
	if len(s.Status.LoadBalancer.Ingress) == 0 {
		return nil
	}
	held, err := c.ipam.LBHeld(ctx, ipam.LBService{Namespace: s.Namespace, Name: s.Name})
	if err != nil {
		return err
	}
	u := s.DeepCopy()
	u.Status.LoadBalancer.Ingress = slices.DeleteFunc(u.Status.LoadBalancer.Ingress, func(in corev1.LoadBalancerIngress) bool {
		return in.IP != "" && !slices.ContainsFunc(held, func(h ipam.LBAllocation) bool { return h.Addr.String() == in.IP })
	})
	if len(u.Status.LoadBalancer.Ingress) == len(s.Status.LoadBalancer.Ingress) {
		return nil
	}
	if _, err := c.kc.CoreV1().Services(s.Namespace).UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil && !isNotFound(err) {
		return fmt.Errorf("clearing addresses Service %s/%s does not hold from its status: %w", s.Namespace, s.Name, err)
	}
	return nil
}

// reportLB reports, once per distinct problem, why the Service got no
// address: a Warning event on it and a log line.
func (c *controller) reportLB(s *corev1.Service, err error) {
	msg := strings.TrimPrefix(err.Error(), "ipam: ")
	if !c.setLBFailed(ipam.LBService{Namespace: s.Namespace, Name: s.Name}, msg) {
		return
	}
	c.lb.events.Event(s, corev1.EventTypeWarning, ReasonLBFailed, msg)
	c.log.Warn("no LoadBalancer address for Service", "namespace", s.Namespace, "name", s.Name, "err", msg)
}

// setLBFailed records the Service's problem ("" clears it) and reports
// whether it is new.
func (c *controller) setLBFailed(ref ipam.LBService, msg string) bool {
	c.lb.mu.Lock()
	defer c.lb.mu.Unlock()
	k := ref.String()
	if msg == "" {
		delete(c.lb.failed, k)
		return false
	}
	if c.lb.failed[k] == msg {
		return false
	}
	c.lb.failed[k] = msg
	return true
}
