// Package kube is tabby-kube-controllers: the one Tabby component with
// Kubernetes API rights and the only package importing client-go. It keeps
// etcd in step with the cluster so that the agents, which hold no
// Kubernetes rights, need nothing but etcd:
//
//   - pods → a record at kube/pods/<ns>/<name> (labels, service account,
//     named ports, address annotations) that CNI ADD reads, and the labels,
//     named ports and namespace labels of the pod's WorkloadEndpoints;
//   - namespaces → a record at kube/namespaces/<name>, and their labels on
//     every endpoint of the namespace;
//   - NetworkPolicies → Tabby NetworkPolicies named k8s.<name>;
//   - Services and their EndpointSlices → a Service record (api.Service)
//     that the agents advertise from (services.go);
//   - Nodes → a deleted Node's Tabby Node deleted (the agents' node GC then
//     releases its blocks), NetworkUnavailable cleared once its agent runs;
//   - addresses of pods Kubernetes no longer has, released after a grace.
//
// Informer events only queue keys; each key is reconciled at level (the
// informer's object against the controller's view of etcd), so a restarted
// or newly elected controller converges from whatever it finds.
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	listersnetv1 "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/syncer"
)

// Kinds of queued keys.
const (
	kindPod       = "pod"
	kindNamespace = "namespace"
	kindPolicy    = "policy"
	kindNode      = "node"
)

type key struct{ kind, ns, name string }

// controller syncs while this replica leads. Build with newController.
type controller struct {
	cfg   Config
	kc    kubernetes.Interface
	store *datastore.Store
	ipam  *ipam.Allocator
	view  *syncer.Syncer
	log   *slog.Logger

	factory  informers.SharedInformerFactory
	pods     listerscorev1.PodLister
	nss      listerscorev1.NamespaceLister
	nodes    listerscorev1.NodeLister
	policies listersnetv1.NetworkPolicyLister
	synced   []cache.InformerSynced

	queue workqueue.TypedRateLimitingInterface[key]

	mu sync.Mutex
	// written holds the kube/ records as this controller last wrote or
	// read them, so that an unchanged pod costs no etcd request.
	written map[string][]byte
	// nodePodKey is, by "<ns>/<pod>", the kube/nodepods/ key written
	// (datastore.KubeNodePodKey): where the pod's copy is to be removed.
	nodePodKey map[string]string
	// epByPod indexes the view's Kubernetes endpoints by "<ns>/<pod>".
	epByPod map[string]map[string]*api.WorkloadEndpoint
	gc      gcState
	svc     serviceSync
	lb      lbState
	refused refusedState
	cnp     cnpState
	secrets secretSync
}

func newController(cfg Config, kc kubernetes.Interface, store *datastore.Store, log *slog.Logger, opts options) *controller {
	c := &controller{
		cfg: cfg, kc: kc, store: store, log: log,
		cnp:     cnpState{client: opts.cnp},
		ipam:    ipam.New(store),
		view:    syncer.New(store, log),
		factory: informers.NewSharedInformerFactory(kc, 0),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[key](),
			workqueue.TypedRateLimitingQueueConfig[key]{Name: "tabby"}),
		written: map[string][]byte{}, nodePodKey: map[string]string{},
		epByPod: map[string]map[string]*api.WorkloadEndpoint{},
	}
	c.gc.firstSeen = map[string]time.Time{}
	c.refused.last = map[string]string{}
	pods := c.factory.Core().V1().Pods()
	nss := c.factory.Core().V1().Namespaces()
	nodes := c.factory.Core().V1().Nodes()
	pols := c.factory.Networking().V1().NetworkPolicies()
	c.pods, c.nss, c.nodes, c.policies = pods.Lister(), nss.Lister(), nodes.Lister(), pols.Lister()
	handle := func(inf cache.SharedIndexInformer, kind string) {
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { c.enqueueObj(kind, o) },
			UpdateFunc: func(_, o any) { c.enqueueObj(kind, o) },
			DeleteFunc: func(o any) { c.enqueueObj(kind, o) },
		})
		c.synced = append(c.synced, inf.HasSynced)
	}
	handle(pods.Informer(), kindPod)
	handle(nss.Informer(), kindNamespace)
	handle(nodes.Informer(), kindNode)
	handle(pols.Informer(), kindPolicy)
	c.watchServices()
	c.watchSecrets()

	c.initLB()
	return c
}

func (c *controller) enqueueObj(kind string, o any) {
	k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(o)
	if err != nil {
		return
	}
	ns, name, err := cache.SplitMetaNamespaceKey(k)
	if err != nil {
		return
	}
	c.queue.Add(key{kind, ns, name})
}

