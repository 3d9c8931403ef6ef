package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
	npav1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
	npainformers "sigs.k8s.io/network-policy-api/pkg/client/informers/externalversions"
	npalisters "sigs.k8s.io/network-policy-api/pkg/client/listers/apis/v1beta1"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/datastore"
)

// The ClusterNetworkPolicy controller: each object → one
// GlobalNetworkPolicy (cnp.go), written only when it changed, deleted
// when the object goes; the outcome on the object's status as condition
// Accepted. It starts once the CRD is served, so that a cluster without
// it runs the other controllers unhindered.

const kindCNP = "clusternetworkpolicy"

// ConditionAccepted is the status condition the controller sets on every
// ClusterNetworkPolicy: True when its rules are enforced, False with
// reason Refused (and why in the message) when none of them is.
const (
	ConditionAccepted = "Accepted"
	ReasonAccepted    = "Accepted"
	ReasonRefused     = "Refused"
)

// Option adds to what RunWith runs.
type Option func(*options)

type options struct{ cnp npaclient.Interface }

// WithClusterNetworkPolicies makes the controller watch network-policy-api
// ClusterNetworkPolicies (v1beta1) through c and translate them.
func WithClusterNetworkPolicies(c npaclient.Interface) Option {
	return func(o *options) { o.cnp = c }
}

type cnpState struct {
	client npaclient.Interface
	lister npalisters.ClusterNetworkPolicyLister // nil until the CRD is served
	// usesNodes are the objects with nodes peers, translated again when
	// nodes change.
	usesNodes map[string]bool
}

// startCNP waits (polling discovery) until the API server serves
// ClusterNetworkPolicies, then runs their informer until ctx ends.
func (c *controller) startCNP(ctx context.Context) {
	if c.cnp.client == nil {
		return
	}
	gv := npav1.SchemeGroupVersion.String()
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		res, err := c.cnp.client.Discovery().ServerResourcesForGroupVersion(gv)
		if err == nil && slices.ContainsFunc(res.APIResources, func(r metav1.APIResource) bool { return r.Name == "clusternetworkpolicies" }) {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
	f := npainformers.NewSharedInformerFactory(c.cnp.client, 0)
	inf := f.Policy().V1beta1().ClusterNetworkPolicies()
	_, _ = inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { c.enqueueObj(kindCNP, o) },
		UpdateFunc: func(_, o any) { c.enqueueObj(kindCNP, o) },
		DeleteFunc: func(o any) { c.enqueueObj(kindCNP, o) },
	})
	lister := inf.Lister()
	f.Start(ctx.Done())
	defer f.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return
	}
	c.mu.Lock()
	c.cnp.lister = lister
	c.mu.Unlock()
	c.log.Info("watching ClusterNetworkPolicies", "version", gv)
	c.sweepCNP()
	<-ctx.Done()
}

func (c *controller) cnpLister() npalisters.ClusterNetworkPolicyLister {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cnp.lister
}