// run syncs until ctx ends: informers, the etcd view, workers, the
// periodic sweep and address GC.
func (c *controller) run(ctx context.Context) error {
	// On the way out, in this order: stop everything, then wait for it.
	var wg sync.WaitGroup
	defer wg.Wait()
	defer c.queue.ShutDown()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	viewErr := make(chan error, 1)
	wg.Go(func() { viewErr <- c.view.Run(ctx) })
	c.factory.Start(ctx.Done())
	c.secrets.factory.Start(ctx.Done())
	defer func() { cancel(); c.factory.Shutdown(); c.secrets.factory.Shutdown() }()
	if !cache.WaitForCacheSync(ctx.Done(), append(c.synced, c.secrets.synced)...) {
		return fmt.Errorf("waiting for the informers: %w", context.Cause(ctx))
	}
	if err := c.view.WaitSynced(ctx); err != nil {
		return fmt.Errorf("waiting for the etcd view: %w", err)
	}
	if err := c.loadWritten(ctx); err != nil {
		return err
	}
	if err := c.putMarker(ctx); err != nil {
		return err
	}
	eps := syncer.Watch[api.WorkloadEndpoint](c.view, "kube-controllers", nil)
	nodes := syncer.Watch(c.view, "kube-controllers", func(u syncer.Update[api.Node]) bool { return u.New != nil })
	// A changed BGPConfiguration may refuse Service addresses or stop
	// refusing them (reportRefused).
	bgpConfigs := syncer.Watch[api.BGPConfiguration](c.view, "kube-controllers", nil)
	// BGP password references name the Secret keys copied to etcd.
	bgpPeers := syncer.Watch[api.BGPPeer](c.view, "kube-controllers", nil)
	c.markSecretsDirty()
	c.indexEndpoints(nil, true)
	c.log.Info("informers and etcd view synced; reconciling")
	defer c.runLB(ctx)()
	wg.Go(func() { c.startCNP(ctx) })

	for range c.cfg.Workers {
		wg.Go(func() {
			for c.processNext(ctx) {
			}
		})
	}
	c.sweep()
	resync := time.NewTicker(c.cfg.Resync)
	defer resync.Stop()
	gcTick := time.NewTicker(c.cfg.GCInterval)
	defer gcTick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-viewErr:
			return fmt.Errorf("etcd view stopped: %w", err)
		case <-eps.C():
			ups, all := eps.Take()
			c.indexEndpoints(ups, all)
		case <-nodes.C():
			ups, all := nodes.Take()
			c.queueNodes(ups, all)
		case <-bgpConfigs.C():
			bgpConfigs.Take()
			c.sweepServices()
			c.markSecretsDirty()
		case <-bgpPeers.C():
			bgpPeers.Take()
			c.markSecretsDirty()
		case <-c.secrets.dirty:
			if err := c.syncBGPSecrets(ctx); err != nil {
				c.log.Warn("copying BGP password keys from Secrets; retrying at the next resync", "err", err)
			}
		case <-resync.C:
			c.sweep()
			c.markSecretsDirty()
		case <-gcTick.C:
			if n, err := c.gcPass(ctx, time.Now()); err != nil {
				c.log.Error("address GC", "err", err)
			} else if n > 0 {
				c.log.Info("address GC released addresses of pods Kubernetes no longer has", "count", n)
			}
		}
	}
}

func (c *controller) processNext(ctx context.Context) bool {
	k, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(k)
	var err error
	switch k.kind {
	case kindPod:
		err = c.syncPod(ctx, k.ns, k.name)
	case kindNamespace:
		err = c.syncNamespace(ctx, k.name)
	case kindPolicy:
		err = c.syncPolicy(ctx, k.ns, k.name)
	case kindNode:
		err = c.syncNode(ctx, k.name)
		c.queueCNPsOnNodes()
	case kindCNP:
		err = c.syncCNP(ctx, k.name)
	case kindService:
		err = c.syncService(ctx, k.ns, k.name)

	case kindLBService:
		err = c.syncLB(ctx, k.ns, k.name)
	}
	if err == nil {
		c.queue.Forget(k)
		return true
	}
	if ctx.Err() != nil {
		return false
	}
	c.log.Warn("sync failed; retrying", "kind", k.kind, "namespace", k.ns, "name", k.name, "err", err)
	c.queue.AddRateLimited(k)
	return true
}

// indexEndpoints folds endpoint updates into epByPod and queues the pods
// whose endpoints changed, so that an endpoint an agent just wrote gets
// the pod's current labels even if they changed during its ADD.
func (c *controller) indexEndpoints(ups []syncer.Update[api.WorkloadEndpoint], all bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	add := func(w *api.WorkloadEndpoint) {
		if w.Spec.Orchestrator != "k8s" {
			return
		}
		pk := w.Metadata.Namespace + "/" + w.Spec.Pod
		if c.epByPod[pk] == nil {
			c.epByPod[pk] = map[string]*api.WorkloadEndpoint{}
		}
		c.epByPod[pk][w.Metadata.Name] = w
		c.queue.Add(key{kindPod, w.Metadata.Namespace, w.Spec.Pod})
	}
	if all {
		c.epByPod = map[string]map[string]*api.WorkloadEndpoint{}
		for _, w := range c.view.Endpoints() {
			add(w)
		}
		c.queueNodes(nil, true)
		return
	}
	for _, u := range ups {
		if w := u.Old; w != nil {
			pk := w.Metadata.Namespace + "/" + w.Spec.Pod
			delete(c.epByPod[pk], w.Metadata.Name)
			if len(c.epByPod[pk]) == 0 {
				delete(c.epByPod, pk)
			}
		}
		if u.New != nil {
			add(u.New)
		}
	}
}

// queueNodes queues the nodes written or changed in etcd (all: every node
// with a Kubernetes name), so that their records follow Kubernetes.
func (c *controller) queueNodes(ups []syncer.Update[api.Node], all bool) {
	if all {
		for _, n := range c.view.Nodes() {
			if name := n.Metadata.Annotations[api.AnnotationKubeNode]; name != "" {
				c.queue.Add(key{kind: kindNode, name: name})
			}
		}
		return
	}
	for _, u := range ups {
		c.queue.Add(key{kind: kindNode, name: u.New.Metadata.Name})
	}
}

func (c *controller) endpointsOf(ns, pod string) []*api.WorkloadEndpoint {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*api.WorkloadEndpoint
	for _, w := range c.epByPod[ns+"/"+pod] {
		out = append(out, w)
	}
	return out
}

// sweep queues everything, so that records whose Kubernetes object went
// away while no controller ran are found and removed.
func (c *controller) sweep() {
	c.mu.Lock()
	for k := range c.written {
		if ns, name, ok := splitPodKey(k); ok {
			c.queue.Add(key{kindPod, ns, name})
		} else if _, ns, name, ok := splitNodePodKey(k); ok {
			c.queue.Add(key{kindPod, ns, name})
		} else if name, ok := splitNamespaceKey(k); ok {
			c.queue.Add(key{kind: kindNamespace, name: name})
		}
	}
	c.mu.Unlock()
	if pods, err := c.pods.List(labels.Everything()); err == nil {
		for _, p := range pods {
			c.queue.Add(key{kindPod, p.Namespace, p.Name})
		}
	}
	if nss, err := c.nss.List(labels.Everything()); err == nil {
		for _, n := range nss {
			c.queue.Add(key{kind: kindNamespace, name: n.Name})
		}
	}
	if nodes, err := c.nodes.List(labels.Everything()); err == nil {
		for _, n := range nodes {
			c.queue.Add(key{kind: kindNode, name: n.Name})
		}
	}
	for _, n := range c.view.Nodes() {
		if name := n.Metadata.Annotations[api.AnnotationKubeNode]; name != "" {
			c.queue.Add(key{kind: kindNode, name: name})
		}
	}
	if nps, err := c.policies.List(labels.Everything()); err == nil {
		for _, np := range nps {
			c.queue.Add(key{kindPolicy, np.Namespace, np.Name})
		}
	}
	c.sweepPolicies()
	c.sweepServices()
	c.sweepCNP()

	c.sweepLB(context.Background())
}

// sweepPolicies deletes translated policies whose Kubernetes policy is
// gone (their names may be hashed, so they are matched by translation).
func (c *controller) sweepPolicies() {
	nps, err := c.policies.List(labels.Everything())
	if err != nil {
		return
	}
	want := map[string]bool{}
	for _, np := range nps {
		want[np.Namespace+"/"+PolicyName(np.Name)] = true
	}
	for _, p := range c.view.NetworkPolicies() {
		if p.Metadata.Annotations[api.AnnotationOrigin] != api.OriginKubernetes || want[p.Metadata.Namespace+"/"+p.Metadata.Name] {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := c.store.Delete(ctx, api.KindNetworkPolicy, p.Metadata.Namespace, p.Metadata.Name, p.Metadata.ResourceVersion)
		cancel()
		if err != nil && !errors.Is(err, datastore.ErrNotFound) && !errors.Is(err, datastore.ErrConflict) {
			c.log.Warn("deleting a stale translated policy", "namespace", p.Metadata.Namespace, "name", p.Metadata.Name, "err", err)
		}
	}
}

// syncPolicy writes (or deletes) the Tabby translation of one Kubernetes
// NetworkPolicy.
func (c *controller) syncPolicy(ctx context.Context, ns, name string) error {
	np, err := c.policies.NetworkPolicies(ns).Get(name)
	if isNotFound(err) {
		err := c.store.Delete(ctx, api.KindNetworkPolicy, ns, PolicyName(name), "")
		if err != nil && !errors.Is(err, datastore.ErrNotFound) {
			return fmt.Errorf("deleting policy %s/%s: %w", ns, PolicyName(name), err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	tp, err := translatePolicy(np)
	if err != nil {
		c.log.Error("NetworkPolicy neither translates nor fails closed", "namespace", ns, "name", name, "err", err)
		return nil // retrying would not help
	}
	if reason := tp.Metadata.Annotations[api.AnnotationTranslationError]; reason != "" {
		c.log.Warn("NetworkPolicy does not translate: its pods are isolated with no rule", "namespace", ns, "name", name, "err", reason)
	}
	if _, err := c.store.Apply(ctx, tp); err != nil {
		return fmt.Errorf("writing policy %s/%s: %w", ns, tp.Metadata.Name, err)
	}
	return nil
}

func translatePolicy(np *networkingv1.NetworkPolicy) (*api.NetworkPolicy, error) {
	tp, err := NetworkPolicy(np)
	if err == nil {
		return tp, nil
	}
	return FailClosed(np, err)
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