// nodeAddrs is what nodes peers match: every Kubernetes node's labels
// and addresses, as the informer has them.
func (c *controller) nodeAddrs() NodeAddrs {
	ns, err := c.nodes.List(labels.Everything())
	if err != nil {
		return nil
	}
	out := make(NodeAddrs, 0, len(ns))
	for _, n := range ns {
		out = append(out, NodeInfoOf(n))
	}
	slices.SortFunc(out, func(a, b NodeInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// syncCNP writes (or deletes) the translation of one object and reports
// the outcome on its status. A refused object has no translation at all:
// none of its rules applies, not even the ones Tabby could read.
func (c *controller) syncCNP(ctx context.Context, name string) error {
	lister := c.cnpLister()
	if lister == nil {
		return nil
	}
	cnp, err := lister.Get(name)
	if isNotFound(err) {
		c.setUsesNodes(name, false)
		return c.deleteGNP(ctx, CNPName(name))
	}
	if err != nil {
		return err
	}
	c.setUsesNodes(name, UsesNodes(cnp))
	gnp, terr := ClusterNetworkPolicy(cnp, c.nodeAddrs())
	if terr != nil {
		c.log.Warn("ClusterNetworkPolicy refused: none of its rules applies", "name", name, "err", terr)
		if err := c.deleteGNP(ctx, CNPName(name)); err != nil {
			return err
		}
		return c.setCNPStatus(ctx, cnp, metav1.ConditionFalse, ReasonRefused, terr.Error())
	}
	if !c.gnpUnchanged(gnp) {
		if _, err := c.store.Apply(ctx, gnp); err != nil {
			return fmt.Errorf("writing %s: %w", gnp.Metadata.Name, err)
		}
	}
	msg := fmt.Sprintf("enforced as GlobalNetworkPolicy %s in tier %s (%d ingress, %d egress rules)",
		gnp.Metadata.Name, gnp.Spec.Tier, len(gnp.Spec.Ingress), len(gnp.Spec.Egress))
	return c.setCNPStatus(ctx, cnp, metav1.ConditionTrue, ReasonAccepted, msg)
}

func (c *controller) setUsesNodes(name string, uses bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cnp.usesNodes == nil {
		c.cnp.usesNodes = map[string]bool{}
	}
	if uses {
		c.cnp.usesNodes[name] = true
	} else {
		delete(c.cnp.usesNodes, name)
	}
}

// queueCNPsOnNodes queues the objects with nodes peers (a node changed).
func (c *controller) queueCNPsOnNodes() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name := range c.cnp.usesNodes {
		c.queue.Add(key{kind: kindCNP, name: name})
	}
}

// gnpUnchanged reports whether etcd (as the view has it) already holds
// want, so that an unchanged object costs no etcd request.
func (c *controller) gnpUnchanged(want *api.GlobalNetworkPolicy) bool {
	for _, g := range c.view.GlobalNetworkPolicies() {
		if g.Metadata.Name != want.Metadata.Name {
			continue
		}
		a, err1 := json.Marshal([]any{g.Metadata.Labels, g.Metadata.Annotations, g.Spec})
		b, err2 := json.Marshal([]any{want.Metadata.Labels, want.Metadata.Annotations, want.Spec})
		return err1 == nil && err2 == nil && string(a) == string(b)
	}
	return false
}

func (c *controller) deleteGNP(ctx context.Context, name string) error {
	err := c.store.Delete(ctx, api.KindGlobalNetworkPolicy, "", name, "")
	if err != nil && !errors.Is(err, datastore.ErrNotFound) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// setCNPStatus sets condition Accepted unless the object already says
// the same for its generation.
func (c *controller) setCNPStatus(ctx context.Context, cnp *npav1.ClusterNetworkPolicy, st metav1.ConditionStatus, reason, msg string) error {
	cond := metav1.Condition{
		Type: ConditionAccepted, Status: st, Reason: reason, Message: msg,
		ObservedGeneration: cnp.Generation,
	}
	if old := apimeta.FindStatusCondition(cnp.Status.Conditions, ConditionAccepted); old != nil &&
		old.Status == st && old.Reason == reason && old.Message == msg && old.ObservedGeneration == cnp.Generation {
		return nil
	}
	upd := cnp.DeepCopy()
	apimeta.SetStatusCondition(&upd.Status.Conditions, cond)
	_, err := c.cnp.client.PolicyV1beta1().ClusterNetworkPolicies().UpdateStatus(ctx, upd, metav1.UpdateOptions{})
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("status of ClusterNetworkPolicy %s: %w", cnp.Name, err)
	}
	return nil
}

// sweepCNP queues every object and deletes the translations whose object
// is gone (also those left by a controller that stopped meanwhile).
func (c *controller) sweepCNP() {
	lister := c.cnpLister()
	if lister == nil {
		return
	}
	cnps, err := lister.List(labels.Everything())
	if err != nil {
		return
	}
	want := map[string]bool{}
	for _, p := range cnps {
		want[CNPName(p.Name)] = true
		c.queue.Add(key{kind: kindCNP, name: p.Name})
	}
	for _, g := range c.view.GlobalNetworkPolicies() {
		if g.Metadata.Annotations[AnnotationCNPSource] == "" || api.Origin(g) != api.OriginKubernetes || want[g.Metadata.Name] {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := c.store.Delete(ctx, api.KindGlobalNetworkPolicy, "", g.Metadata.Name, g.Metadata.ResourceVersion)
		cancel()
		if err != nil && !errors.Is(err, datastore.ErrNotFound) && !errors.Is(err, datastore.ErrConflict) {
			c.log.Warn("deleting a stale ClusterNetworkPolicy translation", "name", g.Metadata.Name, "err", err)
		}
	}
}
